"""The proximal policy pi_prox: the policy the loss's ratio rho = pi / pi_prox is taken against (``--proximal``), a
registry (``register_proximal``; a plugin's entry is chosen like these) whose entries declare their
:class:`ProximalTraits`:

- ``recompute``: the trainer's pi_old, its own forward over the batch with the step's starting weights (exact, and
  one forward more per step where the update cannot give it for free);
- ``rollout``: the sampler's own log-probs mu (bypass: no pi_old at all; the loss's ratio is pi / mu);
- ``interpolate``: between mu and the update forward's own detached log-probs, log-linear in the version distance,
  so stale tokens lean on the trainer and fresh ones on mu, with no forward of its own.

The interpolation follows AReaL's log-linear approximation of the proximal policy, with the current weights'
version counted in minibatch updates instead of whole steps: at minibatch ``k`` of ``M`` the weights have taken k of
the step's M updates, so they sit ``k / M`` of a version past pi_old. A token generated ``d`` versions before pi_old
gets ``log pi_prox = log mu + alpha (log pi - log mu)`` with ``alpha = d / (d + k / M)``. At the first minibatch
(k = 0) the current weights are pi_old's, and alpha = 1 gives pi_old exactly; a token of pi_old's own version
(d = 0) later in the step gets mu, which for a sampler with pi_old's weights is pi_old up to its numerics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lrl.registry import PROXIMALS, supply
from lrl.weights import Correction, correct

if TYPE_CHECKING:
    from lrl.sections import UpdateOptions, WeightingOptions

def interpolation_weight(token_version: torch.Tensor, version: int, progress: float) -> torch.Tensor:
    """alpha = d / (d + progress) per token, d = version - token_version, progress = k / M in [0, 1); 1 where progress
    is 0 (the current weights are pi_old's): [B, T] -> [B, T] float."""
    if not 0 <= progress < 1:
        raise ValueError(f"progress must be in [0, 1); got {progress}")
    if progress == 0:
        return torch.ones(token_version.shape, dtype=torch.float32, device=token_version.device)
    lag = (version - token_version).clamp(min=0).float()  # [B, T]
    return lag / (lag + progress)


def interpolated_logp(
    logp_current, logp_sampler, token_version, version: int, progress: float
) -> torch.Tensor:
    """log pi_prox ~ log mu + alpha (log pi - log mu), the update forward's log-probs detached: [B, T] -> [B, T]."""
    alpha = interpolation_weight(token_version, version, progress).to(logp_current.dtype)
    current = logp_current.detach()
    return logp_sampler + alpha * (current - logp_sampler)


@dataclass(frozen=True)
class ProximalTraits:
    """What a proximal policy is, which the rules on the update's parts read (lrl.config_rules) and the step acts on.

    ``scores_pi_old``: pi_prox is the trainer's pi_old, which the step scores (one forward of its own where the
    update's forward cannot give it); ``is_mu``: pi_prox is the sampler's mu, so a loss's own ratio pi / mu already
    carries the behavior correction; ``approximates``: pi_prox is made from mu and the update forward's log-probs
    (no forward of its own), for a loss's ratio to be taken against."""

    scores_pi_old: bool = False
    is_mu: bool = False
    approximates: bool = False


# fn(scored, logp_current, logp_sampler, token_version, version, progress) -> log pi_prox [B, T], detached, where
# `scored` is pi_old where the step scored it (else unused) and `progress` the share k / M of the step's updates taken
register_proximal = PROXIMALS.register


@register_proximal("recompute", traits=lambda: ProximalTraits(scores_pi_old=True))
def _recompute(scored, logp_current, logp_sampler, token_version, version: int, progress: float):
    """the trainer's pi_old, its own forward with the step's starting weights (exact)"""
    return scored


@register_proximal("rollout", traits=lambda: ProximalTraits(is_mu=True))
def _rollout(scored, logp_current, logp_sampler, token_version, version: int, progress: float):
    """the sampler's own log-probs mu (bypass: no pi_old forward; the ratio is pi / mu)"""
    return logp_sampler


@register_proximal("interpolate", traits=lambda: ProximalTraits(approximates=True))
def _interpolate(scored, logp_current, logp_sampler, token_version, version: int, progress: float):
    """log-linear between mu and the update's own log-probs by version distance (A-3PO / AReaL)"""
    return interpolated_logp(logp_current, logp_sampler, token_version, version, progress)


def proximal_logp(kind: str, scored, logp_current, logp_sampler, token_version, version: int, progress: float):
    """log pi_prox of the registered proximal policy `kind`: [B, T] -> [B, T], detached."""
    return PROXIMALS[kind].factory(scored, logp_current, logp_sampler, token_version, version, progress)


def proximal_traits(kind: str) -> ProximalTraits:
    """The traits the proximal policy `kind` declares (none declared: a plain approximation-free policy)."""
    entry = PROXIMALS[kind]
    return supply(entry.traits, None) if entry.traits is not None else ProximalTraits()


def correction_side(traits: ProximalTraits, proximal, logp_current):
    """The trainer's log-probs the correction and the masks compare with mu: pi_prox, except where pi_prox is mu
    itself (``is_mu``: rollout), where they are the update forward's own, detached: [B, T] -> [B, T]."""
    return logp_current.detach() if traits.is_mu else proximal


def forward_correction(
    update: UpdateOptions, weighting: WeightingOptions, mb, rows, logp, version: int
) -> tuple[torch.Tensor, torch.Tensor, Correction]:
    """pi_prox, the trainer's side the correction compared with mu, and the correction of a microbatch's rows, from
    the update's forward `logp` (``mb`` an lrl.update.Minibatch, ``rows`` its microbatch, ``version`` pi_old's;
    with recompute this forward runs on pi_old's weights, so its log-probs detached are pi_old)."""
    kind = update.proximal
    mu = mb.sample_logp[rows]
    progress = mb.index / mb.count  # the share of the step's updates the weights took before this minibatch
    prox = proximal_logp(kind, logp.detach(), logp, mu, mb.version[rows], version, progress)
    side = correction_side(proximal_traits(kind), prox, logp)  # rollout: this forward's own log-probs against mu
    return prox, side, correct(side, mu, mb.action_mask[rows], mb.advantage[rows], weighting)
