"""Rejection masks: rules that leave tokens or whole episodes out of the loss, by how far pi_old is from mu.

A mask is a registry entry (``register_mask(name)``, decorating ``fn(logp_trainer, logp_sampler, mask, advantage,
options) -> keep [B, T]`` bool, True for the action tokens the rule keeps), chosen by name in the config's
``masks`` list; every chosen mask applies. ``logp_trainer`` is the trainer's side of the ratio (pi_old, or the
update forward's own log-probs where no pi_old is scored), ``advantage`` the episodes' advantages ``[B]`` and
``options`` the run's :class:`~lrl.sections.WeightingOptions`. A mask whose decision for a row reads that row
alone registers with ``per_row=True`` (the step may then decide it in the update's own forward); one that reads
the whole batch (M2PO's second moment) leaves it False. Which tokens each mask dropped is logged by its name (lrl.metrics).

The divergences are estimates of KL(mu || pi_old) from tokens mu sampled, written with log r = log pi_old - log mu:
k1 = -log r (signed, unbiased), k2 = (log r)^2 / 2, k3 = r - 1 - log r (>= 0 per token, unbiased). They are
computed in float64 from log r clamped to +-80 nats, so a sum over a long episode stays finite; a token that far
apart is past any threshold either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lrl.registry import MASKS, supply
from lrl.sections.training import ESTIMATORS, KL_LEVELS

if TYPE_CHECKING:
    from lrl.sections import WeightingOptions

SAFE_LOG_RATIO = 80.0  # exp(80) ~ 5.5e34: k3 of a token stays finite in float64, summed over any episode
register_mask = MASKS.register  # fn(logp_trainer, logp_sampler, mask, advantage, options) -> keep [B, T]


@dataclass(frozen=True)
class MaskTraits:
    """What a mask drops, which the rules on the update's parts read: ``"token"`` (single tokens of an episode) or
    ``"sequence"`` (whole episodes only: a loss whose ratio is its episode's keeps that ratio whole)."""

    level: str = "token"


def mask_traits(name: str, weighting: WeightingOptions) -> MaskTraits:
    """The traits mask `name` declares with the run's `weighting` options (none declared: it may drop single
    tokens)."""
    entry = MASKS[name]
    return supply(entry.traits, None, weighting=weighting) if entry.traits is not None else MaskTraits()


def token_divergence(log_ratio: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(mu || pi_old) from log r = log pi_old - log mu: [B, T] -> [B, T] float64."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
    x = log_ratio.detach().double().clamp(-SAFE_LOG_RATIO, SAFE_LOG_RATIO)
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x * x
    return torch.expm1(x) - x


def divergence(
    logp_trainer, logp_sampler, mask, estimator: str = "k3", level: str = "seq_mean"
) -> torch.Tensor:
    """The estimate at `level`: each token's own (token), or per episode the sum, mean or max over its action tokens
    (seq_sum, seq_mean, seq_max) broadcast to its tokens: [B, T] -> [B, T] float64, 0 off the mask."""
    if level not in KL_LEVELS:
        raise ValueError(f"level must be one of {', '.join(KL_LEVELS)}; got {level!r}")
    on = mask.bool()
    per_token = torch.where(on, token_divergence(logp_trainer - logp_sampler, estimator), 0.0)
    if level == "token":
        return per_token
    if level == "seq_max":
        if estimator == "k1":
            raise ValueError(
                "k1 is signed: its max over an episode bounds one side only; use k2 or k3 at seq_max"
            )
        per_episode = torch.where(on, per_token, -torch.inf).amax(-1, keepdim=True)  # [B, 1]
    else:
        per_episode = per_token.sum(-1, keepdim=True)
        if level == "seq_mean":
            per_episode = per_episode / on.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(on, per_episode.expand_as(per_token), 0.0)


def kl_keep(logp_trainer, logp_sampler, mask, estimator: str, level: str, threshold: float) -> torch.Tensor:
    """Tokens whose divergence estimate at `level` is at most `threshold` (k1: in magnitude): [B, T] -> bool [B, T]."""
    d = divergence(logp_trainer, logp_sampler, mask, estimator, level)
    if estimator == "k1":
        d = d.abs()
    return (d <= threshold) & mask.bool()


def opsm_keep(logp_trainer, logp_sampler, mask, advantage, threshold: float) -> torch.Tensor:
    """The off-policy sequence mask: drop an episode whose advantage is < 0 and whose mean log(mu / pi_old) over its
    action tokens is > `threshold`; keep every other action token: [B, T], advantage [B] -> bool [B, T]."""
    if advantage is None:
        raise ValueError("the opsm mask reads the episodes' advantages; none were given")
    on = mask.bool()
    mean_gap = divergence(logp_trainer, logp_sampler, mask, "k1", "seq_mean")  # mean of log mu - log pi_old
    drop = (advantage[:, None] < 0) & (mean_gap > threshold)
    return on & ~drop


def m2_keep(logp_trainer, logp_sampler, mask, threshold: float) -> torch.Tensor:
    """M2PO's mask: drop the action tokens of largest (log pi_old - log mu)^2, largest first, until the mean over the
    remaining action tokens of the batch is at most `threshold`: [B, T] -> bool [B, T]. Ties are dropped in index
    order (a stable sort), so the mask drops the fewest tokens that meet the bound."""
    on = mask.bool()
    squares = (2 * token_divergence(logp_trainer - logp_sampler, "k2"))[on]  # [N] float64
    n = squares.numel()
    if n == 0 or squares.mean() <= threshold:
        return on
    order = squares.sort(descending=True, stable=True).indices  # [N]
    dropped_sum = torch.cat(
        [squares.new_zeros(1), squares[order].cumsum(0)]
    )  # [N + 1]: after dropping k tokens
    kept = torch.arange(n, 0, -1, dtype=squares.dtype, device=squares.device)  # N - k for k = 0 .. N-1
    means = (squares.sum() - dropped_sum[:n]) / kept  # [N] the mean of what remains after dropping the top k
    k = int(torch.nonzero(means <= threshold)[0]) if bool((means <= threshold).any()) else n
    keep_flat = torch.ones(n, dtype=torch.bool, device=squares.device)
    keep_flat[order[:k]] = False
    keep = torch.zeros_like(on)
    keep[on] = keep_flat
    return keep


def _check_kl(weighting: WeightingOptions) -> list[str]:
    if weighting.kl_estimator == "k1" and weighting.kl_level == "seq_max":
        return [
            "kl_level: seq_max bounds the largest of each episode's estimates, and k1 is signed; use k2 or k3"
        ]
    return []


@register_mask(
    "kl",
    uses=("kl_estimator", "kl_level", "kl_threshold"),
    check=_check_kl,
    per_row=True,
    traits=lambda weighting: MaskTraits("token" if weighting.kl_level == "token" else "sequence"),
)
def _kl(logp_trainer, logp_sampler, mask, advantage, options) -> torch.Tensor:
    """drop where a k1/k2/k3 estimate of KL(mu || pi_old), per token or per episode, passes kl_threshold"""
    return kl_keep(
        logp_trainer, logp_sampler, mask, options.kl_estimator, options.kl_level, options.kl_threshold
    )


@register_mask("opsm", uses=("opsm_threshold",), per_row=True, traits=lambda: MaskTraits("sequence"))
def _opsm(logp_trainer, logp_sampler, mask, advantage, options) -> torch.Tensor:
    """off-policy sequence mask: drop negative-advantage episodes whose mean log(mu / pi_old) passes opsm_threshold"""
    return opsm_keep(logp_trainer, logp_sampler, mask, advantage, options.opsm_threshold)


@register_mask("m2po", uses=("m2_threshold",), traits=lambda: MaskTraits("token"))
def _m2po(logp_trainer, logp_sampler, mask, advantage, options) -> torch.Tensor:
    """second-moment mask: drop the largest squared log-ratios until the batch's mean is at most m2_threshold"""
    return m2_keep(logp_trainer, logp_sampler, mask, options.m2_threshold)
