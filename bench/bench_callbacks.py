"""Overhead of the monitoring callbacks: training-step time with all of them on against none, in one run.

    python bench/bench_callbacks.py                 # lagged sampler, lag 4, 10 steps x 5 rounds
    python bench/bench_callbacks.py --rounds 8 --steps 16

Both arms train on identical batches (same seed, and the callbacks draw no random numbers from the
training streams), so step k costs the same compute in both and the difference is the callbacks' work:
their hooks, the extra scalars Lightning writes, and the histograms. Arms alternate round by round so
that drift in the machine's load hits both. A step is timed from one ``on_train_batch_start`` to the
next, so Lightning's logging after the hooks is included; the first ``--warmup`` steps are dropped.

Two clocks: wall time, and the process's CPU time (all its threads, the event-file writer's included),
which other processes' load on a shared machine disturbs far less. One torch thread, so that CPU time
is not inflated by threads spinning while they wait. The time spent inside the callbacks' own hooks is
also reported, as a share of the no-callback step.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
import warnings

import lightning as L

from lrl.cli import OneLineParser


class StepClock(L.Callback):
    """Records wall and process CPU time at each training-batch start."""

    def __init__(self):
        self.starts: list[tuple[float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append((time.perf_counter(), time.process_time()))

    def step_times(self) -> list[tuple[float, float]]:
        """(wall, cpu) seconds of each step but the last."""
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(self.starts, self.starts[1:])]


def timed_hooks(callback: L.Callback, spent: list[float]) -> L.Callback:
    """Wrap the callback's batch hooks so that the wall time inside them is added to spent[0]."""
    for name in ("on_train_batch_start", "on_train_batch_end"):
        hook = getattr(callback, name)

        def timed(*args, _hook=hook, **kw):
            start = time.perf_counter()
            try:
                return _hook(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - start

        setattr(callback, name, timed)
    return callback


def one_arm(monitoring: bool, steps: int, log_dir: str) -> tuple[list[tuple[float, float]], float]:
    from lrl.callbacks import build_callbacks
    from lrl.config import Config
    from lrl.run import build_run

    cfg = Config(
        sampler="lagged",
        lag=4,
        max_steps=steps + 1,
        eval_every=steps + 1,
        eval_episodes=1,
        threads=1,
        progress=False,
        log_dir=log_dir,
        run_name="on" if monitoring else "off",
    )
    clock, spent = StepClock(), [0.0]
    monitors = [timed_hooks(c, spent) for c in build_callbacks(cfg)] if monitoring else []
    run = build_run(cfg, callbacks=monitors + [clock])
    run.trainer.fit(run.module, run.datamodule)
    return clock.step_times(), spent[0] / (steps + 1)  # `steps` intervals: the last batch is only a start


def main(argv=None) -> None:
    parser = OneLineParser(prog="bench_callbacks.py", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per arm and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each arm")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup: {args.warmup} is not allowed; it drops steps of the {args.steps} timed, so it must "
                     f"be in [0, {args.steps - 1}]")  # fmt: skip
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    off: list[tuple[float, float]] = []
    on: list[tuple[float, float]] = []
    hooks: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for monitoring, sink in ((False, off), (True, on)):
                times, hook_s = one_arm(monitoring, args.steps, tmp)
                times = times[args.warmup :]
                sink.extend(times)
                hooks += [hook_s] if monitoring else []
                wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
                print(
                    f"round {r} {'all callbacks' if monitoring else 'no callbacks':<13} | median step: "
                    f"wall {wall * 1e3:7.1f} ms, cpu {cpu * 1e3:7.1f} ms"
                )
    for i, clock in enumerate(("wall", "cpu")):
        a, b = [t[i] for t in off], [t[i] for t in on]
        paired = statistics.median(y / x for x, y in zip(a, b))  # same step, same batch, both arms
        print(
            f"{clock:>4}: total step-time ratio (all / none) {sum(b) / sum(a):.3f} | median paired-step ratio "
            f"{paired:.3f} | {len(a)} steps per arm"
        )
    hook = statistics.mean(hooks)
    print(
        f"time inside the callbacks' hooks: {hook * 1e3:.1f} ms per step = "
        f"{hook / statistics.median(t[0] for t in off):.1%} of the median no-callback step (wall)"
    )


if __name__ == "__main__":
    main()
