"""Statistics of a log-prob mismatch d = log pi - log mu, as small pure functions.

Shared by ``python -m lrl.mismatch`` and the monitoring callbacks. Every function takes ``d`` (or two
log-prob tensors) of shape ``[B, T]`` and an optional boolean ``mask [B, T]`` of the tokens that count
(the action tokens); without a mask every entry counts. Quantiles use ``kthvalue`` on at most
``MAX_QUANTILE_SAMPLE`` values (a fixed-seed subsample beyond that), never ``torch.quantile``, which
refuses very large inputs. Sequence sums stay in log space.
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


def compare(logp_a: torch.Tensor, logp_b: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """abs_diff_stats of d = logp_a - logp_b: [B, T], [B, T] -> dict."""
    return abs_diff_stats(logp_a - logp_b, mask)


def probability_bins(logp_ref: torch.Tensor, d: torch.Tensor, mask: torch.Tensor | None = None,
                     bins=PROBABILITY_BINS) -> list[dict[str, float]]:  # fmt: skip
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


def cdf_points(d: torch.Tensor, mask: torch.Tensor | None = None,
               max_points: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The empirical CDF of |d|, thinned to at most max_points points -> (sorted |d| [n], F [n])."""
    values = _masked(d, mask).abs().sort().values  # [N]
    n = values.numel()
    if n == 0:
        return values, values
    index = torch.linspace(0, n - 1, min(n, max_points)).round().long()
    return values[index], (index + 1).float() / n
