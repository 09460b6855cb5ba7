"""The staleness experiment's table and figure: mean ± standard error over seeds of each row."""

from __future__ import annotations

import math
from pathlib import Path

from lrl_lab.experiments.stats import mean_se

REWARD_TARGET = 0.9
METRICS = (
    "heldout",
    "w0",
    "w1",
    "w2",
    "w3",
    "mismatch",
    "over_cap",
    "below_band",
    "above_band",
    "seq_over_cap",
    "seq_outside_band",
    "clip_frac",
    "action_tokens",
    "heldout_short",
    "heldout_long",
    "time_to_target",
)


def key_of(r: dict) -> tuple:
    return (r["sampler"], r["lag"], r["correction"], r["level"], r["lr"])


def summarize(results: list[dict], key: tuple) -> dict[str, tuple[float, float]]:
    """Mean and standard error over seeds of each metric for one row (nan values left out)."""
    cells = [r for r in results if key_of(r) == key]
    out = {}
    for m in METRICS:
        xs = [c[m] for c in cells if not math.isnan(c[m])]
        out[m] = mean_se(xs) if xs else (float("nan"), float("nan"))
    out["reached"] = (sum(not math.isnan(c["time_to_target"]) for c in cells), len(cells))
    return out


def markdown(
    results: list[dict], rows: list[tuple], lrs: list[float], n_seeds: int, steps: int, flags: list[str]
) -> str:
    """The table as markdown: one line per (lr, row), mean ± standard error over seeds."""
    lines = [
        f"Staleness experiment: {steps} steps, {n_seeds} seeds, mean ± standard error"
        + (f"; flags `{' '.join(flags)}`" if flags else "")
        + ".",
        "",
        "| lr | sampler | lag | correction | level | held-out | reward by quarter | mismatch | over cap | "
        "tokens below / above band | seq over cap | seq outside band | tokens/episode | held-out short / long | "
        f"s to reward {REWARD_TARGET} (reached) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lr in lrs:
        for row in rows:
            s = summarize(results, (*row, lr))
            sampler, lag, corr, level = row
            window = " ".join(f"{s[f'w{i}'][0]:.2f}" for i in range(4))
            reached, total = s["reached"]
            lines.append(
                f"| {lr:g} | {sampler} | {lag} | {corr} | {level if corr != 'none' else '-'} | "
                f"{s['heldout'][0]:.3f} ± {s['heldout'][1]:.3f} | {window} | {s['mismatch'][0]:.3f} | "
                f"{s['over_cap'][0]:.3f} | {s['below_band'][0]:.3f} / {s['above_band'][0]:.3f} | "
                f"{s['seq_over_cap'][0]:.3f} | {s['seq_outside_band'][0]:.3f} | "
                f"{s['action_tokens'][0]:.1f} | {s['heldout_short'][0]:.3f} / {s['heldout_long'][0]:.3f} | "
                f"{s['time_to_target'][0]:.0f} ({reached}/{total}) |"
            )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], rows: list[tuple], lrs: list[float], path: Path) -> None:
    """Held-out pass rate against lag: one line per (correction, level, lr)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    series = sorted(
        {(r[0] == "async", r[2], r[3] if r[2] != "none" else "-", lr) for r in rows for lr in lrs}
    )
    for is_async, corr, level, lr in series:
        keys = sorted(
            {
                (r[0], r[1])
                for r in rows
                if r[2] == corr and (r[3] == level or corr == "none") and (r[0] == "async") == is_async
            }
        )
        points = [
            (lag, summarize(results, (s, lag, corr, level if corr != "none" else "token", lr))["heldout"])
            for s, lag in keys
        ]
        points = [(lag, mu, se) for lag, (mu, se) in points if not math.isnan(mu)]
        if points:
            lags, mus, ses = zip(*points)
            label = (
                ("async, " if is_async else "")
                + f"{corr}"
                + (f" ({level})" if corr != "none" else "")
                + (f", lr {lr:g}" if len(lrs) > 1 else "")
            )
            ax.errorbar(lags, mus, yerr=ses, marker="o", capsize=3, label=label)
    ax.set(
        xlabel="lag (updates the sampler is behind); async: the staleness bound",
        ylabel="held-out pass rate",
        ylim=(0, 1.05),
        title="Held-out pass rate after training, mean ± SE over seeds",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
