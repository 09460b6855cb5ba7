"""What one training step hands around: its record for the callbacks, pi_old and the weights as they are made, its
laps, and the episode ledger of every rank (the pieces of :mod:`lrl.module` that are data, not the step itself)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lrl.batch import Batch
from lrl.distributed import Ranks

# a minibatch update's answer when fp16's loss scale overflowed: the minibatch is taken again
RETAKE = object()


@dataclass
class StepRecord:
    """What one training step publishes for the callbacks (``module.last_step``)."""

    version: int  # the trainer's policy version at the start of the step: it scored and trained the batch
    batch: Batch
    old_logp: torch.Tensor  # [B, T-1] log pi_old, computed before the update
    weights: torch.Tensor  # [B, T-1] the correction weights that multiplied the advantages
    metrics: dict[str, float]  # the step's logged metrics, reduced over ranks
    seen: torch.Tensor | None = (
        None  # [B] rows whose old_logp is the trainer's pi_old (None: all; see Scored)
    )

    def monitored_mask(self) -> torch.Tensor:
        """The action tokens whose old_logp is the trainer's pi_old: [B, T-1] (the other rows left out)."""
        mask = self.batch["action_mask"]
        return mask if self.seen is None else mask * self.seen[:, None].to(mask.dtype)


@dataclass
class Scored:
    """A step's log pi_old, correction weights and (where asked) entropies, [B, T-1] each: scored apart before
    the update, or filled in by its forward where the update's own log-probs are pi_old; and, by reason, the
    action tokens the correction's rules dropped (lrl.weights.Correction).

    Where no pi_old is scored at all (``--proximal rollout`` or ``interpolate``), ``old_logp`` holds the trainer's
    log-probs the update's forwards compared with mu, and ``seen`` ([B] bool) the rows whose forward ran on pi_old's
    weights (the first minibatch's): the mismatch metrics are measured on those (every row with one minibatch, a
    random 1/M of the batch with M; a row no forward ran, or a later minibatch's, is left out)."""

    old_logp: torch.Tensor
    weights: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # of the rows scored apart (the others' come from the update)
    dropped: dict[str, torch.Tensor] = field(default_factory=dict)  # reason -> bool [B, T-1]
    seen: torch.Tensor | None = None  # [B] bool (None: every row's old_logp is pi_old)
    # what the entropy summed over the rows scored apart is multiplied by to stand for all the rows the update
    # skips (1: each of them was scored; lrl.update.entropy_scale where only the monitored subset was)
    entropy_scale: float = 1.0

    @classmethod
    def unscored(cls, logp_sampler: torch.Tensor) -> Scored:
        """Where the step scores no pi_old: mu until the update's forwards write their own, no row seen yet."""
        seen = torch.zeros(len(logp_sampler), dtype=torch.bool, device=logp_sampler.device)
        logp = logp_sampler.detach().float().clone()
        return cls(logp, torch.zeros_like(logp), seen=seen)

    def fill(self, rows, old_logp, weights, dropped: dict | None = None, exact: bool = True) -> None:
        """Write the update forward's pi_old (or its own log-probs), weights and drops of `rows` ([b, T'-1], T' <= T:
        cut padding); `exact` when that forward ran on pi_old's weights."""
        width = old_logp.shape[1]
        self.old_logp[rows, :width] = old_logp.to(self.old_logp.dtype)
        self.weights[rows, :width] = weights.to(self.weights.dtype)
        for reason, gone in (dropped or {}).items():
            if reason not in self.dropped:
                self.dropped[reason] = torch.zeros(self.old_logp.shape, dtype=torch.bool, device=gone.device)
            self.dropped[reason][rows, :width] = gone
        if self.seen is not None:
            self.seen[rows] = exact


class Stopwatch:
    """Seconds between laps: ``laps["old_logp"]`` is the time from the previous lap (or creation) to it."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now


def merged_ledger(ranks: Ranks, own: dict) -> dict:
    """Every rank's ledger of the step as one: ids and per-group seconds concatenated in rank order, token counts
    per staleness summed. Every rank calls it (a collective under DDP), so every rank's history holds it all."""
    if not own or ranks.world == 1:  # sync mode has no ledger on any rank: no collective on the hot path
        return own
    parts = ranks.gather_objects(own)
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if key == "staleness_counts":
                sums = out.setdefault(key, [])
                sums.extend([0] * (len(value) - len(sums)))
                for k, c in enumerate(value):
                    sums[k] += c
            else:
                out.setdefault(key, []).extend(value)
    return out
