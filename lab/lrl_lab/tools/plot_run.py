"""Plot a run's TensorBoard curves to a PNG: reward, held-out pass rate, reads, invalid actions.

python -m lrl_lab.tools.plot_run runs/lrl/version_0 --out docs/img/train_curve.png
python -m lrl_lab.tools.plot_run runs/lrl/version_0 --split --out split.png   # the mismatch split's parts over the run
"""

from __future__ import annotations

import argparse
from pathlib import Path

PANELS = (
    ("reward and held-out pass rate", ("train/reward", "val/pass_rate"), (0, 1.05)),
    ("reads per episode", ("train/reads", "val/reads"), None),
    ("malformed actions (share of episodes)", ("train/invalid", "val/invalid"), (0, None)),
    ("off-policy mismatch |log pi_old - log mu|", ("mismatch/abs_mean",), (0, None)),
)


def read_events(log_dir: str | Path) -> dict:
    """All scalar events of a TensorBoard run directory -> {tag: [ScalarEvent(wall_time, step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a TensorBoard run directory -> {tag: [(step, value), ...]}."""
    return {tag: [(e.step, e.value) for e in events] for tag, events in read_events(log_dir).items()}


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: str | Path, title: str) -> Path:
    """Title, lay out, write and close a figure -> the path written."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_run(log_dir: str | Path, out: str | Path, title: str | None = None) -> Path:
    """Write the four-panel figure of a run to `out`."""
    scalars = read_scalars(log_dir)
    if not scalars:
        raise SystemExit(f"{log_dir}: no TensorBoard scalars found")
    fig, axes = pyplot().subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for ax, (name, tags, ylim) in zip(axes, PANELS):
        for tag in tags:
            if tag in scalars:
                steps, values = zip(*scalars[tag])
                ax.plot(steps, values, marker="o" if tag.startswith("val/") else None, ms=4, label=tag)
        ax.set(title=name, xlabel="training step (policy version)")
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out, title or str(log_dir))


SPLIT_PARTS = ("staleness", "quantization", "engine", "rest")


def plot_split(log_dir: str | Path, out: str | Path, title: str | None = None) -> Path:
    """The mismatch split of a run (``--mismatch-split-every K``) over its steps: each part's mean |part| beside
    the total's, each part's signed mean (they add up to the total's), and the share the three causes explain."""
    scalars = read_scalars(log_dir)
    if "mismatch/part/total_abs" not in scalars:
        raise SystemExit(f"{log_dir}: no mismatch split (mismatch/part/*); run with --mismatch-split-every K")
    fig, axes = pyplot().subplots(1, 3, figsize=(13, 3.4))
    panels = (
        (axes[0], "mean |part| per token (nats)", [f"{p}_abs" for p in SPLIT_PARTS] + ["total_abs"]),
        (axes[1], "mean part per token, signed (nats)", list(SPLIT_PARTS) + ["total"]),
        (axes[2], "share of |total| the causes explain", ["explained"]),
    )
    for ax, name, parts in panels:
        for part in parts:
            points = scalars.get(f"mismatch/part/{part}", [])
            if points:
                steps, values = zip(*points)
                style = {"color": "black", "lw": 2} if part.startswith("total") else {}
                ax.plot(steps, values, marker="o", ms=3, label=part, **style)
        ax.set(title=name, xlabel="training step (policy version)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[2].set_ylim(0, 1.05)
    return save_figure(fig, out, title or str(log_dir))


def find_run(path: str | Path) -> Path:
    """The run folder to plot: `path` itself when it holds TensorBoard events, else the newest run below it."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{str(path)!r} is not a folder" + ("" if path.exists() else " (it does not exist)"))
    runs = {f.parent for f in path.rglob("events.out.tfevents.*")}
    if not runs:
        raise ValueError(f"no TensorBoard events in {str(path)!r} or below it")
    if path in runs:
        return path
    return max(runs, key=lambda r: max(f.stat().st_mtime for f in r.glob("events.out.tfevents.*")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "log_dir", help="a run's folder (runs/lrl/version_0), or a folder above runs (the newest)"
    )
    parser.add_argument("--out", default="train_curve.png", help="PNG to write")
    parser.add_argument("--title", default=None)
    parser.add_argument("--split", action="store_true", help="plot the mismatch split's parts instead")
    args = parser.parse_args(argv)
    from lrl.runs import check_output

    try:
        run = find_run(args.log_dir)
    except ValueError as err:
        parser.error(str(err))
    for problem in check_output("--out", args.out, "file"):
        parser.error(problem)
    if run != Path(args.log_dir):
        print(f"plotting the newest run below {args.log_dir}: {run}")
    print((plot_split if args.split else plot_run)(run, args.out, args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
