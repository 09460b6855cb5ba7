"""decide's figure, read from the runs of results.jsonl: on the left each row's held-out pass rate at the end, seed by
seed, with its mean and 95% interval; on the right each row's paired difference from the baseline, seed by seed,
with its mean and interval, over a band of the effect the seeds are sized for. A difference whose interval lies
wholly on one side of 0 is drawn in colour (blue above, red below), one that crosses 0 in black: what the claims
table calls decided and not decided, seen at a glance."""

from __future__ import annotations

import math
from pathlib import Path

from lrl_lab.experiments.decide_tables import METRICS, by_row, in_order, interval, paired
from lrl_lab.tools.plot_run import pyplot, save_figure

FORMATS = (".png", ".svg", ".pdf")  # what the figure may be written as (matplotlib's Agg and its vector backends)


def forest(results: list[dict], order: list[str], baseline: str, metric: str) -> list[dict]:
    """One entry a row, in `order` (rows not named there after it): its seeds, the runs' `metric` at the end with their
    mean and 95% half-width, the held-out greedy rate at the start (mean), and, for every row but the baseline, the
    paired differences from the baseline over the seeds both have, with their mean and half-width."""
    rows = by_row(results)
    entries = []
    for label in in_order(rows, order):
        seeds = sorted(rows[label])
        values = [rows[label][s][metric] for s in seeds]
        mean, half, _ = interval(values)
        entry = {"row": label, "seeds": seeds, "values": values, "mean": mean, "half": half,
                 "start": interval([rows[label][s]["greedy_first"] for s in seeds])[0]}  # fmt: skip
        if label != baseline and baseline in rows:
            diffs = paired(rows, label, baseline, metric)
            d_mean, d_half, _ = interval(diffs)
            entry.update(diffs=diffs, diff_mean=d_mean, diff_half=d_half)
        entries.append(entry)
    return entries


def side(mean: float, half: float) -> int:
    """+1 where the interval lies wholly above 0, -1 wholly below, 0 where it crosses 0 or there is none."""
    if not math.isfinite(half):
        return 0
    return 1 if mean - half > 0 else -1 if mean + half < 0 else 0


COLOURS = {1: "tab:blue", -1: "tab:red", 0: "black"}


def seeds_and_bar(ax, xs: list[float], mean: float, half: float, y: float, colour: str) -> None:
    """One row of a panel: its seeds' values in grey, spread a little about `y`, and its mean with the interval."""
    ax.scatter(xs, [y + 0.25 * (i / max(len(xs) - 1, 1) - 0.5) for i in range(len(xs))], s=14, color="0.55", zorder=2)
    ax.errorbar(mean, y, xerr=half if math.isfinite(half) else None, fmt="D", ms=6, color=colour, capsize=4, zorder=3)


def draw(entries: list[dict], baseline: str, metric: str, effect: float):
    """The two panels of `entries` (forest's) -> the matplotlib figure, not yet titled or written."""
    fig, (left, right) = pyplot().subplots(
        1, 2, figsize=(11, 1.2 + 0.55 * len(entries)), sharey=True, gridspec_kw={"width_ratios": [1, 1.25]}
    )
    ys = list(range(len(entries)))[::-1]  # the first row at the top
    for y, e in zip(ys, entries):
        seeds_and_bar(left, e["values"], e["mean"], e["half"], y, "black")
        if "diffs" not in e:
            right.text(0.02, y, f"{e['row']}: the baseline", va="center", transform=right.get_yaxis_transform(),
                       fontsize=8, color="0.35")  # fmt: skip
            continue
        mean, half = e["diff_mean"], e["diff_half"]
        colour = COLOURS[side(mean, half)]
        seeds_and_bar(right, e["diffs"], mean, half, y, colour)
        said = f"{mean:+.3f} ± {half:.3f}" if math.isfinite(half) else f"{mean:+.3f}"
        right.annotate(f"{said} ({len(e['diffs'])})", (mean, y), xytext=(0, 7), textcoords="offset points",
                       ha="center", fontsize=8, color=colour)  # fmt: skip
    starts = [e["start"] for e in entries if math.isfinite(e["start"])]
    label = f"{METRICS[metric]} at the end: seeds (grey), mean and 95% interval"
    if metric == "greedy" and starts:
        left.axvline(sum(starts) / len(starts), color="0.6", ls="--", lw=1)
        label += "\n(dashed: held-out greedy at the start)"
    ends = [x for e in entries if math.isfinite(e["half"]) for x in (e["mean"] - e["half"], e["mean"] + e["half"])]
    left.set_yticks(ys, [e["row"] for e in entries])  # a t interval may pass 0 or 1: the axis shows all of it
    left.set(xlabel=label, xlim=(min([-0.02, *ends]) - 0.02, max([1.02, *ends]) + 0.02))
    right.axvline(0, color="0.3", lw=1)
    label = f"minus {baseline}, paired by seed: mean and 95% interval (seeds)"
    if effect > 0:
        right.axvspan(-effect, effect, color="0.92", zorder=0)
        label += f"\n(grey band: within ±{effect:g})"
    right.set(xlabel=label)
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
        ax.set_ylim(-0.7, len(entries) - 0.3)
    return fig


def plot(results: list[dict], order: list[str], baseline: str, metric: str, effect: float, out: Path,
         source: str) -> Path:  # fmt: skip
    """Write the figure of the runs to `out` (its suffix names the format: one of FORMATS), titled by `source` and
    the machines and arithmetic the runs name -> `out`."""
    where = sorted({f"{r.get('machine') or 'machine not recorded'}, {r.get('precision') or 'arithmetic not recorded'}"
                    for r in results})  # fmt: skip
    fig = draw(forest(results, order, baseline, metric), baseline, metric, effect)
    return save_figure(fig, out, f"{source} ({'; '.join(where)})")


def figure_line(results: list[dict], order: list[str], baseline: str, metric: str, effect: float, out: Path,
                source: str) -> str:  # fmt: skip
    """Draw the figure (plot) -> the line that says where it is, or why it was not drawn (matplotlib missing: the
    runs and the tables stand without it)."""
    try:
        return f"figure: {plot(results, order, baseline, metric, effect, out, source)}"
    except ModuleNotFoundError as err:
        if err.name != "matplotlib":
            raise
        return f"figure not drawn: matplotlib is not installed (pip install matplotlib), so {out} was not written"
