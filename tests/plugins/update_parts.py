"""A test plugin: one loss, one aggregation and one proximal policy of a user's own, registered as the built-ins are
(lrl.losses, lrl.aggregations, lrl.proximal), to be chosen with --loss, --aggregation and --proximal."""

from __future__ import annotations

from lrl.aggregations import Aggregation, register_aggregation
from lrl.losses import LossTraits, pg_terms, register_loss
from lrl.proximal import ProximalTraits, register_proximal


@register_loss("half_pg", traits=lambda: LossTraits(ratio=None))
def half_pg():
    """half the plain policy gradient (a user's loss)"""

    def terms(logp, old_logp, token_adv, mask):  # [B, T] each -> terms [B, T] (0 off the actions), statistics
        per_token, stats = pg_terms(logp, old_logp, token_adv, mask)
        return per_token * 0.5, stats

    return terms


@register_aggregation("half-token-mean")
def half_token_mean():
    """half the token mean: each action token counts as two units (a user's aggregation)"""
    return Aggregation(lambda terms, mask: terms.sum(), lambda mask: 2 * mask.sum())


@register_proximal("mu", traits=lambda: ProximalTraits(is_mu=True))
def mu(scored, logp_current, logp_sampler, token_version, version, progress):
    """the sampler's log-probs, as rollout takes them (a user's proximal policy)"""
    return logp_sampler
