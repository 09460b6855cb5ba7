"""How far the pipeline scales: lrl's pipeline simulator, calibrated from short runs on this machine, projected to
64 and 1,024 rollout slots spread over many workers (docs/scaling.md).

    python -m lrl_lab.experiments.scaling --repeats 2            # measure (two short runs), then project
    python -m lrl_lab.experiments.scaling --report               # the tables again from the measured histories

Each measuring run is ``python train.py --pipeline async --slots 64 --tool-latency lognormal:0.3:1.0`` (8 tasks x
8 episodes a step, bound 1, 10 steps). From its history come the inputs of :func:`lrl_lab.sim.board.simulate_board`:
every episode's wall time (``time/finished_seconds``), the trainer's seconds per step outside waiting for data
(``time/end`` minus ``pipeline/trainer_wait``), and the workers' weight-load time (``time/worker_sync``). The
projection then asks, for each way of splitting the slots over workers and each staleness bound, how many episodes
a second are trained, with the batch either fixed (64 episodes a step) or growing with the slots (64 a step per 64
slots, the trainer's time growing with its batch). It is a model of lrl's own rules (throttle, whole groups,
consumer-side drop), not a measurement of a cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from lrl.cli import OneLineParser
from lrl_lab.experiments.inputs import ERRORS, outputs, read_history
from lrl_lab.experiments.workload import (
    BATCH,
    BOUNDS,
    GROUP,
    LAYOUTS,
    MEASURE,
    RUN_FLAGS,
    durations,
    switch_seconds,
    train_command,
    trainer_seconds,
)

STEPS = 40


def measure(repeat: int, out: Path) -> list[dict]:
    """One measuring run (reused when its history exists) -> its history."""
    history = out / f"measure-r{repeat}.jsonl"
    if not history.exists():
        out.mkdir(parents=True, exist_ok=True)
        partial = history.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        cmd = train_command(*RUN_FLAGS, *MEASURE, "--seed", str(repeat))
        cmd += ["--log-dir", str(out / "runs"), "--history-file", str(partial)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"train.py exited {done.returncode}: {done.stderr.strip()[-800:]}")
        partial.rename(history)
    return [json.loads(line) for line in history.read_text().splitlines() if line.strip()]


def calibrate(histories: list[list[dict]]) -> dict:
    """The simulator's inputs from measured histories: pooled durations, trainer and weight-load seconds."""
    return {
        "durations": [d for h in histories for d in durations(h)],
        "trainer": statistics.median(trainer_seconds(h, False) for h in histories),
        "switch": statistics.median(switch_seconds(h) for h in histories),
    }


def project(inputs: dict, slots: int, workers: int, eta: int, batch: int) -> dict:
    """One simulated configuration -> episodes/s, slot use, token staleness, whether the trainer is the limit."""
    from lrl_lab.sim.board import simulate_board

    train_time = inputs["trainer"] * batch / BATCH  # the trainer's time grows with its batch
    sim = simulate_board(
        inputs["durations"],
        slots // workers,
        GROUP,
        batch // GROUP,
        train_time,
        inputs["switch"],
        max(eta, 0),
        True,
        STEPS,
        workers=workers,
        sync_before=eta == 0,
    )
    busy = len(sim["step_ends"]) * train_time / sim["time"]  # share of the time the trainer computes
    return {
        "episodes_per_s": sim["episodes_per_s"],
        "slot_util": sim["slot_util"],
        "staleness": sim["staleness_mean"],
        "trainer_busy": busy,
    }


def table(inputs: dict) -> dict:
    """Every layout x bound, with the batch fixed and growing with the slots."""
    rows = {}
    for total, layouts in LAYOUTS.items():
        for per, workers in layouts:
            for grow in (False, True):
                batch = max(BATCH, total) if grow else BATCH
                for eta in BOUNDS:
                    rows[(total, per, workers, batch, eta)] = project(inputs, total, workers, eta, batch)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m lrl_lab.experiments.scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repeats", type=int, default=2, help="measuring runs")
    p.add_argument("--out", default="results/scaling", help="folder of the measuring runs' histories")
    p.add_argument("--report", action="store_true", help="only the tables, from histories already measured")
    args = p.parse_args(argv)
    from lrl_lab.experiments.scaling_report import markdown

    out = Path(args.out)
    for problem in outputs(("--out", args.out, "dir")):
        p.error(problem)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.report:
        try:
            histories = [read_history(f) for f in sorted(out.glob("measure-r*.jsonl"))]
        except ERRORS as err:
            p.error(str(err))
        if not histories:
            p.error(f"--report: no measured histories in {out}: run without --report first")
    else:
        histories = [measure(k, out) for k in range(args.repeats)]
    inputs = calibrate(histories)
    print(markdown(inputs, table(inputs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
