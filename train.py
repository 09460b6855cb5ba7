"""Train TinyAgent (or a local transformers causal LM) with RL from a behavior sampler.

python train.py                                   # on-policy, 40 steps, from the RL base
python train.py --sampler lagged --lag 4          # sample with weights 4 updates old
python train.py --config configs/fp8.yaml --lr 1e-3
python train.py --checkpoint-every 5 --resume last  # checkpoints; continues from the last one if any
python train.py --devices 2 --strategy ddp          # two processes (gloo on CPU), the batch split over them
"""

from __future__ import annotations

import logging
import sys
import time


def main(argv: list[str] | None = None) -> int:
    start = time.time()
    from lrl.arguments import parse_args
    from lrl.config import ConfigError

    try:
        cfg = parse_args(argv)
    except ConfigError as err:
        print(f"train.py: error: {err}", file=sys.stderr)
        return 2
    # Lightning's info lines (accelerators found, tips) are not what a user of train.py needs
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    from callbacks.health import HealthCheckError
    from lrl.run import build_run, fit
    from lrl.update import NumericalError

    try:
        run = build_run(cfg)
    except ConfigError as err:
        print(f"train.py: error: {err}", file=sys.stderr)
        return 2
    try:
        result = fit(run)
    except (NumericalError, HealthCheckError) as err:
        print(f"train.py: stopped: {err}", file=sys.stderr)
        return 3
    if not run.trainer.is_global_zero:
        return 0
    counts = "".join(f" | {m} {result[m]:.2f}" for m in run.spec.metrics)
    print(
        f"held-out pass rate {result['pass_rate']:.3f} over {result['episodes']} episodes "
        f"({cfg.eval_episodes} per task){counts} | invalid {result['invalid']:.3f} | env {cfg.env} | "
        f"sampler {cfg.sampler} lag {cfg.lag} correction {cfg.correction} | {cfg.max_steps} steps | "
        f"{time.time() - start:.1f} s | logs in {run.trainer.logger.log_dir if run.trainer.logger else '-'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
