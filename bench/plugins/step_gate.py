"""A plugin for benches that run two trainings side by side and let their steps take turns (bench_recipe_speed.py).

``--plugins step_gate --callbacks step_gate`` (bench/plugins/ on PYTHONPATH) and ``LRL_STEP_GATE`` set to a Unix socket
that a bench listens on: before each training step the run says it is ready and waits until the bench says go;
after the step it reports the step's seconds (from its start, before the batch is sampled, to the end of its
update and sync) and the step's record (the module's history line). Any lrl version whose config has
``plugins`` and ``callbacks`` runs it, so a bench can time today's code against an earlier commit's.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Client

import lightning as L

from lrl.registry import CALLBACKS


class StepGate(L.Callback):
    def __init__(self, address: str):
        self.conn = Client(address, family="AF_UNIX")
        self.start = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.conn.send(("ready",))
        if self.conn.recv() != "go":
            raise SystemExit(0)
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        seconds = time.perf_counter() - self.start
        record = {k: v for k, v in module.history[-1].items() if isinstance(v, (int, float))}
        self.conn.send(("done", seconds, record))


@CALLBACKS.register("step_gate")
def step_gate(cfg):
    """take turns with another run, step by step, as the bench on LRL_STEP_GATE says"""
    return StepGate(os.environ["LRL_STEP_GATE"])
