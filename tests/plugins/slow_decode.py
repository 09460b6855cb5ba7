"""A test plugin of slow steps: the on-policy sampler, except that every 8th decode call in a process takes 4
seconds (a real model's prefill of a whole batch on one thread: a step of the worker's loop longer than
--worker-timeout); and a callback whose first call takes 4 seconds (a real model's update: the trainer away from
its workers' messages for longer than --worker-timeout)."""

from __future__ import annotations

import time

import lightning as L

from lrl import callbacks, samplers
from lrl.decoding import TrainerStyleDecoder
from lrl.samplers.base import OnPolicySampler


class SlowOnce(TrainerStyleDecoder):
    calls = 0  # per process

    def decode(self, rows):
        SlowOnce.calls += 1
        if SlowOnce.calls % 8 == 0:  # after the worker's first heartbeats, and again while the run goes on
            time.sleep(4.0)
        return super().decode(rows)


class SlowSampler(OnPolicySampler):
    def decoder(self):
        return SlowOnce(self.policy, self.tok.pad_id)


@samplers.register("slow_decode")
def slow_decode(cfg, tok):
    """on-policy, with a decode step of 4 s every 8 in each process"""
    return SlowSampler(tok, samplers.sampling(cfg))


class SlowTrainer(L.Callback):
    def __init__(self):
        self.slept = False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.slept:
            self.slept = True
            time.sleep(4.0)


@callbacks.register("slow_trainer")
def slow_trainer(cfg):
    """the first training step takes 4 s longer"""
    return SlowTrainer()
