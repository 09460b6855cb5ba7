"""Advantages and the policy losses (clipped, plain policy gradient, CISPO), as pure functions of tensors.

Every loss takes the policy's log-probs ``logp`` (with gradient), the proximal policy's ``old_logp`` (pi_prox,
detached), the per-token advantage ``token_adv`` (``w * A``: the behavior correction's weights times the
advantage, detached) and the action ``mask``, all ``[B, T]``, and returns the loss summed over action tokens and
divided by their count (before any weight zeroes some of them), with its statistics.
"""

from __future__ import annotations

import math

import torch

from lrl.sections.training import LOSSES, UpdateOptions

# every loss's statistics: clip_frac and approx_kl, and per sign of the advantage the share of action tokens whose
# gradient the loss removed (clip_pos, clip_neg), the gradient the others carry (push_pos, push_neg: sum |c_t| / n
# over the tokens of that sign, where a token's gradient is c_t grad log pi) and what a ratio of 1 on every token
# would give them (adv_pos, adv_neg: sum |w A| / n), so push / adv is how much of each sign's gradient the ratio and
# the clip let through
LOSS_STATS = ("clip_frac", "approx_kl", "clip_pos", "clip_neg", "push_pos", "push_neg", "adv_pos", "adv_neg")

# the clipped loss bounds each log-ratio to +-20 nats before it exponentiates it (a ratio of 4.9e8 at most), so no
# token can make the loss or its gradient infinite; a token past the bound has no gradient: mostly one the clip
# removes anyway; a negative advantage's above e^20 costs e^20 |A| (where it would cost inf), and a positive one's
# below e^-20 would have pushed with a coefficient under 2.1e-9 |A|
LOG_RATIO_BOUND = 20.0


def group_advantages(
    reward: torch.Tensor,
    group: torch.Tensor,
    valid: torch.Tensor | None = None,
    eps: float = 1e-6,
    scale: bool = True,
) -> torch.Tensor:
    """Group-normalised advantages (r - mean_g) / (std_g + eps): [B] -> [B]; 0 for groups without variance.
    ``scale=False``: r - mean_g only, so a group's advantages keep the size of its rewards' differences.

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
            adv[rows] = (r - r.mean()) / (std + eps) if scale else r - r.mean()
    return adv


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) summed over tokens / number of action tokens.

    ``dual_clip`` C (0: off; else above 1 + eps_high): a token with A < 0 and rho > C has its loss capped at C |A|,
    so it loses its gradient, where the plain clipped loss would push it down with the whole, unbounded rho.

    All inputs [B, T]. ``token_adv`` is the per-token advantage (the decoupled loss passes ``w * A``), so
    importance weights enter without touching this function. The denominator is ``mask.sum()``, the count of
    action tokens before any weight zeroes some of them, so masking does not inflate the remaining gradient.
    The log-ratio is masked before it is exponentiated (a huge log-ratio at a padding or observation position
    would otherwise give inf * 0 = NaN) and bounded to +-``LOG_RATIO_BOUND``, so the loss and its gradient are
    finite whatever the log-ratio.
    """
    log_ratio = torch.where(mask.bool(), logp - old_logp, 0.0)  # [B, T], 0 off the actions
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()  # [B, T], 1 off the actions
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * token_adv, clipped * token_adv)
    capped = (ratio > dual_clip) & (token_adv < 0) if dual_clip else None  # no work where the dual clip is off
    if capped is not None:
        per_token = torch.where(capped, -dual_clip * token_adv, per_token)
    per_token = per_token * mask
    n = mask.sum().clamp(min=1.0)
    loss = per_token.sum() / n
    with torch.no_grad():
        was_clipped = ((ratio < 1.0 - eps_low) & (token_adv < 0)) | ((ratio > 1.0 + eps_high) & (token_adv > 0))
        if capped is not None:
            was_clipped |= capped
        stats = {
            "clip_frac": (was_clipped.float() * mask).sum() / n,
            "approx_kl": (((ratio - 1) - log_ratio) * mask).sum() / n,  # k3 estimator of KL(old||new)
        }
        stats.update(_by_sign(torch.where(was_clipped, 0.0, ratio * token_adv), token_adv, mask, was_clipped))
    return loss, stats


def pg_policy_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, token_adv: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The plain policy gradient: -sum_t w A log pi / number of action tokens, so every token's gradient is
    w A grad log pi (the weights detached, no ratio, no clip): [B, T] -> []. ``old_logp`` enters only the
    statistics (approx_kl, k3 of KL(pi_prox || pi))."""
    on = mask.bool()
    per_token = torch.where(on, -token_adv.detach() * logp, 0.0)
    n = mask.sum().clamp(min=1.0)
    none = torch.zeros_like(on)
    return per_token.sum() / n, _stats(logp, old_logp, mask, none) | _by_sign(token_adv, token_adv, mask, none)


def cispo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: -sum_t sg(min(rho, 1 + eps_high)) w A log pi / number of action tokens, rho = pi / pi_prox: [B, T] -> [].

    The ratio is truncated and detached, not clipped inside a min, so a token past the truncation keeps its
    gradient (scaled by 1 + eps_high) instead of losing it. The ratio is formed in log space and truncated before
    it is exponentiated: finite whatever the log-ratio."""
    on = mask.bool()
    log_ratio = torch.where(on, logp - old_logp, 0.0).detach()  # [B, T]
    ceiling = math.log1p(eps_high)
    coef = log_ratio.clamp(max=ceiling).exp()  # [B, T] <= 1 + eps_high
    per_token = torch.where(on, -(coef * token_adv.detach()) * logp, 0.0)
    n = mask.sum().clamp(min=1.0)
    stats = _stats(logp, old_logp, mask, (log_ratio > ceiling) & on)
    return per_token.sum() / n, stats | _by_sign(coef * token_adv, token_adv, mask, torch.zeros_like(on))


def _stats(logp, old_logp, mask, truncated) -> dict[str, torch.Tensor]:
    """clip_frac (share of action tokens whose ratio the loss clipped or truncated) and approx_kl (k3 of
    KL(pi_prox || pi)), over the action tokens."""
    with torch.no_grad():
        on = mask.bool()
        log_ratio = torch.where(on, logp - old_logp, 0.0)
        n = mask.sum().clamp(min=1.0)
        return {
            "clip_frac": (truncated.float() * mask).sum() / n,
            "approx_kl": ((torch.expm1(log_ratio) - log_ratio) * mask).sum() / n,
        }


def _by_sign(coef, token_adv, mask, removed) -> dict[str, torch.Tensor]:
    """clip_pos, clip_neg, push_pos, push_neg, adv_pos, adv_neg (``LOSS_STATS``) from each token's gradient
    coefficient ``coef`` (0 where the loss removed it) and the tokens ``removed``: all [B, T], per action token."""
    with torch.no_grad():
        on = mask.bool()
        n = mask.sum().clamp(min=1.0)
        pos, neg = on & (token_adv > 0), on & (token_adv < 0)
        size = coef.detach().abs()
        return {
            "clip_pos": (removed & pos).sum() / n,
            "clip_neg": (removed & neg).sum() / n,
            "push_pos": torch.where(pos, size, 0.0).sum() / n,
            "push_neg": torch.where(neg, size, 0.0).sum() / n,
            "adv_pos": torch.where(pos, token_adv.detach(), 0.0).sum() / n,
            "adv_neg": -torch.where(neg, token_adv.detach(), 0.0).sum() / n,
        }


def policy_loss(opts: UpdateOptions, logp, old_logp, token_adv, mask) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss `opts.loss` names (``LOSSES``: clipped, pg or cispo), with its clip settings -> (loss [], statistics)."""
    if opts.loss == "clipped":
        return clipped_policy_loss(logp, old_logp, token_adv, mask, opts.eps_low, opts.eps_high, opts.dual_clip)
    if opts.loss == "pg":
        return pg_policy_loss(logp, old_logp, token_adv, mask)
    if opts.loss == "cispo":
        return cispo_policy_loss(logp, old_logp, token_adv, mask, opts.eps_high)
    raise ValueError(f"loss must be one of {', '.join(LOSSES)}; got {opts.loss!r}")
