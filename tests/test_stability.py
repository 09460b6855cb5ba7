"""The stability controls: the jump monitor on a constructed destructive step, the update guard that takes
such a step back, the KL early stop of the minibatch updates, and the learning-rate schedule."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch
from conftest import quick_cfg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import JumpMonitor
from lrl.run import build_run, fit
from lrl.update import learning_rate

BAD_STEP = 6


class Sabotage(L.Callback):
    """Makes step BAD_STEP destructive: its updates run at a learning rate 200 times the configured one."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.version == BAD_STEP:
            self.lr, pl_module.cfg.lr = pl_module.cfg.lr, pl_module.cfg.lr * 200

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.version == BAD_STEP + 1:
            pl_module.cfg.lr = self.lr


class Weights(L.Callback):
    def __init__(self):
        self.after = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[pl_module.last_step.version] = [p.detach().clone() for p in pl_module.policy.parameters()]


def run(format_policy, tmp_path=None, **kw):
    cfg = quick_cfg(max_steps=BAD_STEP + 3, tasks_per_step=8, episodes_per_task=8, **kw)
    if tmp_path is not None:
        cfg = cfg.replace(log_dir=str(tmp_path))
    monitor, weights = JumpMonitor(), Weights()
    r = build_run(
        cfg,
        callbacks=[monitor, weights, Sabotage()],
        logger=tmp_path is not None,
        policy=copy.deepcopy(format_policy),
    )
    return r, monitor, weights


def test_the_jump_monitor_flags_a_destructive_step_once(format_policy, tmp_path):
    r, monitor, _ = run(format_policy, tmp_path)
    with pytest.warns(UserWarning, match=f"JumpMonitor: at step {BAD_STEP} the KL"):
        fit(r)
    kls = [h["train/step_kl"] for h in r.module.history]
    assert kls[BAD_STEP] > 10 * max(kls[:BAD_STEP])  # the constructed step is destructive
    kl_events = [e for e in monitor.events if e["key"] == "train/step_kl"]
    assert [e["step"] for e in kl_events] == [BAD_STEP]  # once, at the step it happened
    acc = EventAccumulator(r.trainer.logger.log_dir)
    acc.Reload()
    flags = {e.step: e.value for e in acc.Scalars("monitor/jump_step_kl")}
    assert flags[BAD_STEP] == 1.0 and sum(flags.values()) >= 1.0 and flags[BAD_STEP - 1] == 0.0
    assert any(
        t.startswith("monitor/jumps") for t in acc.Tags()["tensors"]
    )  # the warning, as TensorBoard text


def test_the_update_guard_takes_the_destructive_step_back(format_policy):
    r, _, weights = run(format_policy, max_step_kl=0.2)
    fit(r)
    history = r.module.history
    assert history[BAD_STEP]["train/reverted"] == 1.0
    assert sum(h["train/reverted"] for h in history) == 1.0  # ordinary steps stay below the limit
    before, after = weights.after[BAD_STEP - 1], weights.after[BAD_STEP]
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # weights back where they were
    assert history[BAD_STEP]["train/step_kl"] > 0.2  # what the guard saw


def test_the_kl_early_stop_skips_the_remaining_minibatches(format_policy):
    cfg = quick_cfg(max_steps=4, tasks_per_step=8, episodes_per_task=8, minibatches=4, target_kl=1e-6)
    r = build_run(cfg, callbacks=[], logger=False, policy=copy.deepcopy(format_policy))
    fit(r)
    done = [h["train/minibatches_done"] for h in r.module.history if h["train/skipped"] == 0]
    assert done and all(d == 1 for d in done)  # any movement at all stops the step after its first minibatch


def test_the_cosine_schedule_runs_from_lr_to_lr_final():
    cfg = quick_cfg(max_steps=11, lr=1e-3, lr_schedule="cosine", lr_final=0.1)
    rates = [learning_rate(cfg, v) for v in range(11)]
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == pytest.approx(1e-4)
    assert rates[5] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert learning_rate(quick_cfg(lr=1e-3, lr_schedule="constant"), 7) == 1e-3
