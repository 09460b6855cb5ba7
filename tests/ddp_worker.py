"""A tiny DDP training run for tests/runs/test_ddp.py: python tests/ddp_worker.py OUT MODEL STEPS DEVICES.

Lightning's DDP launcher starts the other ranks by running this same command line again. Every rank writes,
after each step, ``OUT/rank{r}-step{k}.pt`` (its local batch, its flattened weights and its history record),
and at the end ``OUT/logged-rank{r}.json``: what the Lightning logger received on that rank.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import Logger

warnings.filterwarnings("ignore")


class MemoryLogger(Logger):
    """Keeps the metrics Lightning logs; written to a JSON file per rank at the end."""

    def __init__(self, out: Path):
        super().__init__()
        self.out, self.rows, self.trainer = out, [], None

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append({"step": step, **{k: float(v) for k, v in metrics.items()}})

    def finalize(self, status):
        (self.out / f"logged-rank{self.trainer.global_rank}.json").write_text(json.dumps(self.rows))


class Dump(L.Callback):
    def __init__(self, out: Path):
        self.out = out

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        weights = torch.cat([p.detach().flatten().cpu() for p in module.policy.parameters()])
        step = module.last_step
        record = {"batch": step.batch, "weights": weights, "history": module.history[-1]}
        torch.save(record, self.out / f"rank{trainer.global_rank}-step{step.version}.pt")


def config(steps: int, devices: int, **kw):
    from lrl.config import Config

    base = dict(
        max_steps=steps,
        tasks_per_step=4,
        episodes_per_task=4,
        minibatches=2,
        eval_every=1000,
        eval_episodes=1,
        progress=False,
        threads=1,
        devices=devices,
        log_dir="/tmp/lrl-test-runs",
    )
    return Config(**{**base, **kw})


def main(out: str, model: str, steps: str, devices: str) -> None:
    from lrl.policy import load_policy
    from lrl.run import build_run

    out_dir = Path(out)
    cfg = config(int(steps), int(devices), strategy="ddp" if int(devices) > 1 else "auto")
    logger = MemoryLogger(out_dir)
    run = build_run(
        cfg, callbacks=[Dump(out_dir)], logger=logger, policy=load_policy(model)[0], limit_val_batches=0
    )
    logger.trainer = run.trainer
    run.trainer.fit(run.module, run.datamodule)


if __name__ == "__main__":
    main(*sys.argv[1:5])
