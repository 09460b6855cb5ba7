"""The mismatch of a live run split into its causes (callbacks/mismatch_split.py), on SmolLM2's two-layer copy:
each part is zero where its cause is absent, and the parts add up to the total."""

from __future__ import annotations

import pytest
from test_real_model import PLUGINS, real_cfg

from lrl.callbacks.mismatch_split import MismatchSplit
from lrl.run import build_run, fit


@pytest.fixture
def coin(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def split_run(model, **kw):
    split = MismatchSplit(every=1, rows=4)
    run = build_run(real_cfg(model, **kw), logger=False, callbacks=[split])
    fit(run)
    return run.module.history


@pytest.mark.early
def test_on_policy_in_fp32_has_no_staleness_and_no_quantization_part(smollm2_cut, coin):
    history = split_run(smollm2_cut, max_steps=2)
    for h in history:
        assert abs(h["mismatch/part/staleness_abs"]) < 1e-6 and abs(h["mismatch/part/quantization_abs"]) < 1e-6
        assert h["mismatch/part/total_abs"] < 1e-4  # the fp32 KV cache against the fp32 trainer
        parts = sum(h[f"mismatch/part/{p}"] for p in ("staleness", "quantization", "engine", "rest"))
        assert parts == pytest.approx(h["mismatch/part/total"], abs=1e-6)


@pytest.mark.early
def test_a_lagged_fp8_run_splits_into_staleness_and_quantization(smollm2_cut, coin):
    # step 1 samples one update behind; four episodes a step already give every part its size and sign
    history = split_run(smollm2_cut, sampler="fp8", lag=1, max_steps=2, lr=1e-3, episodes_per_task=2)
    late = history[-1]
    assert len(history) == 2 and late["staleness/token_max"] == 1
    assert late["mismatch/part/staleness_abs"] > 1e-4  # the weights one update old
    assert late["mismatch/part/quantization_abs"] > 1e-3  # FP8 rounding of a trained model
    parts = sum(late[f"mismatch/part/{p}"] for p in ("staleness", "quantization", "engine", "rest"))
    assert parts == pytest.approx(late["mismatch/part/total"], abs=1e-5)
    assert late["mismatch/part/explained"] > 0.9  # the causes carry the total; the rest is numerical noise
    assert history[0]["mismatch/part/staleness_abs"] == 0.0  # step 0 samples with the trainer's own weights


@pytest.mark.slow  # 20-30 s on 2 cores (a CPU's fp16 backward): out of the default run, which checks the split's sums
def test_the_split_of_an_fp16_run_is_given_its_arithmetic(smollm2_cut, coin):
    """precision fp16: the trainer and the KV-cache decode both compute under fp16 autocast, so the decode path's
    part is fp16's own gap (not bf16's, not zero), and the parts still add up to the total. One step of four episodes:
    a CPU's fp16 backward is slow (most of the test's time), and one step shows the arithmetic."""
    history = split_run(smollm2_cut, precision="fp16", max_steps=1, episodes_per_task=2)
    assert len(history) == 1
    for h in history:
        assert abs(h["mismatch/part/staleness_abs"]) < 1e-6 and abs(h["mismatch/part/quantization_abs"]) < 1e-6
        assert h["mismatch/part/engine_abs"] > 1e-5  # fp16's decode path against fp16's full forward
        parts = sum(h[f"mismatch/part/{p}"] for p in ("staleness", "quantization", "engine", "rest"))
        assert parts == pytest.approx(h["mismatch/part/total"], abs=1e-6)
