"""Behavior-policy correction weights w = pi_old / mu, as small pure functions.

Corrections are registry entries (``register_correction(name)``, decorating
``fn(logp_trainer, logp_sampler, mask, options) -> weights [B, T]``, detached, 0 off the mask, where ``options`` is
the run's :class:`~lrl.sections.WeightingOptions`: ``correction``, ``level``, ``cap``, ``low``, ``high``, ``veto``); ``none``,
``tis`` and ``mis`` are registered the same way as a user's own. Every function takes the trainer's log-probs ``logp_trainer`` (pi_old), the sampler's log-probs
``logp_sampler`` (mu) and the action ``mask``, all ``[B, T]``, and returns detached weights ``[B, T]``
that are 0 off the mask. Rejection masks (:mod:`lrl.masks`) and the veto then zero what they reject, and
:func:`correct` records, by reason, what each dropped. All arithmetic is in log space, so a product over a 1,000-token episode neither
overflows nor underflows.

``level`` picks which ratio the rule is applied to:
- ``token``: each token's own ratio pi_old/mu;
- ``sequence``: one ratio per episode, exp(sum_t log pi_old - log mu), broadcast to its tokens;
- ``geometric``: one ratio per episode, exp(mean_t log pi_old - log mu) (the per-token geometric mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lrl.registry import CORRECTIONS, MASKS
from lrl.sections import WeightingOptions
from lrl.sections.training import LEVELS

EDGE_TOL = 1e-6  # log-space slack at the MIS band edges: a ratio within 1e-6 (relative) of an edge is on it
register_correction = CORRECTIONS.register  # fn(logp_trainer, logp_sampler, mask, options) -> weights [B, T]


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}; got {level!r}")


def level_log_ratio(logp_trainer, logp_sampler, mask, level: str = "token") -> torch.Tensor:
    """Log of the ratio the rule acts on at `level`: [B, T] -> [B, T] (per-episode values broadcast), 0 off the mask."""
    _check_level(level)
    mask = mask.to(logp_trainer.dtype)
    log_ratio = (logp_trainer - logp_sampler).detach() * mask  # [B, T]
    if level == "token":
        return log_ratio
    total = log_ratio.sum(-1, keepdim=True)  # [B, 1]
    if level == "geometric":
        total = total / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return total.expand_as(log_ratio) * mask


def tis_weights(logp_trainer, logp_sampler, mask, cap: float = 2.0, level: str = "token") -> torch.Tensor:
    """Truncated IS weights min(pi_old/mu, cap) at `level`, detached: [B, T] -> [B, T], 0 off the mask."""
    if not cap > 0:
        raise ValueError(f"cap must be > 0; got {cap}")
    capped = torch.clamp(level_log_ratio(logp_trainer, logp_sampler, mask, level), max=math.log(cap))
    return capped.exp() * mask


def mis_weights(
    logp_trainer, logp_sampler, mask, low: float = 0.5, high: float = 5.0, level: str = "token"
) -> torch.Tensor:
    """Masked IS weights (IcePop): pi_old/mu where it lies in [low, high] (inclusive), else 0: [B, T] -> [B, T].

    Log-probs are differences of rounded numbers, so "inclusive" allows EDGE_TOL of slack in log space.
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high; got low={low}, high={high}")
    log_ratio = level_log_ratio(logp_trainer, logp_sampler, mask, level)
    inside = (log_ratio >= math.log(low) - EDGE_TOL) & (log_ratio <= math.log(high) + EDGE_TOL)
    return torch.where(inside, log_ratio.clamp(max=math.log(high) + EDGE_TOL).exp(), 0.0) * mask


def veto_mask(logp_trainer, logp_sampler, mask, threshold: float) -> torch.Tensor:
    """1 for episodes whose every token has pi_old/mu >= threshold, else 0 (catastrophic-token veto): [B, T] -> [B, 1]."""
    bad = (logp_trainer.detach() - logp_sampler.detach() < math.log(threshold)) & mask.bool()  # [B, T]
    return (~bad.any(-1, keepdim=True)).to(logp_trainer.dtype)


def normalize_weights(weights, mask, level: str = "token") -> torch.Tensor:
    """Weights divided by their batch mean, so that they average 1: over the action tokens at the token level, over
    the episodes (one weight each) at the sequence and geometric levels: [B, T] -> [B, T]. A batch whose weights are
    all 0 is returned as it is."""
    _check_level(level)
    m = mask.to(weights.dtype)
    if level == "token":
        mean = (weights * m).sum() / m.sum().clamp(min=1.0)
    else:
        rows = m.sum(-1) > 0  # [B] episodes with an action token
        per_episode = (weights * m).sum(-1)[rows] / m.sum(-1)[rows]  # [B'] each episode's one weight
        mean = per_episode.mean() if len(per_episode) else weights.new_zeros(())
    return weights / mean if mean > 0 else weights


@dataclass
class Correction:
    """What the correction of one batch decided: the weights, and which action tokens each rule dropped."""

    weights: torch.Tensor  # [B, T] detached, 0 off the mask and on every dropped token
    dropped: dict[str, torch.Tensor] = field(
        default_factory=dict
    )  # reason -> bool [B, T], action tokens it dropped


def whole_batch(options: WeightingOptions) -> list[str]:
    """What in the correction reads the whole batch (a batch mean, a batch's second moment: a correction or mask not
    registered ``per_row``, and ``normalize``), so that every row's pi_old must be scored before the first
    minibatch's loss -> their names (empty: each row's weights read that row alone)."""
    entries = [CORRECTIONS.get(options.correction), *MASKS.chosen(options.masks)]
    return [e.name for e in entries if not e.per_row] + (["normalize"] if options.normalize else [])


def needs_batch(options: WeightingOptions) -> bool:
    """True when the correction reads the whole batch (:func:`whole_batch`)."""
    return bool(whole_batch(options))


def correct(logp_trainer, logp_sampler, mask, advantage, options: WeightingOptions) -> Correction:
    """The weight of every action token, and why tokens were dropped: [B, T] (advantage [B], or None where no chosen
    mask reads it) -> :class:`Correction`.

    The correction named by ``options.correction`` gives the weights, ``normalize`` divides them by their batch
    mean, then every mask of ``options.masks`` and the ``veto`` zero what they reject. ``dropped`` holds, by reason, the action tokens a
    rule zeroed: the correction's name where its weight is 0 (MIS outside its band), each mask's name, ``veto``.
    """
    on = mask.bool()
    dropped: dict[str, torch.Tensor] = {}
    weights = CORRECTIONS.get(options.correction).factory(logp_trainer, logp_sampler, mask, options)
    zero = on & (weights == 0)
    if zero.any():
        dropped[options.correction] = zero
    if options.normalize:
        weights = normalize_weights(weights, mask, options.level)
    keep = on
    for entry in MASKS.chosen(options.masks):
        kept = entry.factory(logp_trainer, logp_sampler, mask, advantage, options).bool() & on
        dropped[entry.name] = on & ~kept
        keep = keep & kept
    if options.veto > 0:
        vetoed = on & (veto_mask(logp_trainer, logp_sampler, mask, options.veto) == 0)
        dropped["veto"] = vetoed
        keep = keep & ~vetoed
    return Correction((weights * keep).detach(), dropped)


def behavior_weights(
    logp_trainer, logp_sampler, mask, options: WeightingOptions, advantage=None
) -> torch.Tensor:
    """The weight each action token's advantage is multiplied by: [B, T] -> [B, T], 0 off the mask.

    The correction named by ``options.correction`` (a registry entry: ``none`` returns the action mask itself,
    the on-policy update), normalised when ``options.normalize`` says so; the masks of ``options.masks`` and a
    ``options.veto`` threshold additionally zero what they reject (:func:`correct`).
    """
    return correct(logp_trainer, logp_sampler, mask, advantage, options).weights


@register_correction("none", per_row=True)
def _none(logp_trainer, logp_sampler, mask, options) -> torch.Tensor:
    """ignore mu: the weights are the action mask (the trainer-only update)"""
    return mask.to(logp_trainer.dtype)


@register_correction("tis", uses=("cap", "level"), per_row=True)
def _tis(logp_trainer, logp_sampler, mask, options) -> torch.Tensor:
    """truncated IS: min(pi_old/mu, cap) at the ratio's level"""
    return tis_weights(logp_trainer, logp_sampler, mask, options.cap, options.level)


@register_correction("mis", uses=("low", "high", "level"), per_row=True)
def _mis(logp_trainer, logp_sampler, mask, options) -> torch.Tensor:
    """masked IS (IcePop): pi_old/mu inside [low, high] at the ratio's level, else 0"""
    return mis_weights(logp_trainer, logp_sampler, mask, options.low, options.high, options.level)
