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


def check_scored(old_logp, weights, on: torch.Tensor, ranks: Ranks, where: str) -> None:
    """NaN/inf in pi_old or the weights at the positions `on` ([B, T-1] bool) of any rank stops the step."""
    counts = {"old_logp (log pi_old)": nonfinite(old_logp[on]), "weights": nonfinite(weights[on])}
    totals = ranks.all_reduce(torch.tensor([float(c) for c in counts.values()], dtype=torch.float64))
    raise_if_nonfinite(counts, totals.tolist(), where)


@dataclass
class Minibatch:
    """One clipped update's inputs: the rows of minibatch `index` that go through the model, and its token counts.

    ``rows`` are the minibatch's rows that can move the weights (its *live* rows: a row whose advantage is 0 adds
    nothing to the gradient when the loss has no entropy term); the others stay out of the forward and backward
    but their tokens stay in ``local_tokens`` and ``global_tokens``, the loss's denominators, so the gradient is
    the one of the whole minibatch. ``old_logp`` and ``token_adv`` are None where pi_old is taken from the
    update's own forward (one minibatch on the trainer's current weights: the two are the same numbers)."""

    index: int
    last: bool  # the step's last minibatch (it steps through Lightning's optimizer wrapper)
    rows: torch.Tensor  # [b] the rows of the batch (this rank's) that go through the model
    others: torch.Tensor  # [k] the minibatch's other rows: no gradient can come from them
    ids: torch.Tensor  # [b, T'] (T' <= T: the padding columns no row of them uses are cut)
    attention_mask: torch.Tensor  # [b, T']
    action_mask: torch.Tensor  # [b, T'-1]
    old_logp: torch.Tensor | None  # [b, T'-1] log pi_old (None: from the update's own forward)
    token_adv: torch.Tensor | None  # [b, T'-1] per-token advantage w * A (None: made with old_logp)
    advantage: torch.Tensor  # [b]
    sample_logp: torch.Tensor  # [b, T'-1] log mu
    local_tokens: torch.Tensor  # [] action tokens of the whole minibatch on this rank, live rows or not
    global_tokens: torch.Tensor  # [] action tokens of this minibatch over all ranks
    where: str  # "step 3 (batch 3), minibatch 1", for error messages
    version: torch.Tensor | None = None  # [b, T'-1] the weight version of every token
    count: int = 1  # minibatches of the step
    # the aggregation's units (lrl.aggregations) of the whole minibatch, on this rank and over all ranks: the
    # loss's denominators (None: its action tokens, as for token-mean)
    local_units: torch.Tensor | None = None
    global_units: torch.Tensor | None = None


@dataclass
class UpdatePlan:
    minibatches: list[Minibatch]
    signal: bool  # False: no token of any rank carries an advantage, the step is skipped


def live_rows(batch: Batch, keep_all: bool) -> torch.Tensor:
    """[B] bool: the rows that can move the weights, those with a nonzero advantage and an action token; every
    row with ``keep_all`` (a term that reaches all of them: an entropy bonus, a KL target measured on the whole
    minibatch; or a step that runs every row as it is)."""
    if keep_all:
        return torch.ones(len(batch["advantage"]), dtype=torch.bool, device=batch["advantage"].device)
    return batch["action_mask"].bool().any(-1) & batch["advantage"].ne(0)


def monitored_rows(candidates: torch.Tensor, count: int | None, seed: int) -> torch.Tensor:
    """Which of the `candidates` ([B] bool: rows that do not train) have pi_old scored for the metrics alone -> [B]
    bool: all of them where `count` is None or at least their number, else `count` of them drawn uniformly without
    replacement (a generator seeded with `seed`: no training stream moves)."""
    candidates = candidates.bool()
    index = candidates.nonzero(as_tuple=True)[0]
    if count is None or count >= len(index):
        return candidates.clone()
    order = torch.randperm(len(index), generator=torch.Generator().manual_seed(seed))
    chosen = torch.zeros_like(candidates)
    chosen[index[order[:count].to(index.device)]] = True
    return chosen


def entropy_scale(mask: torch.Tensor, candidates: torch.Tensor, monitored: torch.Tensor) -> float:
    """The factor that makes the entropy summed over the monitored rows' action tokens stand for all the candidates'
    (their action tokens over the monitored ones'; 0 where none is monitored: their entropy is then left out)."""
    tokens = mask.sum(-1)
    seen = float(tokens[monitored.to(tokens.device)].sum())
    return float(tokens[candidates.to(tokens.device)].sum()) / seen if seen else 0.0


def plan_update(
    batch: Batch,
    old_logp,
    weights,
    ranks: Ranks,
    n_minibatches: int,
    shuffle: torch.Generator,
    where: str,
    live: torch.Tensor | None = None,
    trim: bool = False,
    units=None,
) -> UpdatePlan:
    """NaN/inf checks of the batch and its minibatch records (one all-reduce for both).

    ``old_logp`` and ``weights`` None: pi_old comes from the update's own forward, where the log-probs and the
    weights are checked as they are made; the signal is then the advantages' (a step whose weights all turn out
    0 is found to have none after its forward). ``live`` ([B] bool): the rows that go through the model;
    ``trim``: a minibatch's padding columns that none of its rows uses are cut; ``units(mask) -> []``: the
    aggregation's denominator of rows (None: their action tokens), counted over every row of each minibatch."""
    mask = batch["action_mask"]
    on = mask.bool()
    live = torch.ones(len(mask), dtype=torch.bool) if live is None else live.cpu()
    chunks = ranks.minibatch_rows(len(batch["ids"]), n_minibatches, shuffle)
    checked = {"sample_logp (log mu)": batch["sample_logp"][on]}
    if old_logp is not None:
        token_adv = batch["advantage"][:, None] * weights  # [B, T-1]
        checked.update({"old_logp (log pi_old)": old_logp[on], "weights": weights[on]})
        signal = float(
            (token_adv * mask)[live.to(mask.device)].ne(0).any()
        )  # some token carries an advantage
    else:
        token_adv = None
        signal = float(
            (batch["advantage"][live.to(mask.device)] * on[live.to(mask.device)].any(-1)).ne(0).any()
        )
    checked["advantage"] = batch["advantage"]
    counts = {name: nonfinite(x) for name, x in checked.items()}
    local = torch.tensor([float(c) for c in counts.values()] + [signal], dtype=torch.float64)
    tokens = (
        torch.stack([mask[rows].sum() for rows in chunks]).double().cpu()
    )  # action tokens per local chunk
    counted = tokens
    if units is not None:  # the aggregation's units of each chunk, counted with its tokens in the same all-reduce
        counted = torch.cat([tokens, torch.stack([units(mask[rows]) for rows in chunks]).double().cpu()])
    summed = ranks.all_reduce(torch.cat([local, counted]))
    raise_if_nonfinite(counts, summed.tolist(), where)
    global_tokens = summed[len(local) : len(local) + len(chunks)]
    global_units = summed[len(local) + len(chunks) :] if units is not None else None
    minibatches = []
    for i, chunk in enumerate(chunks):
        rows, others = chunk[live[chunk]], chunk[~live[chunk]]
        width = int(batch["attention_mask"][rows].sum(-1).max()) if len(rows) and trim else mask.shape[1] + 1
        cols = slice(0, max(width, 1))
        minibatches.append(
            Minibatch(
                i,
                i == len(chunks) - 1,
                rows,
                others,
                batch["ids"][rows, cols],
                batch["attention_mask"][rows, cols],
                mask[rows, : cols.stop - 1],
                old_logp[rows, : cols.stop - 1] if old_logp is not None else None,
                token_adv[rows, : cols.stop - 1] if token_adv is not None else None,
                batch["advantage"][rows],
                batch["sample_logp"][rows, : cols.stop - 1],
                tokens[i],
                global_tokens[i],
                f"{where}, minibatch {i}",
                batch["version"][rows, : cols.stop - 1],
                len(chunks),
                counted[len(chunks) + i] if units is not None else None,
                global_units[i] if units is not None else None,
            )
        )
    return UpdatePlan(minibatches, summed[len(counts)].item() > 0)


def microbatches(mb: Minibatch, tokens: int | None, ranks: Ranks) -> list[slice | None]:
    """The minibatch's rows in forwards of at most `tokens` tokens (the memory plan's; None: no bound): one slice of
    all rows where they fit; every rank gets the same count (None where it has no rows), so DDP's backward calls
    stay in step."""
    n, width = mb.ids.shape[0], max(mb.ids.shape[1], 1)
    per = n if not tokens or n * width <= tokens else max(1, tokens // width)
    count = -(-n // per) if n else 1
    if ranks.world > 1:
        count = int(ranks.all_reduce(torch.tensor([float(count)], dtype=torch.float64), "max").item())
    if count == 1:
        return [slice(None)] if n else [None]
    size = -(-n // count)
    parts: list[slice | None] = [slice(i, min(i + size, n)) for i in range(0, n, size)]
    return parts + [None] * (count - len(parts))


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
