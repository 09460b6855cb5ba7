"""Every statistic of a log-prob mismatch d = log pi - log mu, and of staleness, as small pure functions.

The one home of these numbers: the trainer's per-step metrics, the monitoring callbacks and
``python -m lrl_lab.mismatch`` all call them. Every function takes ``d`` (or two log-prob tensors) of shape
``[B, T]`` and an optional boolean ``mask [B, T]`` of the tokens that count (the action tokens); without a
mask every entry counts. Everything is computed from the *raw* ratios, before any truncation (TIS) or
masking (MIS): statistics taken after clamping hide the outliers they exist to show. Quantiles sort a
bounded random subsample (at most ``MAX_QUANTILE_SAMPLE`` values), never ``torch.quantile`` (which refuses
very large inputs) nor CPU ``kthvalue`` (quadratic on sorted input). Sequence sums stay in log space.
"""

from __future__ import annotations

import math

import torch

MAX_QUANTILE_SAMPLE = 1 << 22
PROBABILITY_BINS: tuple[tuple[float, float], ...] = ((0.0, 0.1), (0.1, 0.5), (0.5, 0.9), (0.9, 1.0))


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The entries of x that count, flattened: [B, T] -> [N], fp32."""
    x = x.detach().float()
    return x[mask.bool()] if mask is not None else x.flatten()


def quantile(values: torch.Tensor, q: float, max_sample: int = MAX_QUANTILE_SAMPLE) -> float:
    """The q-quantile (nearest rank) of a flat tensor, on a bounded random subsample: [N] -> float."""
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1]; got {q}")
    values = values.detach().flatten().float()
    if values.numel() == 0:
        return float("nan")
    if values.numel() > max_sample:
        pick = torch.randint(values.numel(), (max_sample,), generator=torch.Generator().manual_seed(0))
        values = values[pick.to(values.device)]
    k = min(values.numel(), max(1, math.ceil(q * values.numel())))
    # a full sort, not kthvalue: CPU kthvalue degrades to quadratic time on sorted or reversed input
    return values.sort().values[k - 1].item()


def abs_diff_stats(d: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """Mean, median, p99 and max of |d| over the counted tokens, and the largest |sum of d| of a row."""
    flat = _masked(d, mask).abs()  # [N]
    seq = (d.detach().float() * (mask.float() if mask is not None else 1.0)).sum(-1)  # [B]
    if flat.numel() == 0:
        return {k: float("nan") for k in ("mean", "median", "p99", "max", "max_seq_sum")}
    return {
        "mean": flat.mean().item(),
        "median": quantile(flat, 0.5),
        "p99": quantile(flat, 0.99),
        "max": flat.max().item(),
        "max_seq_sum": seq.abs().max().item(),
    }


def band_shares(
    d: torch.Tensor, mask: torch.Tensor | None = None, cap: float = 2.0, low: float = 0.5, high: float = 5.0
) -> dict[str, float]:
    """Shares of the counted tokens whose ratio exp(d) is above the TIS cap, and outside the MIS band."""
    flat = _masked(d, mask)
    if flat.numel() == 0:
        return {"over_cap": float("nan"), "outside_band": float("nan")}
    return {
        "over_cap": (flat > math.log(cap)).float().mean().item(),
        "outside_band": ((flat < math.log(low)) | (flat > math.log(high))).float().mean().item(),
    }


def compare(logp_a: torch.Tensor, logp_b: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """abs_diff_stats of d = logp_a - logp_b: [B, T], [B, T] -> dict."""
    return abs_diff_stats(logp_a - logp_b, mask)


def probability_bins(
    logp_ref: torch.Tensor, d: torch.Tensor, mask: torch.Tensor | None = None, bins=PROBABILITY_BINS
) -> list[dict[str, float]]:
    """Tokens binned by their reference probability exp(logp_ref): count and mean |d| per bin.

    Bins are [lo, hi); the last bin also holds p == hi (so [0.9, 1] includes probability 1).
    """
    p = _masked(logp_ref, mask).exp()  # [N]
    gap = _masked(d, mask).abs()  # [N]
    out = []
    for i, (lo, hi) in enumerate(bins):
        below = (p <= hi) if i == len(bins) - 1 else (p < hi)
        inside = (p >= lo) & below
        n = int(inside.sum())
        out.append(
            {"lo": lo, "hi": hi, "count": n, "mean_abs": gap[inside].mean().item() if n else float("nan")}
        )
    return out


def ratio_ranges(d: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """Ranges of the token ratios exp(d) and the sequence ratios exp(sum_t d) over the counted tokens."""
    flat = _masked(d, mask)
    seq = (d.detach().float() * (mask.float() if mask is not None else 1.0)).sum(-1)  # [B], log space
    return {
        "token_min": flat.min().exp().item(),
        "token_max": flat.max().exp().item(),
        "seq_min": seq.min().exp().item(),
        "seq_max": seq.max().exp().item(),
        "seq_log_min": seq.min().item(),  # exp of a long sum can underflow; the log does not
        "seq_log_max": seq.max().item(),
    }


def cdf_points(
    d: torch.Tensor, mask: torch.Tensor | None = None, max_points: int = 2000
) -> tuple[torch.Tensor, torch.Tensor]:
    """The empirical CDF of |d|, thinned to at most max_points points -> (sorted |d| [n], F [n])."""
    values = _masked(d, mask).abs().sort().values  # [N]
    n = values.numel()
    if n == 0:
        return values, values
    index = torch.linspace(0, n - 1, min(n, max_points)).round().long()
    return values[index], (index + 1).float() / n


def prob_bin_name(lo: float, hi: float) -> str:
    """Tag suffix of a probability bin: (0.1, 0.5) -> 'p010_050'."""
    return f"p{round(lo * 100):03d}_{round(hi * 100):03d}"


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


def mismatch_stats(
    log_ratio: torch.Tensor,
    logp_sampler: torch.Tensor,
    seq_log_ratio: torch.Tensor,
    weights: torch.Tensor | None = None,
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 5.0,
) -> dict[str, float]:
    """The distribution of the raw mismatch over action tokens: d [N], log mu [N], per-episode sum_t d [B].

    -> ``abs_median``, ``abs_p99``, ``abs_max`` (of |d|; quantiles by nearest rank), ``seq_abs_sum_max``
    (largest |sum_t d| of an episode), ``kl_k1``, ``kl_k3`` (of KL(mu || pi_old)), ``below_band`` /
    ``above_band`` (share with ratio < low / > high), ``ess_raw`` (of the raw ratios), ``ess_weighted`` (of
    the correction ``weights`` [N], if given), ``tokens``, and per bin of mu(token) ``abs_mean_<bin>`` (NaN
    when empty) and ``share_<bin>``. The mean and the share above the cap are the trainer's own metrics.
    """
    n = log_ratio.numel()
    d = log_ratio.detach().float()
    if n == 0:
        return {"tokens": 0.0}
    extra = [kl_k1(d), kl_k3(d), ess_from_log_weights(d)]
    shares = torch.stack([d < math.log(low), d > math.log(high)])
    extra += list(shares.sum(-1).float() / n)
    if weights is not None:
        extra.append(ess(weights.detach()))
    values = torch.stack([x.float() for x in extra]).tolist()  # one sync for all of them
    names = ["kl_k1", "kl_k3", "ess_raw", "below_band", "above_band"] + (
        ["ess_weighted"] if weights is not None else []
    )
    stats = {
        "abs_median": quantile(d.abs(), 0.5),
        "abs_p99": quantile(d.abs(), 0.99),
        "abs_max": d.abs().max().item(),
        "seq_abs_sum_max": seq_log_ratio.abs().max().item() if seq_log_ratio.numel() else float("nan"),
        **dict(zip(names, values)),
        "tokens": float(n),
    }
    for b in probability_bins(logp_sampler, d, None, PROBABILITY_BINS):
        stats[f"abs_mean_{prob_bin_name(b['lo'], b['hi'])}"] = b["mean_abs"]
        stats[f"share_{prob_bin_name(b['lo'], b['hi'])}"] = b["count"] / n
    return stats


def token_staleness(version: torch.Tensor, mask: torch.Tensor, step_version: int) -> torch.Tensor:
    """Staleness of every action token, trainer version minus the token's version: [B, T] -> [N] (long)."""
    return step_version - version[mask.bool()]


def episode_staleness(version: torch.Tensor, mask: torch.Tensor, step_version: int) -> torch.Tensor:
    """Staleness of every episode, from its oldest action token: [B, T] -> [B'] (episodes with an action token)."""
    m = mask.bool()
    big = torch.iinfo(version.dtype).max
    oldest = torch.where(m, version, big).min(-1).values  # [B]
    return step_version - oldest[m.any(-1)]


def batch_stats(logp_trainer, logp_sampler, mask, weights, cap: float = 2.0) -> dict[str, float]:
    """The trainer's per-step off-policy numbers from the raw ratios: mean |d|, share over the cap, share masked."""
    m = mask.bool()
    n = max(int(m.sum()), 1)
    log_ratio = (logp_trainer - logp_sampler).detach()[m]  # [N]
    return {
        "abs_mean": (log_ratio.abs().sum() / n).item(),
        "over_cap": ((log_ratio > math.log(cap)).sum() / n).item(),
        "masked": ((weights.detach()[m] == 0).sum() / n).item(),
    }


def sequence_corrected_share(logp_trainer, logp_sampler, mask, cap: float, low: float, high: float) -> dict:
    """Shares of episodes whose sequence-level ratio exp(sum_t d) is above the cap, or outside [low, high]."""
    m = mask.bool()
    rows = m.any(-1)  # [B] episodes with an action token
    seq = ((logp_trainer - logp_sampler).detach() * m).sum(-1)[rows]  # [B'] log of the sequence ratio
    n = max(int(rows.sum()), 1)
    outside = (seq < math.log(low)) | (seq > math.log(high))
    return {
        "seq_over_cap": float((seq > math.log(cap)).sum()) / n,
        "seq_outside_band": float(outside.sum()) / n,
    }


def policy_shift(old_logp, new_logp, mask) -> dict[str, float]:
    """KL(pi_old || pi_new) (k3, from tokens pi_old sampled) and the largest |log ratio| over action tokens.

    -> ``step_kl`` and ``step_max_log_ratio``: how far one step's updates moved the policy on its batch.
    """
    m = mask.bool()
    log_ratio = (new_logp - old_logp).detach().float()[m]  # [N]
    if not log_ratio.numel():
        return {"step_kl": 0.0, "step_max_log_ratio": 0.0}
    return {"step_kl": kl_k3(log_ratio).item(), "step_max_log_ratio": log_ratio.abs().max().item()}


def dropped_shares(dropped: dict[str, torch.Tensor], mask) -> dict[str, tuple[float, float]]:
    """Per reason, the share of action tokens it dropped and the share of episodes (with an action token) it dropped
    whole (every action token): {reason: bool [B, T]}, [B, T] -> {reason: (token share, episode share)}."""
    on = mask.bool()
    rows = on.any(-1)  # [B]
    n_tokens, n_rows = max(int(on.sum()), 1), max(int(rows.sum()), 1)
    out = {}
    for reason, gone in dropped.items():
        gone = gone.bool() & on
        whole = rows & ((gone | ~on).all(-1))  # [B] episodes all of whose action tokens it dropped
        out[reason] = (float(gone.sum()) / n_tokens, float(whole.sum()) / n_rows)
    return out


def multi_version_episodes(version: torch.Tensor, mask) -> torch.Tensor:
    """Episodes whose action tokens come from more than one weight version (a partial rollout that spans a
    weight update): [B, T] -> bool [B] (False for an episode without action tokens)."""
    on = mask.bool()
    big = torch.iinfo(version.dtype).max
    newest = torch.where(on, version, -big).max(-1).values  # [B]
    oldest = torch.where(on, version, big).min(-1).values
    return on.any(-1) & (newest != oldest)


def version_split(logp_trainer, logp_sampler, version, mask) -> dict[str, tuple[float, float]]:
    """The mismatch of episodes that span weight versions apart from the others': shares of episodes and action
    tokens in them, and mean |d| and k3 of each group -> {name: (value, weight)}; a group without tokens has weight 0."""
    on = mask.bool()
    multi = multi_version_episodes(version, mask)  # [B]
    rows = on.any(-1)
    d = (logp_trainer - logp_sampler).detach().float()
    spans = on & multi[:, None]  # [B, T] action tokens of the spanning episodes
    out = {
        "staleness/multi_version_episodes": (float(multi.sum()) / max(int(rows.sum()), 1), float(rows.sum())),
        "staleness/multi_version_tokens": (float(spans.sum()) / max(int(on.sum()), 1), float(on.sum())),
    }
    for name, tokens in (("multi_version", spans), ("single_version", on & ~multi[:, None])):
        picked = d[tokens]  # [N]
        n = float(picked.numel())
        out[f"mismatch/{name}_abs_mean"] = (picked.abs().mean().item() if n else 0.0, n)
        out[f"mismatch/{name}_kl_k3"] = (kl_k3(picked).item() if n else 0.0, n)
    return out
