"""The behavior samplers: lag bookkeeping, FP8 rounding, the registry, and lag 0 == on-policy."""

import copy

import lightning as L
import pytest
import torch
from conftest import quick_cfg

from lrl.run import build_run, fit
from lrl.samplers import SAMPLERS, BehaviorSampler, make_sampler, round_fp8


class Tags(L.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        b = module.last_step.batch
        on = b["action_mask"].bool()
        self.rows.append(
            (
                module.last_step.version,
                b["version"][on].unique().tolist(),
                list(module.source.sampler.kept_versions),
            )
        )


def test_lagged_keeps_k_plus_one_versions_and_is_k_stale_after_warmup(format_policy):
    tags = Tags()
    run = build_run(
        quick_cfg(sampler="lagged", lag=3, max_steps=7),
        logger=False,
        policy=copy.deepcopy(format_policy),
        callbacks=[tags],
    )
    fit(run)
    for step, versions, kept in tags.rows:
        assert versions == [max(step - 3, 0)]  # every token of the batch from one version, `lag` behind
        assert kept == list(range(max(step + 1 - 3, 0), step + 2))  # after the sync: the last lag+1 versions
        assert len(kept) <= 4
    assert [h["staleness/token_mean"] for h in run.module.history] == [0, 1, 2, 3, 3, 3, 3]
    for _, state in run.sampler.versions:
        assert all(t.device.type == "cpu" for t in state.values())


def test_lagged_sampler_weights_are_the_old_ones(tok, format_policy):
    sampler = BehaviorSampler(tok, lag=2)
    policy = copy.deepcopy(format_policy)
    sampler.setup(policy, 0)
    first = {k: v.clone() for k, v in policy.state_dict().items()}
    for version in range(1, 4):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01)
        sampler.sync(policy, version)
    assert sampler.kept_versions == [1, 2, 3] and sampler.behavior_version == 1
    moved = {k: v + 0.01 for k, v in first.items()}
    for name, p in sampler.behavior.named_parameters():
        assert torch.allclose(p, moved[name])


def test_lag_zero_reproduces_onpolicy_step_for_step(format_policy):
    runs = {}
    for name in ("onpolicy", "lagged"):
        run = build_run(
            quick_cfg(sampler=name, lag=0, max_steps=5, seed=3),
            logger=False,
            policy=copy.deepcopy(format_policy),
        )
        fit(run)
        runs[name] = [(h["train/reward"], h["train/loss"]) for h in run.module.history]
    assert runs["onpolicy"] == runs["lagged"]
    assert len(set(r for r, _ in runs["onpolicy"])) > 1  # a real, moving run, not a constant


@pytest.mark.parametrize("scale", ["none", "tensor"])
def test_fp8_weights_are_representable_in_e4m3(scale, format_policy):
    for p in format_policy.parameters():
        r = round_fp8(p.detach(), scale)
        if scale == "none":
            assert torch.equal(r, r.to(torch.float8_e4m3fn).float())
        else:
            s = p.detach().abs().max() / 448.0
            q = r / s
            assert torch.allclose(q, q.to(torch.float8_e4m3fn).float(), rtol=1e-5, atol=1e-6)
            assert (r - p).abs().max() <= p.abs().max() * 2**-4 + 1e-12  # 3-bit mantissa: half-ulp 1/16


def test_scaled_fp8_keeps_small_weights_that_plain_cast_flushes(format_policy):
    weights = torch.cat([p.detach().flatten() for p in format_policy.parameters()])
    small = (weights != 0) & (weights.abs() < 2.0**-10)  # below e4m3's smallest subnormal / 2
    assert small.any()
    assert (round_fp8(weights, "none")[small] == 0).all()
    per_tensor = [round_fp8(p.detach(), "tensor") for p in format_policy.parameters()]
    zeros = {
        "none": sum((round_fp8(p.detach(), "none") == 0).sum().item() for p in format_policy.parameters()),
        "tensor": sum((r == 0).sum().item() for r in per_tensor),
    }
    assert zeros["tensor"] < zeros["none"]


def test_fp8_sampler_mismatch_is_small_but_nonzero(format_policy):
    run = build_run(quick_cfg(sampler="fp8", max_steps=2), logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    mismatch = run.module.history[0]["mismatch/abs_mean"]
    assert 0 < mismatch < 0.2


def test_registry_knows_the_presets_and_refuses_unknown(tok):
    assert {"onpolicy", "lagged", "fp8"} <= set(SAMPLERS)
    cfg = quick_cfg()
    cfg.sampler = "nope"  # bypass the Config check to reach the registry's own
    with pytest.raises(ValueError, match="not registered"):
        make_sampler(cfg, tok)


def test_scaled_fp8_in_float16_keeps_zeros_and_small_tensors():
    """The per-tensor scale is computed in float32: in float16 the 1e-12 floor rounds to 0 (0/0 = NaN) and a
    tensor whose absmax is below ~2.7e-5 loses its scale and rounds to all zeros."""
    zeros = torch.zeros(8, dtype=torch.float16)
    assert torch.equal(round_fp8(zeros, "tensor"), zeros)
    small = torch.tensor([1e-5, -2e-5, 5e-6, 0.0], dtype=torch.float16)
    rounded = round_fp8(small, "tensor")
    assert rounded.dtype == torch.float16 and torch.isfinite(rounded).all()
    nonzero = small != 0
    assert (rounded[nonzero] != 0).all()
    assert ((rounded.float() - small.float())[nonzero].abs() / small.float()[nonzero].abs()).max() < 0.1
    weights = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(round_fp8(weights, "tensor"), round_fp8(weights.double(), "tensor").float())
