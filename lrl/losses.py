"""Advantages and the clipped policy loss, as pure functions of tensors."""

from __future__ import annotations

import torch


def group_advantages(
    reward: torch.Tensor, group: torch.Tensor, valid: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """Group-normalised advantages (r - mean_g) / (std_g + eps): [B] -> [B]; 0 for groups without variance.

    Episodes with ``valid == 0`` (environment failures) take no part in their group's statistics and get 0.
    """
    valid = torch.ones_like(reward) if valid is None else valid.to(reward.dtype)
    adv = torch.zeros_like(reward)
    for g in group.unique():
        rows = (group == g) & (valid > 0)
        if rows.sum() < 2:
            continue
        r = reward[rows]
        std = r.std(unbiased=False)
        if std > 0:
            adv[rows] = (r - r.mean()) / (std + eps)
    return adv


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) summed over tokens / number of action tokens.

    All inputs [B, T]. ``token_adv`` is the per-token advantage (the decoupled loss passes ``w * A``), so
    importance weights enter without touching this function. The denominator is ``mask.sum()``, the count of
    action tokens before any weight zeroes some of them, so masking does not inflate the remaining gradient.
    The log-ratio is masked before it is exponentiated: a huge log-ratio at a padding or observation position
    would otherwise give inf * 0 = NaN.
    """
    log_ratio = torch.where(mask.bool(), logp - old_logp, 0.0)  # [B, T], 0 off the actions
    ratio = log_ratio.exp()  # [B, T], 1 off the actions
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * token_adv, clipped * token_adv) * mask
    n = mask.sum().clamp(min=1.0)
    loss = per_token.sum() / n
    with torch.no_grad():
        was_clipped = ((ratio < 1.0 - eps_low) & (token_adv < 0)) | (
            (ratio > 1.0 + eps_high) & (token_adv > 0)
        )
        stats = {
            "clip_frac": (was_clipped.float() * mask).sum() / n,
            "approx_kl": (((ratio - 1) - log_ratio) * mask).sum() / n,  # k3 estimator of KL(old||new)
        }
    return loss, stats


def mean_entropy(logp_all: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the policy's next-token distribution over the action positions: log-probs [B, T, V] and
    mask [B, T] -> [] (differentiable; ``entropy_coef`` subtracts it from the loss)."""
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T]
    return (entropy * mask).sum() / mask.sum().clamp(min=1.0)
