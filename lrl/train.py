"""Train an agent with RL from a behavior sampler: TinyAgent by default, any registered environment, any local
transformers causal LM. The installed command is ``lrl-train`` (also ``python -m lrl.train``); a checkout's
``python train.py`` calls the same :func:`main`.

    lrl-train                                       # on-policy, 40 steps, from the RL base
    lrl-train --sampler lagged --lag 4              # sample with weights 4 updates old
    lrl-train --config configs/fp8.yaml --lr 1e-3
    lrl-train --checkpoint-every 5 --resume last    # checkpoints; continues the newest run if there is one
    lrl-train --devices 2 --strategy ddp            # two processes (gloo on CPU), the batch split over them

Exit status: 0 done; 2 bad input (one line says which); 3 stopped by a numerical guard or the strict health
check; 4 every step was skipped (nothing could be learned); 5 a rollout worker, an inference engine or the cluster
failed, died, hung or could not be reached (one line names it; the last checkpoint is intact); 6 a file of the run
could not be written (a full disk: one line names it; the last complete checkpoint is intact); 130 / 143 / 129
stopped by Ctrl-C / SIGTERM / SIGHUP.
"""

from __future__ import annotations

import logging
import re
import shlex
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from lrl.cli import train_command, train_program

if TYPE_CHECKING:
    from lrl.run import FitResult

NOTHING_LEARNED = 4
WORKER_FAILED = 5
OUTPUT_FAILED = 6
# terminal escape sequences (colours, cursor moves) that a library's message may carry: CSI, OSC, and 2-byte ones
ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")


def one_line(err: Exception) -> str:
    """An error's message on one line and as plain text (library messages can carry newlines and colours)."""
    return " ".join(ESCAPES.sub("", str(err)).split())


def main(argv: list[str] | None = None) -> int:
    """Training from the command line: stop signals are handled from its first line on (a run still starting stops at once, with one
    line), and the handlers it found are put back when it returns."""
    from lrl.stopping import (
        STOP_SIGNALS,
        StoppedBeforeTraining,
        install_startup_handlers,
        received_at_start,
        stopped_at_start_line,
    )

    main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS} if main_thread else {}
    if main_thread:
        install_startup_handlers(train_program())
    from lrl.reaper import process_tempdir

    process_tempdir()  # whatever the run writes to TMPDIR goes with its process, even after a SIGKILL
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (StoppedBeforeTraining, Exception) as stop:
        # the stop, or an error that an import it interrupted made of it
        signum = stop.signum if isinstance(stop, StoppedBeforeTraining) else received_at_start()
        if signum is None:
            raise
        print(stopped_at_start_line(train_program(), signum), file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(argv: list[str]) -> int:
    start = time.time()
    from lrl.arguments import parse_args
    from lrl.config import ConfigError

    try:
        cfg = parse_args(argv)
    except ConfigError as err:
        print(f"{train_program()}: error: {one_line(err)}", file=sys.stderr)
        return 2
    # Lightning's info lines (accelerators found, tips) are not what a user of train.py needs
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    from lrl.callbacks.health import HealthCheckError
    from lrl.errors import EngineError, OutputError, WorkerError
    from lrl.run import build_run, fit, startup_notes
    from lrl.update import NumericalError

    try:
        run = build_run(cfg)
    except ConfigError as err:
        print(f"{train_program()}: error: {one_line(err)}", file=sys.stderr)
        return 2
    except OutputError as err:
        print(f"{train_program()}: stopped: {one_line(err)}", file=sys.stderr)
        return OUTPUT_FAILED
    announce_stops(run, argv)
    if run.trainer.is_global_zero:
        notes = startup_notes(cfg.policy, cfg.sampling, cfg.environment, cfg.run.accelerator, run)
        for note in ([run.folder.note] if run.folder is not None else []) + notes:
            print(f"{train_program()}: {note}", flush=True)
    try:
        result = fit(run)
    except (NumericalError, HealthCheckError) as err:
        print(f"{train_program()}: stopped: {one_line(err)}", file=sys.stderr)
        return 3
    except (WorkerError, EngineError) as err:
        print(f"{train_program()}: stopped: {one_line(err)}", file=sys.stderr)
        return WORKER_FAILED
    except OutputError as err:
        print(f"{train_program()}: stopped: {one_line(err)}", file=sys.stderr)
        return OUTPUT_FAILED
    if not run.trainer.is_global_zero:
        return 0
    if result.stopped_by is not None:
        return interrupted(result, run, argv)
    counts = "".join(f" | {m} {result.metrics[m]:.2f}" for m in run.spec.metrics)
    skipped = f" ({result.skipped} skipped: no advantage signal)" if result.skipped else ""
    print(
        f"held-out pass rate {result.pass_rate:.3f} over {result.episodes} episodes "
        f"({cfg.evaluation.eval_episodes} per task){counts} | invalid {result.invalid:.3f} | "
        f"env {cfg.environment.env} | sampler {cfg.sampling.sampler} lag {cfg.sampling.lag} "
        f"correction {cfg.weighting.correction} | {result.steps} steps{skipped} | "
        f"{time.time() - start:.1f} s | logs in {run.trainer.logger.log_dir if run.trainer.logger else '-'}"
    )
    if result.steps and result.skipped == result.steps and result.all_env_failures:
        print(
            f"{train_program()}: nothing was learned: every episode of all {result.steps} steps ended in an environment "
            f"failure ({result.env_timeouts:.0%} timed out at --tool-timeout, {result.env_errors:.0%} raised "
            f"in their tool), so no step had an episode to train on. Look at env/timeouts and env/errors: a tool "
            f"timeout shorter than the tools take, or an environment that cannot run here, is the usual cause.",
            file=sys.stderr,
        )
        return NOTHING_LEARNED
    if result.steps and result.skipped == result.steps:
        print(
            f"{train_program()}: nothing was learned: all {result.steps} steps were skipped, because no group of "
            f"episodes had any variance in reward (every episode of a task scored the same). Look at "
            f"train/reward and train/invalid: a temperature, failure rate or group size "
            f"(--episodes-per-task) that leaves no contrast between episodes is the usual cause.",
            file=sys.stderr,
        )
        return NOTHING_LEARNED
    return 0


def resume_command(run, argv: list[str]) -> str | None:
    """The command that continues this run from its last checkpoint (None when it keeps none)."""
    kept = list(argv)
    if "--resume" in kept:
        i = kept.index("--resume")
        del kept[i : i + 2]
    where = run.folder.path if run.folder is not None else None
    if run.cfg.run.checkpoint_every > 0 and where is not None:
        return f"{train_command()} {shlex.join([*kept, '--resume', str(where)])}"
    return None


def announce_stops(run, argv: list[str]) -> None:
    """The run's stop handler speaks as train.py and knows how the run is continued (for a second signal's line)."""
    for callback in run.trainer.callbacks:
        if type(callback).__name__ == "GracefulStop":
            callback.prefix = train_program()
            callback.resume_command = lambda: resume_command(run, argv)


def interrupted(result: FitResult, run, argv: list[str]) -> int:
    """One line: which signal stopped the run, after which step, and how to continue it."""
    from lrl.stopping import signal_name

    name = signal_name(result.stopped_by)
    if not result.steps:
        print(
            f"{train_program()}: stopped by {name} before the first step; nothing was trained yet",
            file=sys.stderr,
        )
        return 128 + result.stopped_by
    command = resume_command(run, argv)
    if command is not None:
        hint = f"continue with: {command}"
    else:
        hint = "no checkpoint was written (checkpoints are off: --checkpoint-every N keeps them)"
    print(f"{train_program()}: stopped by {name} after step {result.steps}; {hint}", file=sys.stderr)
    return 128 + result.stopped_by


if __name__ == "__main__":
    sys.exit(main())
