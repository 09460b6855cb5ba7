"""A real run's slot occupancy beside its simulation, and what the simulator's error on it is made of.

    python -m lrl_lab.experiments.occupancy --design partial2 --runs results/designs/throttle \\
        --predict-from results/calibration/learning.json --png docs/figures/occupancy_partial2.png

For one design of the designs experiment (``lrl_lab.experiments.designs``), from its runs' histories:

1. the figure: the slots of the first repeat over six steps, by state (decoding, ready for the engine, waiting
   for a tool, paused for a weight load, empty), as the pipeline logged them (``pipeline/occupancy``), above
   the same design simulated by the load model from the calibration (the chapter's Figure 13.1 from a real run
   and from its simulation);
2. the decomposition: the prediction of each repeat's episodes per second by the simulator as it was (the
   duration model on the run's own episode times, a held episode freed when it ends), then with the
   controller's rule (freed when its group ends), then the load model on the run's own turns without and with
   the co-run slowdown, then the load model from the calibration only; and the occupancy shares measured
   against those of the last.

Steps 2 and 3 use the run's own episodes: they are diagnostics of the model, not predictions.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from lrl.cli import OneLineParser
from lrl_lab.experiments.designs import DESIGNS, SHORT, file_name, measured
from lrl_lab.experiments.designs_predict import load_calibration, predicted_from, window_rate
from lrl_lab.experiments.inputs import ERRORS, numbers, outputs, read_history
from lrl_lab.experiments.workload import (
    GROUP,
    GROUPS,
    SKIP,
    SLOTS,
    durations,
    switch_seconds,
    trainer_seconds,
)

STATES = ("decoding", "ready", "tool", "paused", "empty")
COLORS = {
    "decoding": "tab:orange",
    "ready": "tab:olive",
    "tool": "tab:green",
    "paused": "tab:red",
    "empty": "0.85",
}
WINDOW = 6  # steps drawn


def real_occupancy(
    history: list[dict], slots: int
) -> tuple[list[float], dict[str, list[float]], list[float]]:
    """The logged samples of a one-worker run -> times (s since the end of step SKIP), shares by state, step ends."""
    t0 = history[SKIP]["time/end"]
    samples = sorted((x for h in history for x in h.get("pipeline/occupancy", [])), key=lambda x: x[1])
    times, shares = [], {k: [] for k in STATES}
    for _, wall, dec, ready, tool, flight, paused in samples:
        times.append(wall - t0)
        p = flight if paused else 0
        for k, v in zip(STATES, (0 if paused else dec, 0 if paused else ready, 0 if paused else tool, p)):
            shares[k].append(v / slots)
        shares["empty"].append(max(slots - flight, 0) / slots)
    return times, shares, [h["time/end"] - t0 for h in history]


def simulated_occupancy(run: dict, drop: bool, cal: dict) -> tuple[list[float], dict, list[float], dict]:
    """The load model's trace of a design from the calibration's first run -> times, shares, step ends, means."""
    from lrl_lab.sim.board import simulate_board
    from lrl_lab.sim.calibration import co_run_of, engine_of

    spec = DESIGNS[run["design"]]
    sync = bool(spec.get("sync"))
    part = cal["runs"][0]
    slow = co_run_of(cal) if not sync else 1.0
    slots = run.get("slots", SLOTS)
    trace: list = []
    sim = simulate_board(
        None, slots, GROUP, GROUPS, float(part["train_s"]) * slow, float(cal["engine"].get("switch_s", 0.0)),
        spec["eta"], spec["interrupt"], run.get("steps") or len(run["history"]), drop=drop, sync_before=sync,
        turns=part["turns"], engine=engine_of("the calibration", cal),
        co_run=slow, trace=trace,
    )  # fmt: skip
    t0 = sim["step_ends"][SKIP]
    times, shares = [], {k: [] for k in STATES}
    totals = dict.fromkeys(STATES, 0.0)
    for (t, dec, tool, flight, paused), nxt in zip(trace, [*trace[1:], None]):
        times.append(t - t0)
        values = (0, 0, 0, flight) if paused else (dec, 0, tool, 0)
        for k, v in zip(STATES, values):
            shares[k].append(v / slots)
        shares["empty"].append((slots - flight) / slots)
        if nxt is not None and t >= t0:
            dt = nxt[0] - t
            for k in STATES:
                totals[k] += shares[k][-1] * dt
    span = sum(totals.values()) or 1.0
    return times, shares, [e - t0 for e in sim["step_ends"]], {k: v / span for k, v in totals.items()}


def plot(real, sim, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 5.6), sharex=True)
    for ax, (times, shares, ends), name in zip(
        axes, (real, sim), ("measured (pipeline/occupancy)", "simulated")
    ):
        end = ends[min(SKIP + WINDOW, len(ends) - 1)] - ends[SKIP] if len(ends) > SKIP else 0
        keep = [i for i, t in enumerate(times) if 0 <= t <= end]
        xs = [times[i] for i in keep]
        ax.stackplot(
            xs, *[[shares[k][i] for i in keep] for k in STATES], labels=STATES, colors=[COLORS[k] for k in STATES],
            step="post",
        )  # fmt: skip
        for e in ends:
            if 0 <= e - ends[SKIP] <= end:
                ax.axvline(e - ends[SKIP], color="k", lw=0.6)
        ax.set_ylabel("share of slots")
        ax.set_ylim(0, 1)
        ax.set_title(name, fontsize=9, loc="left")
    axes[0].legend(loc="upper right", fontsize=7, ncol=5)
    axes[1].set_xlabel(f"seconds from the end of step {SKIP} (vertical lines: step ends)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def decomposition(runs: list[dict], drop: bool, cal: dict) -> list[dict]:
    """Each model's episodes/s against each repeat's measured -> rows of errors (median over repeats)."""
    from lrl_lab.experiments.engine_cost import run_part
    from lrl_lab.sim.board import simulate_board

    rows: dict[str, list[float]] = {}
    for run in runs:
        h = run["history"]
        spec = DESIGNS[run["design"]]
        sync = bool(spec.get("sync"))
        m = measured(run)["episodes_per_s"]

        args = (run.get("slots", SLOTS), GROUP, GROUPS, trainer_seconds(h, sync), switch_seconds(h))
        args += (spec["eta"], spec["interrupt"], len(h))
        for release in ("episode", "group"):
            sim = simulate_board(durations(h), *args, drop=drop, sync_before=sync, release=release)
            rows.setdefault(f"duration model, own episode times, freed per {release}", []).append(
                window_rate(sim) / m - 1
            )
        own = dict(cal, runs=[run_part(h)])
        alone = dict(own, co_run={"slowdown": 1.0})
        rows.setdefault("load model, own turns, no co-run slowdown", []).append(
            predicted_from(run, drop, alone)["episodes_per_s"] / m - 1
        )
        rows.setdefault("load model, own turns, co-run slowdown", []).append(
            predicted_from(run, drop, own)["episodes_per_s"] / m - 1
        )
        rows.setdefault("load model, calibration only (the prediction)", []).append(
            predicted_from(run, drop, cal)["episodes_per_s"] / m - 1
        )
    return [{"model": k, "errors": v, "median": statistics.median(v)} for k, v in rows.items()]


def measured_shares(history: list[dict]) -> dict[str, float]:
    return {k: statistics.fmean(h.get(f"pipeline/occ_{k}", 0.0) for h in history[SKIP + 1 :]) for k in STATES}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m lrl_lab.experiments.occupancy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--design", default="partial2", help=f"one of {sorted(SHORT)}")
    p.add_argument("--runs", required=True, help="the designs experiment's folder (with histories/)")
    p.add_argument("--staleness-drop", choices=("true", "false"), default="false")
    p.add_argument("--slots", type=int, default=SLOTS)
    p.add_argument("--predict-from", required=True, metavar="FILE", help="a calibration (engine_cost --run)")
    p.add_argument("--png", default=None, help="write the figure here")
    args = p.parse_args(argv)
    design = SHORT.get(args.design, args.design)
    if design not in DESIGNS:
        p.error(f"--design: one of {sorted(SHORT)}")
    drop = args.staleness_drop == "true"
    if args.slots < 1:
        p.error("--slots must be at least 1")
    for problem in outputs(("--png", args.png, "file")):
        p.error(problem)
    paths = sorted((Path(args.runs) / "histories").glob(f"{file_name(design)}-r*.jsonl"))
    if not paths:
        p.error(f"--runs: no histories of {design!r} under {args.runs}/histories")
    runs = []
    try:  # every input read and checked before any work
        cal = load_calibration(args.predict_from)
        for path in paths:
            lines = read_history(path)
            numbers(path, lines, ("time/end",))
            runs.append({"design": design, "history": lines, "steps": len(lines), "slots": args.slots})
    except ERRORS as err:
        p.error(str(err))
    print(
        f"{design}, {len(runs)} repeats, {args.slots} slots: error in episodes/s of each model (median; repeats)"
    )
    print("| model | error (median) | per repeat |\n|---|---|---|")
    for row in decomposition(runs, drop, cal):
        each = ", ".join(f"{100 * e:+.1f}%" for e in row["errors"])
        print(f"| {row['model']} | {100 * row['median']:+.1f}% | {each} |")
    real = real_occupancy(runs[0]["history"], args.slots)
    sim = simulated_occupancy(runs[0], drop, cal)
    shares = {k: statistics.median(measured_shares(r["history"])[k] for r in runs) for k in STATES}
    print("\n| share of slot-seconds | " + " | ".join(STATES) + " |\n|---|" + "---|" * len(STATES))
    print("| measured (median over repeats) | " + " | ".join(f"{shares[k]:.3f}" for k in STATES) + " |")
    print("| load model, calibration | " + " | ".join(f"{sim[3][k]:.3f}" for k in STATES) + " |")
    if args.png:
        title = f"{design}, {args.slots} slots: slot occupancy of repeat 0 and of its simulation from the calibration"
        plot(real, sim[:3], title, Path(args.png))
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
