"""Numerical guards: NaN/inf stops the step by name before the weights change; an all-filtered batch is skipped."""

import copy
import math

import lightning as L
import pytest
import torch
from conftest import quick_cfg

from lrl.run import build_run, fit
from lrl.update import NumericalError


class Snapshots(L.Callback):
    """The weights after every completed step."""

    def __init__(self):
        self.weights = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.weights.append([p.detach().clone() for p in module.policy.parameters()])


def corrupt_episodes(run, step: int, edit):
    """Make the sampler hand out edited episodes at the given step (0-based)."""
    sample, calls = run.sampler.sample, []

    def patched(tasks, generator, spec, **engine):
        episodes = sample(tasks, generator, spec, **engine)
        if len(calls) == step:
            edit(episodes)
        calls.append(1)
        return episodes

    run.sampler.sample = patched


def run_with(format_policy, **kw):
    snaps = Snapshots()
    run = build_run(
        quick_cfg(**{"max_steps": 3, **kw}),
        logger=False,
        policy=copy.deepcopy(format_policy),
        callbacks=[snaps],
    )
    return run, snaps


def unchanged(run, snaps) -> bool:
    return all(torch.equal(a, b) for a, b in zip(snaps.weights[-1], run.policy.parameters()))


def test_nan_in_sampler_logps_stops_the_step_by_name(format_policy):
    run, snaps = run_with(format_policy)

    def poison(episodes):
        ep = episodes[0]
        ep.logp[ep.generated.index(True)] = float("nan")

    corrupt_episodes(run, 1, poison)
    with pytest.raises(
        NumericalError, match=r"non-finite sample_logp \(log mu\) at step 1 \(batch 1\): 1 NaN/inf"
    ):
        fit(run)
    assert len(snaps.weights) == 1 and unchanged(run, snaps)  # the weights of step 0, untouched


def test_nan_loss_and_inf_gradient_stop_before_the_optimizer_step(format_policy, monkeypatch):
    run, snaps = run_with(format_policy)
    real, calls = run.module.objective.loss, []

    def nan_loss(*args):
        terms, stats = real(*args)
        calls.append(1)
        return (terms * float("nan") if len(calls) == 3 else terms), stats  # step 1, minibatch 0

    run.module.objective.loss = nan_loss  # the run's loss, as the objective built it
    with pytest.raises(NumericalError, match=r"non-finite loss at step 1 \(batch 1\), minibatch 0"):
        fit(run)
    assert unchanged(run, snaps)

    run, snaps = run_with(format_policy)
    param = next(run.policy.parameters())
    handle = param.register_hook(lambda g: g * float("inf") if len(snaps.weights) == 2 else g)
    with pytest.raises(NumericalError, match=r"non-finite gradient at step 2 \(batch 2\), minibatch 0"):
        fit(run)
    handle.remove()
    assert len(snaps.weights) == 2 and unchanged(run, snaps)


def test_all_filtered_batch_is_skipped_and_counted(format_policy):
    run, snaps = run_with(format_policy, max_steps=4)

    def same_reward(episodes):
        for ep in episodes:
            ep.reward = 1.0  # every group without variance: every advantage is 0

    corrupt_episodes(run, 2, same_reward)
    adam = []

    class Moments(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            adam.append(copy.deepcopy(trainer.optimizers[0].state_dict()["state"]))

    run.trainer.callbacks.append(Moments())
    fit(run)
    assert [h["train/skipped"] for h in run.module.history] == [0.0, 0.0, 1.0, 0.0]
    assert run.module.skipped == 1 and run.trainer.global_step == 4 == run.module.version
    assert all(torch.equal(a, b) for a, b in zip(snaps.weights[1], snaps.weights[2]))  # nothing moved ...
    for key in (
        "exp_avg",
        "exp_avg_sq",
        "step",
    ):  # ... not even Adam's moments, as a zero-gradient step would
        assert all(torch.equal(adam[1][i][key], adam[2][i][key]) for i in adam[1])
    assert float(adam[3][0]["step"]) == 3 * 2  # three real updates of two minibatches each
    skipped = run.module.history[2]
    assert skipped["train/loss"] == 0.0 and all(math.isfinite(v) for v in skipped.values())
