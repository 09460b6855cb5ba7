"""The pipeline experiment's table and figure: measured against predicted, per staleness bound."""

from __future__ import annotations

from pathlib import Path


def markdown(rows: list[dict], co: dict, note: str) -> str:
    head = [
        "pipeline",
        "steps/s measured (median; mean ± SE)",
        "steps/s predicted",
        "error vs median",
        "predicted, trainer time from async (error)",
        "episodes/s measured / predicted",
        "mean staleness measured / predicted",
        "max staleness measured / predicted",
        "TV, token staleness",
        "dropped",
    ]
    lines = [note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    s = rows[0]
    lines.append(
        f"| sync | {s['measured_steps_per_s']:.3f} ± {s['measured_steps_per_s_se']:.3f} |" + " |" * 8
    )
    for r in rows[1:]:
        cells = [
            f"async, bound {r['staleness_bound']}",
            f"{r['measured_steps_per_s_median']:.3f}; {r['measured_steps_per_s']:.3f} ± {r['measured_steps_per_s_se']:.3f}",
            f"{r['predicted_steps_per_s']:.3f}",
            f"{100 * r['rate_error']:+.1f}%",
            f"{r['predicted_steps_per_s_async_calibrated']:.3f} ({100 * r['rate_error_async_calibrated']:+.1f}%)",
            f"{r['measured_episodes_per_s']:.1f} / {r['predicted_episodes_per_s']:.1f}",
            f"{r['measured_staleness_mean']:.2f} / {r['predicted_staleness_mean']:.2f}",
            f"{r['measured_staleness_max']} / {r['predicted_staleness_max']}",
            f"{r['staleness_tv']:.3f}",
            f"{r['dropped_episodes']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Co-run slowdown: one fixed workload took {co['alone_s']:.2f} s alone and {co['together_s']:.2f} s as one of "
        f"two concurrent processes ({co['slowdown']:.2f}x).",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = rows[1:]
    x = [r["staleness_bound"] for r in a]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    ax = axes[0]
    ax.errorbar(
        x,
        [r["measured_steps_per_s"] for r in a],
        [2 * r["measured_steps_per_s_se"] for r in a],
        marker="o",
        capsize=3,
        label="measured (± 2 SE)",
    )
    ax.plot(x, [r["predicted_steps_per_s"] for r in a], marker="s", ls="--", label="simulator")
    ax.plot(
        x,
        [r["predicted_steps_per_s_async_calibrated"] for r in a],
        marker="^",
        ls=":",
        label="simulator, trainer time from async runs",
    )
    ax.axhline(rows[0]["measured_steps_per_s"], color="gray", lw=1, label="sync")
    ax.set(xlabel="staleness bound", ylabel="training steps per second", title="throughput")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[1]
    ax.errorbar(
        x,
        [r["measured_staleness_mean"] for r in a],
        [2 * r["measured_staleness_mean_se"] for r in a],
        marker="o",
        capsize=3,
        label="measured per batch (± 2 SE)",
    )
    ax.plot(x, [r["predicted_staleness_mean"] for r in a], marker="s", ls="--", label="simulator")
    ax.plot(
        x, [r["measured_token_staleness_mean"] for r in a], marker="x", ls=":", label="measured (per token)"
    )
    ax.set(xlabel="staleness bound", ylabel="mean staleness (versions)", title="staleness")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
