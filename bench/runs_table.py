"""A table of finished train.py runs, grouped into rows: the held-out pass rate at each evaluation, its gain, the
mismatch, the over-cap share, the effective sample size, how many seeds learned and the wall time from the first
logged scalar to the last, read from each run's TensorBoard folder.

    python bench/runs_table.py "on-policy=runs/onpolicy_s*" "lag 8, TIS=runs/lag8_tis_s*" --learned 0.15

Each argument is ``LABEL=GLOB``; the glob names run folders (``<log_dir>/<run_name>/version_N``) or folders above
them (every ``version_*`` below is a run). A run learned when its last held-out pass rate is at least ``--learned``
above its first. Means are over the run's steps, then over its seeds.
"""

from __future__ import annotations

import argparse
import glob
import math
import statistics
import sys
from pathlib import Path

from lrl.cli import OneLineParser
from lrl_lab.tools.plot_run import read_events


def run_folders(pattern: str) -> list[Path]:
    """Run folders named by a glob: the folders themselves when they hold events, else every version_* below."""
    found = []
    for hit in sorted(glob.glob(pattern)):
        path = Path(hit)
        if any(path.glob("events.out.tfevents.*")):
            found.append(path)
        else:
            found += sorted(
                p for p in path.rglob("version_*") if p.is_dir() and any(p.glob("events.out.tfevents.*"))
            )
    return found


def mean_of(events: dict, tag: str) -> float | None:
    points = events.get(tag, [])
    return statistics.fmean(e.value for e in points) if points else None


def one_run(run: Path) -> dict:
    events = read_events(run)
    held = [(e.step, e.value) for e in events.get("val/pass_rate", [])]
    if not held:
        raise SystemExit(f"{run}: no held-out evaluation (val/pass_rate) in its events")
    # from the run's first logged scalar to its last (model loading before the first step is not in it)
    times = [e.wall_time for series in events.values() for e in series]
    return {
        "run": str(run),
        "held": held,
        "gain": held[-1][1] - held[0][1],
        "mismatch": mean_of(events, "mismatch/abs_mean"),
        "over_cap": mean_of(events, "mismatch/over_cap"),
        "ess": mean_of(events, "mismatch/ess_raw"),
        "wall": max(times) - min(times),
    }


def fmt(values: list, digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (
        f"{statistics.fmean(values):.{digits}f} +- {statistics.stdev(values) / len(values) ** 0.5:.{digits}f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="runs_table.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rows", nargs="+", help="LABEL=GLOB, one a row")
    parser.add_argument(
        "--learned", type=float, default=0.15, help="gain of held-out pass rate that counts as learned"
    )
    args = parser.parse_args(argv)
    if not math.isfinite(args.learned):
        parser.error(f"--learned: {args.learned} is not allowed; it must be a finite gain")
    rows = []  # every row's runs found before the table starts: a glob that names none is a mistake, not a row
    for row in args.rows:
        label, sep, pattern = row.partition("=")
        if not sep:
            parser.error(f"{row!r}: want LABEL=GLOB")
        folders = run_folders(pattern)
        if not folders:
            parser.error(f"{label}: no run folder matches {pattern!r}")
        rows.append((label, folders))
    print(
        "| row | seeds | held-out, first -> last (each seed) | last, mean +- s.e. | gain | learned | mismatch (nats) "
        "| over cap | ESS | wall (min) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, folders in rows:
        runs = [one_run(r) for r in folders]
        each = ", ".join(f"{r['held'][0][1]:.3f} -> {r['held'][-1][1]:.3f}" for r in runs)
        walls = [r["wall"] / 60 if r["wall"] else None for r in runs]
        print(
            f"| {label} | {len(runs)} | {each} | {fmt([r['held'][-1][1] for r in runs])} | "
            f"{fmt([r['gain'] for r in runs])} | {sum(r['gain'] >= args.learned for r in runs)} of {len(runs)} | "
            f"{fmt([r['mismatch'] for r in runs])} | {fmt([r['over_cap'] for r in runs], 4)} | "
            f"{fmt([r['ess'] for r in runs])} | {fmt(walls, 1)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
