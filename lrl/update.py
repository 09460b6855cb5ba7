"""The update of one step, as typed records and guards: which rows each minibatch holds, and NaN/inf checks.

:func:`plan_update` checks the batch's log-probs, weights and advantages for NaN/inf on all ranks at once
(one all-reduce that also counts every minibatch's action tokens over all ranks) and cuts the batch into
:class:`Minibatch` records. A batch in which no token carries an advantage is skipped: nothing to learn.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from lrl.batch import Batch
from lrl.distributed import Ranks
from lrl.sections import UpdateOptions


class NumericalError(RuntimeError):
    """A NaN or inf reached a log-prob, weight, loss or gradient; the step stopped before the weights changed."""


def nonfinite(x: torch.Tensor) -> int:
    """How many entries of x are NaN or inf: any shape -> int."""
    return int((~torch.isfinite(x)).sum().item())


def not_applied(minibatches_done: int) -> str:
    if minibatches_done == 0:
        return "the update was not applied: the weights are those of the previous step"
    return f"this minibatch was not applied (the {minibatches_done} before it were; all weights are finite)"


def raise_if_nonfinite(counts: dict[str, int], totals: list[float], where: str, applied: int = 0) -> None:
    """Stop the step, on every rank at once, if any rank found NaN/inf: `counts` this rank's, `totals` all ranks'."""
    for (name, mine), n in zip(counts.items(), totals):
        if n > 0:
            count = int(mine) if mine else int(n)
            raise NumericalError(
                f"non-finite {name} at {where}: {count} NaN/inf values"
                f"{'' if mine else ' on another rank'}; " + not_applied(applied)
            )


@dataclass
class Minibatch:
    """One clipped update's inputs: this rank's rows of minibatch `index` and the global token count."""

    index: int
    last: bool  # the step's last minibatch (it steps through Lightning's optimizer wrapper)
    ids: torch.Tensor  # [b, T]
    attention_mask: torch.Tensor  # [b, T]
    action_mask: torch.Tensor  # [b, T-1]
    old_logp: torch.Tensor  # [b, T-1] log pi_old
    token_adv: torch.Tensor  # [b, T-1] per-token advantage w * A
    global_tokens: torch.Tensor  # [] action tokens of this minibatch over all ranks
    where: str  # "step 3 (batch 3), minibatch 1", for error messages
    rows: torch.Tensor | None = None  # [b] the rows' indices in the batch
    sample_logp: torch.Tensor | None = None  # [b, T-1] log mu
    version: torch.Tensor | None = None  # [b, T-1] the weight version of every token
    advantage: torch.Tensor | None = None  # [b] the episodes' advantages
    count: int = 1  # minibatches of the step


@dataclass
class ForwardLog:
    """What the update forwards decided where no pi_old is scored before the update (proximal rollout or
    interpolate): per row of the batch, the trainer's log-probs the correction compared with mu, its weights and
    what each rule dropped. ``seen`` marks the rows of the first minibatch, whose forward ran on pi_old's weights:
    their log-probs are pi_old's, and the mismatch metrics are measured on them (all rows with one minibatch, a
    random 1/M of the batch with M); a later minibatch's forward runs on weights the step already moved."""

    logp: torch.Tensor  # [B, T-1] the forward's own log-probs, detached (mu where no forward saw the row)
    weights: torch.Tensor  # [B, T-1]
    seen: torch.Tensor  # [B] bool: rows the forward scored with pi_old's weights
    dropped: dict[str, torch.Tensor]  # reason -> bool [B, T-1]

    @classmethod
    def start(cls, batch: Batch) -> ForwardLog:
        mu = batch["sample_logp"]
        seen = torch.zeros(len(mu), dtype=torch.bool, device=mu.device)
        return cls(mu.detach().clone(), torch.zeros_like(mu), seen, {})

    def record(self, rows, logp, weights, dropped: dict, exact: bool) -> None:
        """Keep one microbatch's decisions: `rows` [b] batch indices, the rest [b, T-1]; `exact` when its forward
        ran on pi_old's weights (the first minibatch)."""
        rows = rows.to(self.logp.device)
        self.logp[rows] = logp.detach().to(self.logp.dtype)
        self.weights[rows] = weights.detach().to(self.weights.dtype)
        self.seen[rows] = exact
        for reason, gone in dropped.items():
            if reason not in self.dropped:
                self.dropped[reason] = torch.zeros(self.logp.shape, dtype=torch.bool, device=self.logp.device)
            self.dropped[reason][rows] = gone


@dataclass
class UpdatePlan:
    minibatches: list[Minibatch]
    signal: bool  # False: no token of any rank carries an advantage, the step is skipped


def plan_update(
    batch: Batch, old_logp, weights, ranks: Ranks, n_minibatches: int, shuffle: torch.Generator, where: str
) -> UpdatePlan:
    """NaN/inf checks of the batch and its minibatch records (one all-reduce for both)."""
    mask = batch["action_mask"]
    on = mask.bool()
    token_adv = batch["advantage"][:, None] * weights  # [B, T-1]
    chunks = ranks.minibatch_rows(len(batch["ids"]), n_minibatches, shuffle)
    checked = {
        "sample_logp (log mu)": batch["sample_logp"][on],
        "old_logp (log pi_old)": old_logp[on],
        "weights": weights[on],
        "advantage": batch["advantage"],
    }
    counts = {name: nonfinite(x) for name, x in checked.items()}
    signal = float((token_adv * mask).ne(0).any())  # some token carries an advantage
    local = torch.tensor([float(c) for c in counts.values()] + [signal], dtype=torch.float64)
    tokens = (
        torch.stack([mask[rows].sum() for rows in chunks]).double().cpu()
    )  # action tokens per local chunk
    summed = ranks.all_reduce(torch.cat([local, tokens]))
    raise_if_nonfinite(counts, summed.tolist(), where)
    global_tokens = summed[len(local) :]
    minibatches = [
        Minibatch(
            i,
            i == len(chunks) - 1,
            batch["ids"][rows],
            batch["attention_mask"][rows],
            mask[rows],
            old_logp[rows],
            token_adv[rows],
            global_tokens[i],
            f"{where}, minibatch {i}",
            rows,
            batch["sample_logp"][rows],
            batch["version"][rows],
            batch["advantage"][rows],
            len(chunks),
        )
        for i, rows in enumerate(chunks)
    ]
    return UpdatePlan(minibatches, summed[len(counts)].item() > 0)


def learning_rate(update: UpdateOptions, version: int, max_steps: int) -> float:
    """The step's learning rate: ``lr``, or with ``lr_schedule: cosine`` a cosine from ``lr`` at step 0 down to
    ``lr * lr_final`` at the last of `max_steps`; with ``lr_warmup: W`` the first W steps take (v + 1) / (W + 1) of
    it (a function of the version, so a resumed run continues it)."""
    warm = min((version + 1) / (update.lr_warmup + 1), 1.0)
    if update.lr_schedule == "constant":
        return update.lr * warm
    progress = min(version / max(max_steps - 1, 1), 1.0)
    return (
        warm
        * update.lr
        * (update.lr_final + (1 - update.lr_final) * 0.5 * (1 + math.cos(math.pi * progress)))
    )


class UpdateGuard:
    """Keeps the policy's weights and the optimizer's state from before a step's updates, to take the step back
    when it moved the policy too far (``max_step_kl``). Costs one copy of both per step."""

    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.policy, self.optimizer = policy, optimizer
        self.weights = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        self.state = copy.deepcopy(optimizer.state_dict())

    def check(self, step_kl: float, limit: float) -> bool:
        """Restore the weights and optimizer state when step_kl > limit; True when it did."""
        if not step_kl > limit:
            return False
        self.policy.load_state_dict(self.weights)
        self.optimizer.load_state_dict(self.state)
        return True
