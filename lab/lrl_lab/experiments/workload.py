"""What the pipeline experiments share: the workload and designs they run, the flags that keep a run quiet, and
what they read off a run's history (episode wall times, the trainer's seconds, weight switches)."""

from __future__ import annotations

import statistics
import sys


def train_command(*flags: str) -> list[str]:
    """The command line of one training run of the lab: the installed lrl's training module with `flags`, run in
    this process's folder (never a checkout's train.py by its path, so a non-editable install runs it too)."""
    return [sys.executable, "-m", "lrl.train", *flags]


RUN_FLAGS = [
    "--eval-every",
    "100000",
    "--eval-at-start",
    "false",
    "--eval-episodes",
    "1",
    "--checkpoint-every",
    "0",
    "--progress",
    "false",
    "--threads",
    "1",
]

SKIP = 2  # steps left out of a rate: the first ones include starting the workers
SLOTS = 64
GROUP = 8  # episodes per task
GROUPS = 8  # tasks per step
LATENCY = "lognormal:0.3:1.0"
STEPS = 20

DESIGNS: dict[str, dict] = {
    "synchronous": {"flags": ["--pipeline", "sync"], "eta": 0, "interrupt": True, "sync": True},
    "one step ahead, drain": {
        "flags": ["--pipeline", "async", "--max-staleness", "1", "--partial-rollouts", "drain"],
        "eta": 1,
        "interrupt": False,
    },
    "async eta=1, partial": {
        "flags": ["--pipeline", "async", "--max-staleness", "1", "--partial-rollouts", "interrupt"],
        "eta": 1,
        "interrupt": True,
    },
    "async eta=2, partial": {
        "flags": ["--pipeline", "async", "--max-staleness", "2", "--partial-rollouts", "interrupt"],
        "eta": 2,
        "interrupt": True,
    },
    "async eta=4, drain": {
        "flags": ["--pipeline", "async", "--max-staleness", "4", "--partial-rollouts", "drain"],
        "eta": 4,
        "interrupt": False,
    },
}

WORKLOAD = [  # the slow-tool workload of every design (also bench_pipeline --slotted, lrl_lab.experiments.scaling)
    "--slots",
    str(SLOTS),
    "--tool-latency",
    LATENCY,
    "--tasks-per-step",
    str(GROUPS),
    "--episodes-per-task",
    str(GROUP),
]
DESIGN_FLAGS = [*WORKLOAD, "--max-steps", str(STEPS), *RUN_FLAGS]  # then the experiments' quiet flags


BATCH = 64  # episodes a step in the measuring runs
MEASURE = ["--pipeline", "async", *WORKLOAD, "--max-steps", "10"]  # 8 x 8 a step, as the defaults are
LAYOUTS = {
    64: [(64, 1), (16, 4), (4, 16)],
    1024: [(1024, 1), (64, 16), (16, 64)],
}  # slots -> (per worker, workers)
BOUNDS = [0, 1, 2, 4, 16]


# -- what a run measured ------------------------------------------------------------------------------------
def durations(history: list[dict]) -> list[float]:
    """Every finished episode's wall time, in the order the episodes started."""
    pairs = sorted((int(i), s) for h in history for i, s in h.get("time/finished_seconds", []))
    return [s for _, s in pairs]


def trainer_seconds(history: list[dict], sync: bool) -> float:
    """The trainer's seconds per step outside getting its data (from step SKIP on)."""
    ends = [h["time/end"] for h in history]
    wait = "time/sample" if sync else "pipeline/trainer_wait"
    return statistics.fmean([b - a - h[wait] for a, b, h in zip(ends, ends[1:], history[1:])][SKIP:])


def switch_seconds(history: list[dict]) -> float:
    values = [h["time/worker_sync"] for h in history if h.get("time/worker_sync")]
    return statistics.fmean(values) if values else 0.0
