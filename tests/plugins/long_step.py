"""A test plugin: a callback whose second training step lasts as long as ``LRL_TEST_STEP_SECONDS`` says (a real
model's step under load: minutes), after touching the file ``LRL_TEST_STEP_FILE`` names, so that a test can send
its signals in the middle of that step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L

from lrl import callbacks


class LongStep(L.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx != 1:
            return
        Path(os.environ["LRL_TEST_STEP_FILE"]).touch()
        end = time.monotonic() + float(os.environ.get("LRL_TEST_STEP_SECONDS", "120"))
        while time.monotonic() < end:  # slices: a signal's handler runs between them
            time.sleep(0.05)


@callbacks.register("long_step")
def long_step(cfg):
    """the second training step lasts LRL_TEST_STEP_SECONDS (default 120)"""
    return LongStep()
