"""The vLLM sampler on a real engine, on CPU: every weight sync is exact, lag and sync-every give the staleness
their tags say, the async pipeline keeps its bound with the engine in its workers, a killed run resumes to the
uninterrupted curves, and a model the engine refuses is one line before anything starts."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time

import lightning as L
import pytest
import torch
from conftest import quick_cfg
from helpers import ROOT, history_lines, one_clear_line, train, wait_until

from lrl.policy import make_policy, save_policy
from lrl.run import build_run, fit

pytestmark = [
    pytest.mark.vllm,  # skipped, saying how to install it, where vLLM is missing (conftest)
    pytest.mark.xdist_group("vllm"),  # one engine's tests on one worker of the parallel run
]


class Tags(L.Callback):
    """Per step: the trainer's version and the versions of the step's trained action tokens."""

    def __init__(self):
        self.rows: list[tuple[int, list[int]]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        b = module.last_step.batch
        on = b["action_mask"].bool()
        self.rows.append((module.last_step.version, sorted(b["version"][on].unique().tolist())))


def vllm_run(policy, callbacks=(), **kw):
    cfg = quick_cfg(sampler="vllm", eval_at_start=False, **kw)
    run = build_run(cfg, callbacks=list(callbacks), logger=False, policy=copy.deepcopy(policy))
    fit(run)
    return run


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow  # 62-70 s each on 2 cores: out of the default run
def test_every_sync_is_exact_in_float32(format_policy, temperature):
    run = vllm_run(format_policy, max_steps=6, temperature=temperature)
    gaps = [h["mismatch/abs_mean"] for h in run.module.history]
    assert len(gaps) == 6 and max(gaps) <= 1e-5, gaps  # the engine held the trainer's weights at every step
    assert all(h["staleness/token_max"] == 0 for h in run.module.history)
    assert run.module.history[-1]["train/action_tokens"] > 0


@pytest.mark.slow  # 15 s on 2 cores: out of the default run (pytest -m slow)
def test_lag_gives_the_tags_of_the_built_in_lagged_sampler(format_policy):
    engine, builtin = Tags(), Tags()
    vllm_run(format_policy, [engine], max_steps=5, lag=2)
    cfg = quick_cfg(sampler="lagged", lag=2, max_steps=5, eval_at_start=False)
    fit(build_run(cfg, callbacks=[builtin], logger=False, policy=copy.deepcopy(format_policy)))
    assert engine.rows == builtin.rows
    assert [versions for _, versions in engine.rows][2:] == [[0], [1], [2]]  # staleness 2 once warmed up


def test_sync_every_two_cycles_staleness_zero_one(format_policy):
    tags = Tags()
    run = vllm_run(format_policy, [tags], max_steps=3, sync_every=2)  # one whole cycle and the sync after it
    stale = [step - versions[0] for step, versions in tags.rows]
    assert all(len(versions) == 1 for _, versions in tags.rows)
    assert stale == [0, 1, 0]
    assert [h["staleness/token_max"] for h in run.module.history] == stale


@pytest.mark.slow  # 42 s on 2 cores: out of the default run (pytest -m slow)
def test_async_workers_with_the_engine_keep_the_bound(format_policy):
    tokens = []

    class Staleness(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            b = module.last_step.batch
            tokens.extend((module.last_step.version - b["version"][b["action_mask"].bool()]).tolist())

    run = vllm_run(
        format_policy,
        [Staleness()],
        pipeline="async",
        max_steps=5,
        max_staleness=1,
        slots=8,
        tool_latency="lognormal:0.02:0.5",
    )
    assert tokens and max(tokens) <= 1
    trained = [i for h in run.module.history for i in h["trained_ids"]]
    assert len(trained) == len(set(trained))
    assert all(h["mismatch/abs_mean"] < 1e-5 for h in run.module.history if h["staleness/token_max"] == 0)


@pytest.mark.slow  # 82 s on 2 cores: out of the default run (pytest -m slow)
def test_sigkill_and_resume_give_the_uninterrupted_curves(tmp_path, tok, format_policy):
    save_policy(format_policy, tok, tmp_path / "policy")
    base = [sys.executable, str(ROOT / "train.py"), "--sampler", "vllm", "--model", str(tmp_path / "policy")]
    base += ["--max-steps", "6", "--tasks-per-step", "4", "--episodes-per-task", "4", "--minibatches", "2"]
    base += [
        "--eval-every",
        "1000",
        "--eval-episodes",
        "1",
        "--eval-at-start",
        "false",
        "--progress",
        "false",
    ]
    base += ["--lag", "1", "--checkpoint-every", "1"]
    # the uninterrupted run to compare with, at the same time as the one that is killed
    whole = subprocess.Popen(
        [*base, "--log-dir", str(tmp_path / "a"), "--history-file", str(tmp_path / "a.jsonl")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        history = tmp_path / "b.jsonl"
        args = [*base, "--log-dir", str(tmp_path / "b"), "--history-file", str(history)]
        scratch = tmp_path / "tmp"  # the killed run's temporary folder, watched below
        scratch.mkdir()
        env = {**os.environ, "TMPDIR": str(scratch)}
        killed = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        wait_until(lambda: len(history_lines(history)) >= 3 or killed.poll() is not None, 300, "three steps")
        assert list(scratch.iterdir()), "the run wrote nothing under its TMPDIR"
        killed.send_signal(signal.SIGKILL)
        assert killed.wait() == -signal.SIGKILL
        wait_until(lambda: not list(scratch.iterdir()), 10, "the killed run's temporary files to be removed")
        # resumed in this process: the engine's imports and first compile are paid once per test process
        done = train(*args[2:], "--resume", "last")
        one_clear_line(done, 0)
    finally:  # never left running behind a failed assertion
        if whole.poll() is None and sys.exc_info()[0] is not None:
            whole.kill()
    _, whole_err = whole.communicate(timeout=600)
    assert whole.returncode == 0, whole_err[-2000:]

    def curves(lines):
        steps = {h["step"]: h for h in lines}
        return [
            {k: v for k, v in steps[s].items() if not k.startswith("time/") and k != "run"}
            for s in sorted(steps)
        ]

    assert curves(history_lines(history)) == curves(history_lines(tmp_path / "a.jsonl"))


def test_a_model_the_engine_refuses_is_one_line(tmp_path, tok):
    save_policy(
        make_policy(tok, num_attention_heads=4, num_key_value_heads=2, head_dim=16), tok, tmp_path / "m"
    )
    start = time.time()
    out = train(
        "--sampler",
        "vllm",
        "--model",
        str(tmp_path / "m"),
        "--max-steps",
        "2",
        "--progress",
        "false",
        "--log-dir",
        str(tmp_path / "runs"),
    )
    one_clear_line(out, 2, "head_dim 16", "vllm")
    assert len(out.stderr.strip().splitlines()) == 1 and time.time() - start < 30


def test_a_kv_cache_too_small_for_an_episode_is_refused_with_the_size_needed(tmp_path, tok):
    deep = make_policy(tok, num_hidden_layers=48, num_attention_heads=4, num_key_value_heads=4, head_dim=64)
    save_policy(deep, tok, tmp_path / "m")  # 48 layers x 4 key/value heads x 64: 96 KiB of cache a token
    out = train(
        "--sampler",
        "vllm",
        "--model",
        str(tmp_path / "m"),
        "--vllm-kv-cache",
        "1",
        "--max-steps",
        "2",
        "--progress",
        "false",
        "--log-dir",
        str(tmp_path / "runs"),
    )
    one_clear_line(out, 2, "vllm_kv_cache: 1 MiB cannot hold one episode", "--vllm-kv-cache")


def test_the_engine_log_probs_equal_the_trainers_after_many_in_place_updates(tok, spec, format_policy):
    from lrl.batch import collate
    from lrl.logprobs import token_log_probs
    from lrl.rollout import run_episodes
    from lrl.samplers import VLLMSampler

    policy = copy.deepcopy(format_policy)
    sampler = VLLMSampler(tok)
    sampler.setup(policy, 0)
    generator = torch.Generator().manual_seed(0)
    try:
        for version in range(1, 9):  # tied embeddings and LM head move with every update
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(0.02 * torch.randn_like(p))
            sampler.sync(policy, version)
            episodes = run_episodes(
                sampler.decoder(), spec, spec.train_tasks[:8], generator, sampler.sampling, version
            )
            batch = collate(episodes, tok.pad_id)
            with torch.no_grad():
                old = token_log_probs(policy, batch["ids"], batch["attention_mask"])
            on = batch["action_mask"].bool()
            assert (old - batch["sample_logp"])[on].abs().max() < 1e-4, version
    finally:
        sampler.close()


def test_an_engine_that_fails_mid_run_stops_it_with_one_line_and_the_checkpoint_intact(
    tmp_path, format_policy, monkeypatch
):
    from vllm.v1.engine.llm_engine import LLMEngine

    from lrl.samplers.vllm import EngineError

    real, calls = LLMEngine.step, []

    def failing(self):
        calls.append(1)
        if len(calls) > 40:  # well into the third step
            raise RuntimeError("the engine core died")
        return real(self)

    monkeypatch.setattr(LLMEngine, "step", failing)
    cfg = quick_cfg(
        sampler="vllm", eval_at_start=False, max_steps=20, checkpoint_every=1, log_dir=str(tmp_path)
    )
    run = build_run(cfg, callbacks=[], logger=False, policy=copy.deepcopy(format_policy))
    with pytest.raises(
        EngineError, match="the vLLM engine failed during a step: RuntimeError: the engine core"
    ):
        fit(run)
    saved = torch.load(run.folder.checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert 0 < saved["global_step"] == len(run.module.history)  # the last finished step is saved


@pytest.mark.slow  # 19 s on 2 cores (an engine of its own): out of the default run, which starts the engine elsewhere
def test_a_model_whose_context_outgrows_the_cache_starts_with_the_context_the_cache_holds(tok, spec, format_policy):
    """A chat model's context (SmolLM2: 8,192 tokens) can need more cache than --vllm-kv-cache gives, where vLLM
    refuses a context it cannot hold; the engine then starts with the longest sequence the cache holds and samples
    episodes."""
    from lrl.rollout import run_episodes
    from lrl.samplers import VLLMSampler

    policy = copy.deepcopy(format_policy)
    policy.config.max_position_embeddings = 1 << 20  # about 1 GiB of keys and values: more than 1 MiB holds
    sampler = VLLMSampler(tok, kv_cache_mib=1)
    try:
        sampler.setup(policy, 0)
        held = sampler.llm.llm_engine.model_config.max_model_len
        assert spec.max_episode_tokens <= held < 1 << 20
        episodes = run_episodes(
            sampler.decoder(), spec, spec.train_tasks[:4], torch.Generator().manual_seed(0), sampler.sampling, 0
        )
        assert len(episodes) == 4 and all(any(e.generated) for e in episodes)
    finally:
        sampler.close()
