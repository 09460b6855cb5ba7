"""The update of one step, as typed records and guards: which rows each minibatch holds, and NaN/inf checks.

:func:`plan_update` checks the batch's log-probs, weights and advantages for NaN/inf on all ranks at once
(one all-reduce that also counts every minibatch's action tokens over all ranks) and cuts the batch into
:class:`Minibatch` records. A batch in which no token carries an advantage is skipped: nothing to learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lrl.batch import Batch
from lrl.distributed import Ranks


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
        )
        for i, rows in enumerate(chunks)
    ]
    return UpdatePlan(minibatches, summed[len(counts)].item() > 0)
