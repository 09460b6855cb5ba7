"""precision fp16: the loss scale that keeps float16's small gradients from flushing to zero, and fp16 runs."""

import copy

import torch
from conftest import quick_cfg

from lrl.precision import LossScale
from lrl.run import build_run, fit


def grads_of(*values):
    params = [torch.nn.Parameter(torch.zeros(len(v))) for v in values]
    for p, v in zip(params, values):
        p.grad = torch.tensor(v)
    return params


def test_the_loss_scale_divides_out_halves_on_overflow_and_grows():
    scale = LossScale(True, scale=8.0, growth_every=2)
    assert scale(torch.tensor(0.5)).item() == 4.0
    params = grads_of([8.0, -16.0], [4.0, 0.0])
    assert scale.unscale(params) and params[0].grad.tolist() == [1.0, -2.0] and scale.scale == 8.0
    assert scale.unscale(grads_of([1.0, 1.0])) and scale.scale == 16.0  # two finite in a row: doubled
    assert not scale.unscale(grads_of([float("inf"), 1.0])) and scale.scale == 8.0  # overflow: halved, retake
    one = LossScale(True, scale=1.0)
    assert one.unscale(grads_of([float("nan"), 0.0]))  # nothing left to halve: the guard will see the NaN
    off = LossScale(False, scale=8.0)
    assert off.scale == 1.0 and off(torch.tensor(3.0)).item() == 3.0 and off.unscale(grads_of([float("inf")]))


def test_an_fp16_run_trains_and_a_loss_scale_that_overflows_retakes_the_minibatch(format_policy, monkeypatch):
    import lrl.module

    made = []

    class Huge(LossScale):  # starts where any gradient overflows float16: the first minibatch must be retaken
        def __init__(self, enabled):
            super().__init__(enabled, scale=2.0**40)
            made.append(self)

    monkeypatch.setattr(lrl.module, "LossScale", Huge)
    cfg = quick_cfg(precision="fp16", max_steps=2, eval_at_start=False)
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy))
    before = [p.detach().clone() for p in run.policy.parameters()]
    fit(run)
    assert run.module.precision == "fp16" and made[0].enabled
    assert (
        made[0].scale < 2.0**40
    )  # halved until the gradients were finite, the minibatch taken again each time
    assert any(not torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))
    for h in run.module.history:
        assert torch.isfinite(torch.tensor([h["train/loss"], h["train/grad_norm"]])).all()
