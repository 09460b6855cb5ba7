"""Figures of the simulator studies (timelines, staleness against throughput, and the two extras), via Agg.

matplotlib is imported inside the functions, so importing the simulator does not need it. Each function
writes `<stem>.png` and `<stem>.svg` into a folder and returns the two paths.
"""

from __future__ import annotations

from pathlib import Path

SYNC_COLOR = "gold"
TRAIN_COLOR = "aqua"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, folder: str | Path, stem: str) -> list[Path]:
    """Write fig as PNG and SVG into folder -> the two paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    _pyplot().close(fig)
    return paths


def _draw_timeline(ax, result: dict, n_slots: int, cmap, n_versions: int) -> None:
    """One pipeline's events on one axis: episode bars per slot, train bars on a trainer row, sync bands."""
    span = result["time"]
    for kind, slot, start, end, version in result["events"]:
        if kind == "sync":
            ax.axvspan(start, end, color=SYNC_COLOR, alpha=0.45, lw=0, zorder=0)
        elif kind == "train":
            ax.barh(
                n_slots, end - start, left=start, height=0.7, color=TRAIN_COLOR, edgecolor="teal", zorder=2
            )
            ax.text(
                (start + end) / 2, n_slots, f"step v{version}", ha="center", va="center", fontsize=7, zorder=3
            )
        else:
            color = cmap(version / max(n_versions - 1, 1))
            hatch = "xx" if kind == "fail" else None
            ax.barh(
                slot,
                end - start,
                left=start,
                height=0.7,
                color=color,
                edgecolor="white",
                hatch=hatch,
                zorder=2,
            )
            if end - start > 0.025 * span:
                shade = "white" if version / max(n_versions - 1, 1) > 0.45 else "black"
                ax.text(
                    (start + end) / 2, slot, str(version), ha="center", va="center", fontsize=7, color=shade
                )
    for slot, start, version in result["in_flight"] or []:
        color = cmap(version / max(n_versions - 1, 1))
        ax.barh(slot, span - start, left=start, height=0.7, color=color, alpha=0.35, hatch="//", zorder=1)
    ax.set_yticks(range(n_slots + 1), [str(s) for s in range(n_slots)] + ["trainer"])
    ax.set_ylim(-0.6, n_slots + 0.6)
    ax.set_ylabel("generation slot")


def plot_timelines(
    results: list[tuple[str, dict]], n_slots: int, steps: int, folder: str | Path
) -> list[Path]:
    """The timelines of named pipeline runs (with events), stacked, one shared time axis."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    cmap = plt.get_cmap("Blues")
    n_versions = steps
    fig, axes = plt.subplots(
        len(results), 1, figsize=(11, 2.2 + 1.9 * len(results)), sharex=True, squeeze=False
    )
    for ax, (name, result) in zip(axes[:, 0], results):
        _draw_timeline(ax, result, n_slots, lambda x: cmap(0.25 + 0.7 * x), n_versions)
        ax.set_title(f"{name}: {steps} steps in {result['time']:,.0f} s", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("simulated time (s)")
    handles = [
        Patch(color=cmap(0.25 + 0.7 * v / max(n_versions - 1, 1)), label=f"episode, version {v}")
        for v in range(n_versions)
    ]
    handles += [
        Patch(facecolor="lightgray", hatch="//", alpha=0.5, label="still running at the end"),
        Patch(color=TRAIN_COLOR, label="training step"),
        Patch(color=SYNC_COLOR, alpha=0.45, label="weight sync (generation paused)"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.07)
    )
    fig.suptitle(
        "Rollout pipeline timelines: each bar is one episode on one slot, labelled with the version that started it",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(fig, folder, "timelines")


def plot_staleness_throughput(rows: list[dict], title: str, folder: str | Path) -> list[Path]:
    """Throughput against the staleness bound (partial, drain); mean and max staleness."""
    plt = _pyplot()
    etas = [r["eta"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(etas, [r["partial"] for r in rows], "o-", label="partial rollouts (interrupt at sync)")
    left.plot(etas, [r["drain"] for r in rows], "s--", label="drain before each sync")
    left.set_ylabel("trained episodes per hour")
    left.set_ylim(bottom=0)
    right.plot(etas, [r["stale_mean"] for r in rows], "o-", label="mean staleness")
    right.plot(etas, [r["stale_max"] for r in rows], "s-", label="max staleness")
    right.plot(etas, etas, ":", color="gray", label="the bound η")
    right.set_ylabel("staleness of trained episodes (versions)")
    right.set_title("partial rollouts", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("staleness bound η (batches generation may run ahead)")
        ax.set_xticks(etas)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, folder, "staleness_throughput")


def plot_consume(rows: list[dict], title: str, folder: str | Path) -> list[Path]:
    """Exercise 2: throughput with the bound at generation only and also at consumption; share discarded."""
    plt = _pyplot()
    etas = [r["eta"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(etas, [r["throughput"] for r in rows], "o-", label="throttle only")
    ax.plot(etas, [r["bounded"] for r in rows], "s--", label="throttle + drop staleness > η at consumption")
    ax.set_xlabel("staleness bound η")
    ax.set_ylabel("trained episodes per hour")
    ax.set_ylim(bottom=0)
    ax.set_xticks(etas)
    ax.grid(alpha=0.3)
    share = ax.twinx()
    share.bar(
        etas, [100 * r["discarded"] for r in rows], color="tab:red", alpha=0.25, label="episodes discarded"
    )
    share.set_ylabel("episodes discarded (% of those consumed)")
    lines, labels = ax.get_legend_handles_labels()
    bars, bar_labels = share.get_legend_handles_labels()
    ax.legend(lines + bars, labels + bar_labels, fontsize=8, loc="center right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, folder, "consume_bound")


def plot_exponential(
    rows: list[dict], mean: float, fixed: float, title: str, folder: str | Path
) -> list[Path]:
    """Exercise 1: simulated synchronous step time on exponential durations against m H_B and m ln B (+ fixed s)."""
    import math

    from lrl_lab.sim.durations import harmonic

    plt = _pyplot()
    sizes = [r["batch_size"] for r in rows]
    grid = list(range(1, max(sizes) + 1))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(grid, [mean * harmonic(b) + fixed for b in grid], "-", label="m H_B + t_train + t_sync (exact)")
    ax.plot(grid, [mean * math.log(b) + fixed for b in grid], "--", label="m ln B + t_train + t_sync")
    ax.plot(sizes, [r["simulated"] for r in rows], "o", ms=7, label="simulated (mean over steps)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("episodes per step B (= slots)")
    ax.set_ylabel("synchronous step time (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, folder, "exponential")
