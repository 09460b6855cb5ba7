"""Train an agent with RL from a behavior sampler: TinyAgent by default, any registered environment, any local
transformers causal LM.

    python train.py                                   # on-policy, 40 steps, from the RL base
    python train.py --sampler lagged --lag 4          # sample with weights 4 updates old
    python train.py --config configs/fp8.yaml --lr 1e-3
    python train.py --checkpoint-every 5 --resume last  # checkpoints; continues the newest run if there is one
    python train.py --devices 2 --strategy ddp          # two processes (gloo on CPU), the batch split over them

Exit status: 0 done; 2 bad input (one line says which); 3 stopped by a numerical guard or the strict health
check; 4 every step was skipped (nothing could be learned); 5 a rollout worker or an inference engine failed, died or
hung (one line names it; the last checkpoint is intact); 130 / 143 stopped by Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import logging
import re
import shlex
import signal
import sys
import time

NOTHING_LEARNED = 4
WORKER_FAILED = 5
# terminal escape sequences (colours, cursor moves) that a library's message may carry: CSI, OSC, and 2-byte ones
ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")


def one_line(err: Exception) -> str:
    """An error's message on one line and as plain text (library messages can carry newlines and colours)."""
    return " ".join(ESCAPES.sub("", str(err)).split())


def main(argv: list[str] | None = None) -> int:
    start = time.time()
    argv = sys.argv[1:] if argv is None else argv
    from lrl.arguments import parse_args
    from lrl.config import ConfigError

    try:
        cfg = parse_args(argv)
    except ConfigError as err:
        print(f"train.py: error: {one_line(err)}", file=sys.stderr)
        return 2
    # Lightning's info lines (accelerators found, tips) are not what a user of train.py needs
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    from callbacks.health import HealthCheckError
    from lrl.pipeline.local import WorkerError
    from lrl.run import build_run, fit
    from lrl.update import NumericalError
    from samplers.vllm import EngineError

    try:
        run = build_run(cfg)
    except ConfigError as err:
        print(f"train.py: error: {one_line(err)}", file=sys.stderr)
        return 2
    if run.folder is not None and run.trainer.is_global_zero:
        print(f"train.py: {run.folder.note}", flush=True)
    try:
        result = fit(run)
    except (NumericalError, HealthCheckError) as err:
        print(f"train.py: stopped: {one_line(err)}", file=sys.stderr)
        return 3
    except (WorkerError, EngineError) as err:
        print(f"train.py: stopped: {one_line(err)}", file=sys.stderr)
        return WORKER_FAILED
    if not run.trainer.is_global_zero:
        return 0
    if result["stopped_by"] is not None:
        return interrupted(result, run, argv)
    counts = "".join(f" | {m} {result[m]:.2f}" for m in run.spec.metrics)
    skipped = f" ({result['skipped']} skipped: no advantage signal)" if result["skipped"] else ""
    print(
        f"held-out pass rate {result['pass_rate']:.3f} over {result['episodes']} episodes "
        f"({cfg.eval_episodes} per task){counts} | invalid {result['invalid']:.3f} | env {cfg.env} | "
        f"sampler {cfg.sampler} lag {cfg.lag} correction {cfg.correction} | {result['steps']} steps{skipped} | "
        f"{time.time() - start:.1f} s | logs in {run.trainer.logger.log_dir if run.trainer.logger else '-'}"
    )
    if result["steps"] and result["skipped"] == result["steps"]:
        print(
            f"train.py: nothing was learned: all {result['steps']} steps were skipped, because no group of "
            f"episodes had any variance in reward (every episode of a task scored the same). Look at "
            f"train/reward and train/invalid: a temperature, failure rate or group size "
            f"(--episodes-per-task) that leaves no contrast between episodes is the usual cause.",
            file=sys.stderr,
        )
        return NOTHING_LEARNED
    return 0


def interrupted(result: dict, run, argv: list[str]) -> int:
    """One line: which signal stopped the run, after which step, and how to continue it."""
    name = signal.Signals(result["stopped_by"]).name
    kept = list(argv)
    if "--resume" in kept:
        i = kept.index("--resume")
        del kept[i : i + 2]
    where = run.folder.path if run.folder is not None else None
    if not result["steps"]:
        hint = "nothing was trained yet"
    elif run.cfg.checkpoint_every > 0 and where is not None:
        hint = f"continue with: python train.py {shlex.join([*kept, '--resume', str(where)])}"
    else:
        hint = "no checkpoint was written (checkpoints are off: --checkpoint-every N keeps them)"
    print(f"train.py: stopped by {name} after step {result['steps']}; {hint}", file=sys.stderr)
    return 128 + result["stopped_by"]


if __name__ == "__main__":
    sys.exit(main())
