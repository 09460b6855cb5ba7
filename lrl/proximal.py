"""The proximal policy pi_prox: the policy the loss's ratio rho = pi / pi_prox is taken against (``--proximal``).

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

from typing import TYPE_CHECKING

import torch

from lrl.weights import Correction, correct

if TYPE_CHECKING:
    from lrl.sections import UpdateOptions, WeightingOptions

PROXIMALS = ("recompute", "rollout", "interpolate")


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


def proximal_logp(
    kind: str, scored, logp_current, logp_sampler, token_version, version: int, progress: float
):
    """log pi_prox of `kind` (``PROXIMALS``): `scored` is pi_old where the step scored it (recompute), else unused:
    [B, T] -> [B, T], detached."""
    if kind == "recompute":
        return scored
    if kind == "rollout":
        return logp_sampler
    if kind == "interpolate":
        return interpolated_logp(logp_current, logp_sampler, token_version, version, progress)
    raise ValueError(f"proximal must be one of {', '.join(PROXIMALS)}; got {kind!r}")


def correction_side(kind: str, proximal, logp_current):
    """The trainer's log-probs the correction and the masks compare with mu: pi_prox, except where pi_prox is mu
    itself (rollout), where they are the update forward's own, detached: [B, T] -> [B, T]."""
    return logp_current.detach() if kind == "rollout" else proximal


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
    side = correction_side(kind, prox, logp)  # rollout: this forward's own log-probs against mu
    return prox, side, correct(side, mu, mb.action_mask[rows], mb.advantage[rows], weighting)
