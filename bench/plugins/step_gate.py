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


class Gate:
    """A worker's side of the turn-taking, over a connection to the bench: say "ready" and wait for "go" before a
    step, report the step's seconds and what is known of it after it (bench_recipe_speed.py, bench_vs_trl.py)."""

    def __init__(self, conn):
        self.conn = conn
        self.start = 0.0
        self.info: dict = {}  # what the step adds as it goes (bench_vs_trl's reward function)

    def begin(self) -> None:
        self.conn.send(("ready",))
        if self.conn.recv() != "go":
            raise SystemExit(0)
        self.info = {}
        self.start = time.perf_counter()

    def end(self, **info) -> None:
        self.conn.send(("done", time.perf_counter() - self.start, {**self.info, **info}))


class StepGate(L.Callback):
    def __init__(self, address: str):
        self.gate = Gate(Client(address, family="AF_UNIX"))

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.gate.begin()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.gate.end(**{k: v for k, v in module.history[-1].items() if isinstance(v, (int, float))})


@CALLBACKS.register("step_gate")
def step_gate(cfg):
    """take turns with another run, step by step, as the bench on LRL_STEP_GATE says"""
    return StepGate(os.environ["LRL_STEP_GATE"])
