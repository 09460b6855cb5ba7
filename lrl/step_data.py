"""What one training step hands around: its record for the callbacks, pi_old and the weights as they are made, its
laps, and the episode ledger of every rank (the pieces of :mod:`lrl.module` that are data, not the step itself)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from lrl.batch import Batch
from lrl.distributed import Ranks


@dataclass
class StepRecord:
    """What one training step publishes for the callbacks (``module.last_step``)."""

    version: int  # the trainer's policy version at the start of the step: it scored and trained the batch
    batch: Batch
    old_logp: torch.Tensor  # [B, T-1] log pi_old, computed before the update
    weights: torch.Tensor  # [B, T-1] the correction weights that multiplied the advantages
    metrics: dict[str, float]  # the step's logged metrics, reduced over ranks


@dataclass
class Scored:
    """A step's log pi_old, correction weights and (where asked) entropies, [B, T-1] each: scored apart before
    the update, or filled in by its forward where the update's own log-probs are pi_old."""

    old_logp: torch.Tensor
    weights: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # of the rows scored apart (the others' come from the update)

    def fill(self, rows: torch.Tensor, old_logp: torch.Tensor, weights: torch.Tensor) -> None:
        """Write the update forward's pi_old and weights of `rows` ([b, T'-1], T' <= T: cut padding)."""
        width = old_logp.shape[1]
        self.old_logp[rows, :width] = old_logp
        self.weights[rows, :width] = weights.to(self.weights.dtype)


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
