"""The stability controls: the jump monitor on a constructed destructive step, the update guard that takes
such a step back, the KL early stop of the minibatch updates, and the learning-rate schedule."""

from __future__ import annotations

import copy
import math
import warnings

import lightning as L
import pytest
import torch
from conftest import quick_cfg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lrl.callbacks import JumpMonitor
from lrl.callbacks.jumps import binomial_tail, pooled_rate
from lrl.run import build_run, fit
from lrl.update import learning_rate

BAD_STEP = 6
LR = 3e-4  # ordinary steps: step_kl below 0.08 for format policies of seeds 0-4 (the guard's limit is 0.2)
SABOTAGE = 1000  # the destructive step's learning-rate factor: step_kl 3.5-8.5 on the same seeds


class Sabotage(L.Callback):
    """Makes step BAD_STEP destructive: its updates run at a learning rate SABOTAGE times the configured one."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.version == BAD_STEP:
            self.lr, pl_module.cfg.lr = pl_module.cfg.lr, pl_module.cfg.lr * SABOTAGE

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.version == BAD_STEP + 1:
            pl_module.cfg.lr = self.lr


class Weights(L.Callback):
    def __init__(self):
        self.after = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[pl_module.last_step.version] = [p.detach().clone() for p in pl_module.policy.parameters()]


def run(format_policy, tmp_path=None, **kw):
    kw.setdefault("max_step_kl", None)  # the monitor's test watches the destructive step happen
    cfg = quick_cfg(max_steps=BAD_STEP + 3, tasks_per_step=8, episodes_per_task=8, lr=LR, **kw)
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
    with pytest.warns(UserWarning) as warned:
        fit(r)
    texts = [str(w.message) for w in warned if "JumpMonitor" in str(w.message)]
    assert any(t.startswith(f"JumpMonitor: at step {BAD_STEP} the KL") for t in texts), texts
    # the policy it left behind answers malformed: the next batch's malformed rate is the second event
    assert any(t.startswith(f"JumpMonitor: at step {BAD_STEP + 1} the malformed") for t in texts), texts
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
    rates = [learning_rate(cfg.update, v, cfg.max_steps) for v in range(11)]
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == pytest.approx(1e-4)
    assert rates[5] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert learning_rate(quick_cfg(lr=1e-3, lr_schedule="constant").update, 7, 40) == 1e-3


# -- the jump monitor's tests, on fed metrics -------------------------------------------------------------
def feed(monitor: JumpMonitor, steps: list[dict], episodes: int = 64) -> list[dict]:
    """Hand each step's metrics to the monitor as a module would publish them -> the warned events."""
    from types import SimpleNamespace

    trainer = SimpleNamespace(loggers=[], world_size=1)
    for version, metrics in enumerate(steps):
        record = SimpleNamespace(
            version=version, metrics=metrics, batch={"env_failure": torch.zeros(episodes)}
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            monitor.on_train_batch_end(trainer, SimpleNamespace(last_step=record), None, None, 0)
    return monitor.events


def test_the_binomial_tail_is_the_hand_computed_sum():
    assert binomial_tail(2, 3, 0.5) == pytest.approx(0.5)  # (3 + 1) / 8
    assert binomial_tail(3, 3, 0.5) == pytest.approx(0.125)
    assert binomial_tail(0, 64, 0.1) == 1.0 and binomial_tail(65, 64, 0.1) == 0.0
    assert binomial_tail(7, 64, 0.04) == pytest.approx(0.01387, abs=1e-5)  # 0.109 or more at a rate of 0.04
    assert pooled_rate([(0, 64)] * 10) == pytest.approx(1 / 642)


def test_binomial_noise_of_the_malformed_rate_is_not_a_jump():
    gen = torch.Generator().manual_seed(0)
    counts = torch.binomial(torch.full((2000,), 64.0), torch.full((2000,), 0.05), generator=gen)
    steps = [{"train/invalid": c.item() / 64} for c in counts]
    assert max(s["train/invalid"] for s in steps) > 0.15  # a 64-episode batch does show such steps
    assert feed(JumpMonitor(), steps) == []


def test_a_real_jump_of_the_malformed_rate_warns_once():
    steps = [{"train/invalid": v} for v in (0.03, 0.05, 0.02, 0.03, 0.06, 0.03, 0.45, 0.7, 0.8, 0.05)]
    events = feed(JumpMonitor(), steps)
    assert [(e["step"], e["key"]) for e in events] == [(7, "train/invalid")]  # 0.45 is what learning shows


def test_nothing_warns_before_min_history_steps():
    steps = [{"train/step_kl": v, "train/invalid": i} for v, i in ((0.01, 0.0), (1.0, 0.9), (0.01, 0.0))]
    assert feed(JumpMonitor(min_history=2), steps) == []
    late = [{"train/step_kl": 0.01}] * 2 + [{"train/step_kl": 1.0}]
    assert [e["step"] for e in feed(JumpMonitor(min_history=2), late)] == [2]


def test_a_step_the_update_guard_took_back_is_not_a_kl_jump():
    steps = [{"train/step_kl": 0.01}] * 6 + [{"train/step_kl": 1.0, "train/reverted": 1.0}]
    monitor = JumpMonitor()
    assert feed(monitor, steps) == [] and monitor.kl_recent == [0.01] * 6


def test_warmup_ramps_the_first_steps_then_follows_the_schedule():
    cfg = quick_cfg(max_steps=11, lr=1e-3, lr_schedule="constant", lr_warmup=3)
    assert [learning_rate(cfg.update, v, 11) for v in range(5)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    cosine = quick_cfg(max_steps=11, lr=1e-3, lr_schedule="cosine", lr_final=0.1, lr_warmup=1)
    plain = cosine.replace(lr_warmup=0)
    assert learning_rate(cosine.update, 0, 11) == pytest.approx(0.5 * learning_rate(plain.update, 0, 11))
    assert learning_rate(cosine.update, 5, 11) == learning_rate(plain.update, 5, 11)


def test_the_entropy_bonus_keeps_the_policy_less_certain(format_policy):
    entropies = {}
    for coef in (0.0, 0.5):
        cfg = quick_cfg(max_steps=4, tasks_per_step=8, episodes_per_task=8, lr=3e-3, entropy_coef=coef)
        r = build_run(cfg, callbacks=[], logger=False, policy=copy.deepcopy(format_policy))
        fit(r)
        entropies[coef] = [h["train/entropy"] for h in r.module.history if "train/entropy" in h][-1]
    assert entropies[0.5] > entropies[0.0] + 0.05, entropies


def test_adam_beta1_reaches_the_optimizer(format_policy):
    r = build_run(quick_cfg(adam_beta1=0.5), callbacks=[], logger=False, policy=copy.deepcopy(format_policy))
    assert r.module.configure_optimizers().defaults["betas"] == (0.5, 0.999)
