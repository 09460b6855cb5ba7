"""Pure statistics of the trainer/sampler mismatch and of staleness, used by the monitoring callbacks.

Everything is computed from the *raw* per-token log-ratio ``log pi_old - log mu`` on action tokens, before
any truncation (TIS) or masking (MIS): statistics taken after clamping hide the outliers they exist to show.
The distribution summaries (mean, median, p99, max of |d|, the largest sequence sum, probability bins) come
from the shared :mod:`lrl.mismatch_stats` (kthvalue on a bounded sample, never ``torch.quantile``); this
module adds what the callbacks need beyond them: KL estimates, effective sample sizes, band shares and
staleness.
"""

from __future__ import annotations

import math

import torch

from lrl.mismatch_stats import PROBABILITY_BINS, abs_diff_stats, probability_bins


def prob_bin_name(lo: float, hi: float) -> str:
    """Tag suffix of a probability bin: (0.1, 0.5) -> 'p010_050'."""
    return f"p{round(lo * 100):03d}_{round(hi * 100):03d}"


def action_log_ratio(
    logp_trainer: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Raw log pi_old - log mu on the action tokens, flattened: [B, T], [B, T], [B, T] -> [N]."""
    return (logp_trainer - logp_sampler).detach()[mask.bool()]


def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1 estimate of KL(mu || pi_old) from tokens sampled by mu: mean of -log(pi_old/mu): [N] -> []."""
    return (-log_ratio).mean() if log_ratio.numel() else log_ratio.new_tensor(float("nan"))


def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(mu || pi_old) (unbiased, >= 0 per token): mean of r - 1 - log r, r = pi_old/mu: [N] -> []."""
    if not log_ratio.numel():
        return log_ratio.new_tensor(float("nan"))
    return (torch.expm1(log_ratio) - log_ratio).mean()


def ess_from_log_weights(log_w: torch.Tensor) -> torch.Tensor:
    """Normalized effective sample size (sum w)^2 / (n sum w^2) of weights given by their logs: [N] -> [], in (0, 1].

    Computed in log space, so raw ratios that overflow exp() still give a finite answer; 0 for no tokens.
    """
    n = log_w.numel()
    if n == 0:
        return log_w.new_tensor(0.0)
    log_w = log_w.double()
    return (2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0) - math.log(n)).exp().float()


def ess(weights: torch.Tensor) -> torch.Tensor:
    """Normalized effective sample size (sum w)^2 / (n sum w^2) of non-negative weights: [N] -> []; 0 if all are 0."""
    n = weights.numel()
    w = weights.double()
    sq = (w * w).sum()
    return torch.where(sq > 0, w.sum() ** 2 / (max(n, 1) * sq.clamp(min=1e-300)), 0.0).float()


def mismatch_stats(logp_trainer: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor,
                   weights: torch.Tensor | None = None, cap: float = 2.0, low: float = 0.5,
                   high: float = 5.0) -> tuple[dict[str, float], torch.Tensor]:  # fmt: skip
    """Every mismatch statistic of one batch from the raw ratios: [B, T] x 3 (+ weights [B, T]) -> (stats, d [N]).

    ``stats``: ``abs_mean``, ``abs_median``, ``abs_p99``, ``abs_max`` (of |d|, d = log pi_old - log mu on the
    action tokens; quantiles by nearest rank), ``seq_abs_sum_max`` (largest |sum_t d| of an episode),
    ``kl_k1``, ``kl_k3`` (of KL(mu || pi_old)), ``over_cap`` (share with ratio > cap), ``below_band`` /
    ``above_band`` (share with ratio < low / > high), ``ess_raw`` (of the raw ratios), ``ess_weighted`` (of
    ``weights`` on the action tokens, if given), ``tokens``, and per bin of mu(token) ``abs_mean_<bin>``
    (NaN when empty) and ``share_<bin>``.
    """
    m = mask.bool()
    d = logp_trainer.detach().float() - logp_sampler.detach().float()  # [B, T]
    log_ratio = d[m]  # [N]
    n = log_ratio.numel()
    summary = abs_diff_stats(d, m)
    extra = [kl_k1(log_ratio), kl_k3(log_ratio), ess_from_log_weights(log_ratio)]
    shares = torch.stack([log_ratio > math.log(cap), log_ratio < math.log(low), log_ratio > math.log(high)])
    extra += list(shares.sum(-1).float() / max(n, 1))
    if weights is not None:
        extra.append(ess(weights.detach()[m]))
    values = torch.stack([x.float() for x in extra]).tolist()  # one sync for all of them
    names = ["kl_k1", "kl_k3", "ess_raw", "over_cap", "below_band", "above_band"]
    stats = {"abs_mean": summary["mean"], "abs_median": summary["median"], "abs_p99": summary["p99"],
             "abs_max": summary["max"], "seq_abs_sum_max": summary["max_seq_sum"],
             **dict(zip(names + (["ess_weighted"] if weights is not None else []), values)), "tokens": float(n)}  # fmt: skip
    for b in probability_bins(logp_sampler, d, m, PROBABILITY_BINS):
        stats[f"abs_mean_{prob_bin_name(b['lo'], b['hi'])}"] = b["mean_abs"]
        stats[f"share_{prob_bin_name(b['lo'], b['hi'])}"] = b["count"] / max(n, 1)
    return stats, log_ratio


def token_staleness(version: torch.Tensor, mask: torch.Tensor, step_version: int) -> torch.Tensor:
    """Staleness of every action token, trainer version minus the token's version: [B, T] -> [N] (long)."""
    return step_version - version[mask.bool()]


def episode_staleness(version: torch.Tensor, mask: torch.Tensor, step_version: int) -> torch.Tensor:
    """Staleness of every episode, from its oldest action token: [B, T] -> [B'] (episodes with an action token)."""
    m = mask.bool()
    big = torch.iinfo(version.dtype).max
    oldest = torch.where(m, version, big).min(-1).values  # [B]
    return step_version - oldest[m.any(-1)]
