"""Advantages and the policy losses, as pure functions of tensors, and the losses' registry entries (``--loss``).

Every loss takes the policy's log-probs ``logp`` (with gradient), the proximal policy's ``old_logp`` (pi_prox,
detached), the per-token advantage ``token_adv`` (``w * A``: the behavior correction's weights times the
advantage, detached) and the action ``mask``, all ``[B, T]``, and gives each action token its term l_{b,t} (0 off
the actions), with its statistics (``LOSS_STATS``, means over the action tokens); an aggregation (lrl.aggregations)
makes the step's loss of the terms. The ``*_policy_loss`` functions give the terms' token mean, the default
aggregation's loss of one forward.

A loss registers with ``register_loss(name, uses=..., traits=...)``, decorating a factory that takes what it reads
(its options, by name; :func:`lrl.registry.supply`) and returns ``fn(logp, old_logp, token_adv, mask) -> (terms,
stats)``; its :class:`LossTraits` say what it needs, which the rules on how the update's parts combine read
(lrl.config_rules): a ratio to pi_prox (token or sequence level), and whether each token keeps its own advantage.

The catalogue, each with its source: ``clipped`` (PPO's, decoupled as AReaL's; DAPO's two clips; verl's dual clip),
``pg`` (the plain policy gradient), ``cispo`` (MiniMax-M1), ``gspo`` (Qwen's GSPO: one ratio per episode, the
geometric mean of its tokens' ratios), ``sapo`` (Qwen's SAPO: a soft gate in place of the clip) and ``gmpo`` (GMPO:
the geometric mean of the tokens' clipped ratio-weighted advantages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lrl.registry import LOSSES, supply

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


def clipped_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t), rho_t = pi / pi_prox: [B, T] -> [B, T].

    ``dual_clip`` C (0: off; else above 1 + eps_high): a token with A < 0 and rho > C has its loss capped at C |A|,
    so it loses its gradient, where the plain clipped loss would push it down with the whole, unbounded rho.

    ``token_adv`` is the per-token advantage (the decoupled loss passes ``w * A``), so importance weights enter
    without touching this function. The log-ratio is masked before it is exponentiated (a huge log-ratio at a
    padding or observation position would otherwise give inf * 0 = NaN) and bounded to +-``LOG_RATIO_BOUND``, so the
    loss and its gradient are finite whatever the log-ratio.
    """
    log_ratio = torch.where(mask.bool(), logp - old_logp, 0.0)  # [B, T], 0 off the actions
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return _clip(log_ratio.exp(), log_ratio, token_adv, mask, eps_low, eps_high, dual_clip)


def _clip(ratio, log_ratio, token_adv, mask, eps_low, eps_high, dual_clip=0.0):
    """The clipped terms of a ratio (a token's own, or its episode's: gspo) and their statistics: [B, T] -> [B, T]."""
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * token_adv, clipped * token_adv)
    capped = (ratio > dual_clip) & (token_adv < 0) if dual_clip else None  # no work where the dual clip is off
    if capped is not None:
        per_token = torch.where(capped, -dual_clip * token_adv, per_token)
    per_token = per_token * mask
    n = mask.sum().clamp(min=1.0)
    with torch.no_grad():
        was_clipped = ((ratio < 1.0 - eps_low) & (token_adv < 0)) | ((ratio > 1.0 + eps_high) & (token_adv > 0))
        if capped is not None:
            was_clipped |= capped
        stats = {
            "clip_frac": (was_clipped.float() * mask).sum() / n,
            "approx_kl": (((ratio - 1) - log_ratio) * mask).sum() / n,  # k3 estimator of KL(old||new)
        }
        stats.update(_by_sign(torch.where(was_clipped, 0.0, ratio * token_adv), token_adv, mask, was_clipped))
    return per_token, stats


def pg_terms(
    logp: torch.Tensor, old_logp: torch.Tensor, token_adv: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The plain policy gradient: l_t = -w A log pi, so every token's gradient is w A grad log pi (the weights
    detached, no ratio, no clip): [B, T] -> [B, T]. ``old_logp`` enters only the statistics (approx_kl, k3 of
    KL(pi_prox || pi))."""
    on = mask.bool()
    per_token = torch.where(on, -token_adv.detach() * logp, 0.0)
    none = torch.zeros_like(on)
    return per_token, _stats(logp, old_logp, mask, none) | _by_sign(token_adv, token_adv, mask, none)


def cispo_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1): l_t = -sg(min(rho_t, 1 + eps_high)) w A log pi, rho = pi / pi_prox: [B, T] -> [B, T].

    The ratio is truncated and detached, not clipped inside a min, so a token past the truncation keeps its
    gradient (scaled by 1 + eps_high) instead of losing it. The ratio is formed in log space and truncated before
    it is exponentiated: finite whatever the log-ratio."""
    on = mask.bool()
    log_ratio = torch.where(on, logp - old_logp, 0.0).detach()  # [B, T]
    ceiling = math.log1p(eps_high)
    coef = log_ratio.clamp(max=ceiling).exp()  # [B, T] <= 1 + eps_high
    per_token = torch.where(on, -(coef * token_adv.detach()) * logp, 0.0)
    stats = _stats(logp, old_logp, mask, (log_ratio > ceiling) & on)
    return per_token, stats | _by_sign(coef * token_adv, token_adv, mask, torch.zeros_like(on))


def gspo_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al., Qwen, 2025): one ratio per episode, s_b = (pi(y_b) / pi_prox(y_b))^(1 / |y_b|) =
    exp(mean_t log rho_t), clipped as the clipped loss clips a token's: [B, T] -> [B, T].

    Written in the paper's GSPO-token form, l_t = -min(s_bt A_t, clip(s_bt) A_t) with s_bt = sg(s_b) pi_t / sg(pi_t):
    every token's value is s_b, and its gradient sg(s_b) A_t grad log pi_t, so with one advantage per episode the
    gradient is GSPO's (under ``seq-mean-token-mean``, the paper's aggregation: sum_b s_b A_b grad log s_b / B),
    and a token-level weight (TIS) scales its own token. The clip range is the paper's (3e-4, 4e-4), set as the
    entry's defaults of eps_low and eps_high: a sequence's mean log-ratio moves far less than a token's."""
    on = mask.bool()
    log_ratio = torch.where(on, logp - old_logp, 0.0)  # [B, T]
    mean = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1] log s_b
    mean = mean.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    token_log = torch.where(on, mean.detach() + logp - logp.detach(), 0.0)  # [B, T]: value log s_b, grad of log pi_t
    terms, stats = _clip(token_log.exp(), token_log, token_adv, mask, eps_low, eps_high)
    stats["approx_kl"] = _stats(logp, old_logp, mask, torch.zeros_like(on))["approx_kl"]  # the tokens' own k3
    return terms, stats


def sapo_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Gao et al., Qwen, 2025): l_t = -f(rho_t) A_t with the soft gate f(r) = (4 / tau) sigmoid(tau (r - 1)),
    tau = tau_pos where A > 0, tau_neg where A < 0: [B, T] -> [B, T].

    Where the clip cuts a token's gradient off at a band's edge, the gate fades it: a token's gradient is
    4 sigmoid(x) (1 - sigmoid(x)) rho A grad log pi with x = tau (rho - 1), which is the policy gradient's at rho = 1
    and falls away on both sides, faster for the larger tau (the paper's tau_neg > tau_pos: negative advantages
    fade sooner). ``clip_frac`` counts the tokens whose gate passes less than half of the gradient (4 s (1 - s) <
    1/2)."""
    on = mask.bool()
    log_ratio = torch.where(on, logp - old_logp, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()  # [B, T]
    tau = torch.full_like(ratio, tau_neg).masked_fill(token_adv > 0, tau_pos)  # [B, T], in the ratio's dtype
    gate = torch.sigmoid(tau * (ratio - 1.0))
    per_token = torch.where(on, -(4.0 / tau) * gate * token_adv, 0.0)
    with torch.no_grad():
        passed = 4.0 * gate * (1.0 - gate)  # [B, T] the share of the policy gradient's coefficient the gate lets through
        faded = (passed < 0.5) & on & (token_adv != 0)
        stats = _stats(logp, old_logp, mask, faded) | _by_sign(passed * ratio * token_adv, token_adv, mask, faded)
    return per_token, stats


def gmpo_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    token_adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO (Zhao et al., 2025): each episode's loss is the geometric mean of its tokens' clipped, ratio-weighted
    advantages, L_b = -A_b exp((1/|y_b|) sum_t c_t), c_t = sgn(A_b) min(sgn(A_b) log rho_t, sgn(A_b) clip(log rho_t,
    -eps_low, eps_high)): [B, T] -> [B, T], every action token of episode b holding L_b.

    The clip is in log space (the paper's (e^-0.4, e^0.4), set as the entry's defaults of eps_low and eps_high). A_b
    is the mean of the episode's per-token advantages (one advantage an episode, times a weight of the episode's:
    the rules refuse a token-level correction or mask with this loss). Under ``seq-mean-token-mean`` the step's loss
    is the paper's, mean_b L_b; the statistics read a token's coefficient as A_b exp(mean_t c_t) where its log-ratio
    was not clipped."""
    on = mask.bool()
    n = mask.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1]
    adv = (token_adv.detach() * mask).sum(-1, keepdim=True) / n  # [B, 1]
    sign = torch.sign(adv)
    log_ratio = torch.where(on, logp - old_logp, 0.0)
    clipped = log_ratio.clamp(-eps_low, eps_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clipped)  # [B, T]
    mean = (torch.where(on, kept, 0.0).sum(-1, keepdim=True) / n).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    per_episode = -adv * mean.exp()  # [B, 1]
    per_token = torch.where(on, per_episode.expand_as(logp), 0.0)
    with torch.no_grad():
        was_clipped = on & (kept != log_ratio)
        coef = torch.where(was_clipped, 0.0, (adv * mean.exp()).expand_as(logp))
        share = adv.expand_as(logp)
        stats = _stats(logp, old_logp, mask, was_clipped) | _by_sign(coef, share, mask, was_clipped)
    return per_token, stats


def clipped_policy_loss(logp, old_logp, token_adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=0.0):
    """:func:`clipped_terms` summed over tokens / number of action tokens -> (loss [], statistics)."""
    terms, stats = clipped_terms(logp, old_logp, token_adv, mask, eps_low, eps_high, dual_clip)
    return terms.sum() / mask.sum().clamp(min=1.0), stats


def pg_policy_loss(logp, old_logp, token_adv, mask):
    """:func:`pg_terms` summed over tokens / number of action tokens -> (loss [], statistics)."""
    terms, stats = pg_terms(logp, old_logp, token_adv, mask)
    return terms.sum() / mask.sum().clamp(min=1.0), stats


def cispo_policy_loss(logp, old_logp, token_adv, mask, eps_high=0.28):
    """:func:`cispo_terms` summed over tokens / number of action tokens -> (loss [], statistics)."""
    terms, stats = cispo_terms(logp, old_logp, token_adv, mask, eps_high)
    return terms.sum() / mask.sum().clamp(min=1.0), stats


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


# -- the registry ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossTraits:
    """What a loss needs, which the rules on the update's parts read (lrl.config_rules).

    ``ratio``: the ratio to pi_prox its terms take, ``"token"`` (each token's own), ``"sequence"`` (its episode's:
    a token-level mask would change it) or None (no ratio: pg, whose weights are the whole correction);
    ``episode_advantage``: the loss reads one advantage an episode (a token-level weight has no place in it)."""

    ratio: str | None = "token"
    episode_advantage: bool = False


register_loss = LOSSES.register  # factory(...options it reads) -> fn(logp, old_logp, token_adv, mask) -> (terms, stats)


def loss_traits(name: str) -> LossTraits:
    """The traits the loss `name` declares (none declared: a token-level ratio, as most losses take)."""
    entry = LOSSES[name]
    return supply(entry.traits, None) if entry.traits is not None else LossTraits()


def _check_dual_clip(update) -> list[str]:
    if update.dual_clip and update.dual_clip <= 1.0 + update.eps_high:
        return [
            f"dual_clip: {update.dual_clip} must be above the upper clip 1 + eps_high = {1.0 + update.eps_high} "
            "(a negative-advantage token's ratio past it loses its gradient), or 0 for off"
        ]
    return []


@register_loss("clipped", uses=("eps_low", "eps_high", "dual_clip"), check=_check_dual_clip)
def _clipped(eps_low: float, eps_high: float, dual_clip: float):
    """the decoupled clipped loss w * min(rho A, clip(rho) A), with verl's dual clip (PPO, DAPO, AReaL)"""
    return lambda logp, old, adv, mask: clipped_terms(logp, old, adv, mask, eps_low, eps_high, dual_clip)


@register_loss("pg", traits=lambda: LossTraits(ratio=None))
def _pg():
    """the plain policy gradient w A log pi: no ratio, no clip (the weights are the correction)"""
    return pg_terms


@register_loss("cispo", uses=("eps_high",))
def _cispo(eps_high: float):
    """CISPO: sg(min(rho, 1 + eps_high)) w A log pi, every token keeps its gradient (MiniMax-M1)"""
    return lambda logp, old, adv, mask: cispo_terms(logp, old, adv, mask, eps_high)


@register_loss(
    "gspo",
    uses=("eps_low", "eps_high"),
    traits=lambda: LossTraits(ratio="sequence"),
    defaults={"eps_low": 3e-4, "eps_high": 4e-4, "aggregation": "seq-mean-token-mean"},
)
def _gspo(eps_low: float, eps_high: float):
    """GSPO: one clipped ratio an episode, the geometric mean of its tokens' (Qwen)"""
    return lambda logp, old, adv, mask: gspo_terms(logp, old, adv, mask, eps_low, eps_high)


@register_loss("sapo", uses=("tau_pos", "tau_neg"))
def _sapo(tau_pos: float, tau_neg: float):
    """SAPO: a soft gate (4/tau) sigmoid(tau (rho - 1)) in place of the clip (Qwen)"""
    return lambda logp, old, adv, mask: sapo_terms(logp, old, adv, mask, tau_pos, tau_neg)


@register_loss(
    "gmpo",
    uses=("eps_low", "eps_high"),
    traits=lambda: LossTraits(ratio="sequence", episode_advantage=True),
    defaults={"eps_low": 0.4, "eps_high": 0.4, "aggregation": "seq-mean-token-mean"},
)
def _gmpo(eps_low: float, eps_high: float):
    """GMPO: the geometric mean of an episode's clipped, ratio-weighted advantages (log-space clip)"""
    return lambda logp, old, adv, mask: gmpo_terms(logp, old, adv, mask, eps_low, eps_high)


def policy_loss(opts, logp, old_logp, token_adv, mask) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The terms of the loss `opts.loss` names, with its options, as their token mean -> (loss [], statistics)."""
    terms, stats = supply(LOSSES[opts.loss].factory, opts)(logp, old_logp, token_adv, mask)
    return terms.sum() / mask.sum().clamp(min=1.0), stats
