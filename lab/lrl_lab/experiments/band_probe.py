"""Where a correction's band cuts: which action tokens have a ratio pi_old/mu outside [low, high], what kind of
token they are, how likely the trainer finds them, and how much of the advantage they carry.

The kinds are positions in an episode, read from the token ids alone: ``decision`` is the first token of the
first action (in TinyAgent: ``read`` or ``answer``, the choice to read), ``line`` a generated token that spells a
number (the answer's line), ``format`` every other action token (``answer`` after an observation, eos, ...).
:class:`BandProbe` is a callback that records the counts of every training step (``probe.steps``).
"""

from __future__ import annotations

import math

import lightning as L
import torch

KINDS = ("decision", "line", "format")
P_EDGES = (0.0, 0.2, 0.5, 0.8, 1.0 + 1e-9)  # bins of the trainer's probability pi_old(token)
P_BINS = ("p<0.2", "p0.2-0.5", "p0.5-0.8", "p>=0.8")


def token_kinds(ids: torch.Tensor, action_mask: torch.Tensor, number_ids: torch.Tensor) -> torch.Tensor:
    """Kind index (KINDS) of every action position: ids [B, T], action_mask [B, T-1] -> [B, T-1] long, -1 off it.

    ``number_ids`` [V] bool marks the token ids that spell a number."""
    on = action_mask.bool()
    target = ids[:, 1:]  # [B, T-1] the token generated at each action position
    kinds = torch.full_like(target, 2)
    kinds[number_ids[target]] = 1
    first = on & (on.long().cumsum(-1) == 1)  # [B, T-1] the episode's first action token
    kinds[first] = 0
    return torch.where(on, kinds, -1)


def weight_error(log_ratio: torch.Tensor, adv: torch.Tensor, cap: float, low: float, high: float) -> dict:
    """How far each correction's weight is from the unbiased weight r = pi_old/mu, token by token, weighted by
    |advantage|: sum |A| |w - r| / sum |A| r for w = 1 (none), min(r, cap) (TIS) and r in [low, high] else 0
    (MIS). log_ratio, adv: [N] over the action tokens -> {"none": .., "tis": .., "mis": ..}."""
    r = log_ratio.double().exp()
    a = adv.double().abs()
    inside = (r >= low) & (r <= high)
    weights = {"none": torch.ones_like(r), "tis": r.clamp(max=cap), "mis": torch.where(inside, r, 0.0)}
    total = (a * r).sum().clamp(min=1e-12)
    return {name: ((a * (w - r).abs()).sum() / total).item() for name, w in weights.items()}


def band_counts(
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    kinds: torch.Tensor,
    p_trainer: torch.Tensor,
    low: float,
    high: float,
    cap: float,
) -> dict[str, float]:
    """One step's counts over its action tokens, all [N]: per kind, tokens, below / above the band, and the
    |advantage| they carry; above-band tokens by advantage sign; below / above per bin of pi_old(token);
    and :func:`weight_error` of none, TIS and MIS. Counts, not shares, so that steps and runs add up."""
    below = log_ratio < math.log(low)
    above = log_ratio > math.log(high)
    a = adv.abs()
    out: dict[str, float] = {"tokens": float(len(log_ratio)), "adv_mass": a.sum().item()}
    out["below"], out["above"] = below.sum().item(), above.sum().item()
    out["adv_below"], out["adv_above"] = a[below].sum().item(), a[above].sum().item()
    out["above_positive"] = (above & (adv > 0)).sum().item()
    out["above_negative"] = (above & (adv < 0)).sum().item()
    for i, kind in enumerate(KINDS):
        of_kind = kinds == i
        out[f"tokens_{kind}"] = of_kind.sum().item()
        out[f"below_{kind}"] = (below & of_kind).sum().item()
        out[f"above_{kind}"] = (above & of_kind).sum().item()
        out[f"adv_{kind}"] = a[of_kind].sum().item()
        out[f"adv_outside_{kind}"] = a[(below | above) & of_kind].sum().item()
    bins = torch.bucketize(p_trainer, torch.tensor(P_EDGES[1:-1], dtype=p_trainer.dtype), right=True)
    for i, name in enumerate(P_BINS):
        out[f"tokens_{name}"] = (bins == i).sum().item()
        out[f"below_{name}"] = (below & (bins == i)).sum().item()
        out[f"above_{name}"] = (above & (bins == i)).sum().item()
    for name, value in weight_error(log_ratio, adv, cap, low, high).items():
        out[f"error_{name}"] = value * out["adv_mass"]  # weighted by the step's |A| mass, to add up
    return out


def number_token_ids(tok) -> torch.Tensor:
    """[V] bool: the token ids whose text is a number, for any tokenizer of the package (len and decode)."""
    return torch.tensor([tok.decode([i]).strip().isdigit() for i in range(len(tok))], dtype=torch.bool)


class BandProbe(L.Callback):
    """Records :func:`band_counts` of every training step's batch (its raw ratios pi_old/mu, before any
    correction), at the band [low, high] and cap of the run's config, in ``self.steps``."""

    def __init__(self):
        super().__init__()
        self.numbers: torch.Tensor | None = None  # [V] bool, from the run's tokenizer at the first step
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = pl_module.last_step
        if record is None:
            return
        cfg = pl_module.cfg
        if self.numbers is None:
            self.numbers = number_token_ids(pl_module.spec.tok)
        b = record.batch
        on = b["action_mask"].bool()
        kinds = token_kinds(b["ids"], b["action_mask"], self.numbers)[on]  # [N]
        old = record.old_logp.detach().float()
        log_ratio = (old - b["sample_logp"].float())[on]  # [N]
        adv = b["advantage"][:, None].expand_as(old)[on].float()  # [N] the episode's advantage per token
        counts = band_counts(log_ratio, adv, kinds, old[on].exp(), cfg.low, cfg.high, cfg.cap)
        self.steps.append({"step": record.version, **counts})


def totals(steps: list[dict[str, float]], first: int = 0) -> dict[str, float]:
    """Sum of each count over the steps from `first` on."""
    keys = [k for k in (steps[0] if steps else {}) if k != "step"]
    return {k: sum(s[k] for s in steps if s["step"] >= first) for k in keys}
