"""The full SmolLM2-135M-Instruct (30 layers), out of the default run (pytest -m slow): the chapter's mismatch on
a trained model, and two steps of the calc recipe."""

from __future__ import annotations

import pytest

import lrl.models as models

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]  # skipped without the wheel (conftest)


@pytest.fixture(scope="module")
def smollm2():
    return models.resolve_model("smollm2-135m", verbose=False)


def test_a_trained_model_shows_the_chapters_mismatch(smollm2, tmp_path):
    import json

    from lrl_lab.tools.mismatch import main

    out = tmp_path / "m.json"
    flags = ["--new-tokens", "16", "--prompts", "12", "--ragged", "--also", "engine-fp32", "--json", str(out)]
    assert main(["--model", str(smollm2), *flags]) == 0
    res = json.loads(out.read_text())
    rows = res["comparisons"]
    assert 0.005 < rows["fp32 trainer batch 1 vs engine"]["mean"] < 0.2  # bf16 engine: the chapter's 0.025
    assert rows["fp32 trainer batch 1 vs engine fp32"]["mean"] < 1e-4
    low, high = res["bins"][0]["mean_abs"], res["bins"][-1]["mean_abs"]
    assert low > 5 * high  # it sits on the uncertain tokens


def test_two_steps_of_the_calc_recipe_train_the_full_model(smollm2):
    from lrl.arguments import parse_args
    from lrl.run import build_run, fit

    cfg = parse_args(["--env", "calc", "--max-steps", "2", "--eval-at-start", "false", "--progress", "false"])
    run = build_run(cfg, logger=False, callbacks=[])
    before = run.policy.model.norm.weight.detach().clone()
    fit(run)
    history = run.module.history
    assert len(history) == 2 and run.module.memory.chunked  # a 49k vocabulary: the head runs in chunks
    assert all(0.0 <= h["train/reward"] <= 1.0 and h["mismatch/abs_mean"] < 0.2 for h in history)
    if any(h["train/skipped"] == 0 for h in history):  # a step with a learning signal moved the weights
        assert not run.policy.model.norm.weight.equal(before)
