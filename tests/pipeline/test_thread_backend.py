"""Rollout workers as threads of the trainer's process (``--rollout-backend thread``) give the guarantees the other
backends give: no trained token staler than the bound, a SIGKILL and ``--resume last`` that lose and repeat
nothing, and a deterministic run equal, curve and trained ids, to the same run on local processes (the Ray
backend's equality with local processes, on these same settings, is tests/pipeline/test_ray.py's)."""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import quick_cfg
from helpers import ROOT, Tokens, history_lines, ledger_is_lossless, merged, one_clear_line, train, wait_until
from helpers import two_worker_args as args

from lrl.run import build_run, fit

TIMING = ("time/", "pipeline/")


def without_timing(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.startswith(TIMING) and k != "run"} for h in lines]


@pytest.mark.parametrize(
    ("eta", "slots", "partial"), [(0, 8, "interrupt"), (1, 4, "interrupt"), (2, 16, "drain")]
)
def test_no_trained_token_is_staler_than_the_bound_on_threads(format_policy, eta, slots, partial):
    tokens = Tokens()
    cfg = quick_cfg(
        pipeline="async",
        rollout_backend="thread",
        rollout_workers=2,
        max_steps=5,
        max_staleness=eta,
        slots=slots,
        partial_rollouts=partial,
        tool_latency="lognormal:0.02:1.0",
        eval_at_start=False,
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    assert tokens.staleness and max(tokens.staleness) <= eta
    ledger_is_lossless(run.module.history)


DETERMINISTIC = ["--deterministic", "true", "--max-staleness", "1", "--max-steps", "4"]


@pytest.mark.slow  # 26 s on 2 cores: out of the default run (pytest -m slow)
def test_a_deterministic_run_on_threads_equals_the_one_on_processes(model_dir, tmp_path):
    histories = {}
    for backend in ("local", "thread"):
        history = tmp_path / f"{backend}.jsonl"
        extra = [*DETERMINISTIC, "--rollout-backend", backend, "--history-file", str(history)]
        one_clear_line(train(*args(model_dir, tmp_path / backend, *extra)), 0)
        histories[backend] = history_lines(history)
    local, thread = histories["local"], histories["thread"]
    assert [h["trained_ids"] for h in thread] == [h["trained_ids"] for h in local]
    assert without_timing(thread) == without_timing(local)
    assert max(h["staleness/token_max"] for h in thread) == 1  # concurrent and stale, yet the same


@pytest.mark.slow  # 17.5 s on a 2-core EPYC without AVX-512; the default run keeps a SIGKILL-resume of its own
# (tests/pipeline/test_async_reliability.py), on processes
def test_sigkill_then_resume_on_threads_is_lossless_and_equals_the_uninterrupted_run(model_dir, tmp_path):
    steps = 8
    extra = [
        *DETERMINISTIC,
        "--max-steps",
        str(steps),
        "--rollout-backend",
        "thread",
        "--checkpoint-every",
        "1",
    ]
    extra += ["--slots", "4", "--tool-latency", "lognormal:0.05:1.0"]  # a kill that lands in a tool wait
    whole = tmp_path / "whole.jsonl"
    one_clear_line(train(*args(model_dir, tmp_path / "whole", *extra, "--history-file", str(whole))), 0)
    history = tmp_path / "h.jsonl"
    common = args(model_dir, tmp_path / "runs", *extra, "--history-file", str(history), "--resume", "last")
    killed = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *common],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: len(history_lines(history)) >= 3 or killed.poll() is not None, 300, "three steps")
    time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)  # the trainer itself: its worker threads die with it
    assert killed.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    before = history_lines(history)
    assert 0 < len(before) < steps
    done = train(*common)
    one_clear_line(done, 0)
    assert "resumed from step" in done.stdout, done.stdout
    after = history_lines(history)[len(before) :]
    assert after[0]["step"] > 0  # it continued from the checkpoint, not from scratch
    merged_history = merged([before, after])
    assert [h["step"] for h in merged_history] == list(range(steps))
    trained, _ = ledger_is_lossless(merged_history)
    assert trained > 0
    assert without_timing(merged_history) == without_timing(history_lines(whole))


def test_a_worker_thread_that_raises_is_one_line_naming_it(monkeypatch):
    from lrl.errors import WorkerError

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "plugins"))
    monkeypatch.setenv("LRL_CRASH_AFTER", "12")  # resets counted in the process: the workers reach it first
    cfg = quick_cfg(
        pipeline="async",
        rollout_backend="thread",
        plugins=["crashing_env"],
        env="crashing",
        max_steps=20,
        eval_at_start=False,
    )
    run = build_run(cfg, callbacks=[], logger=False)
    with pytest.raises(
        WorkerError, match=r"rollout worker 0 \(thread\) failed: RuntimeError: the environment"
    ):
        fit(run)


def test_a_worker_process_computes_on_the_threads_it_is_given(monkeypatch):
    """A worker in a process of its own takes --worker-threads; in the trainer's process it leaves the trainer's."""
    import os
    import queue
    from types import SimpleNamespace

    import torch
    from conftest import quick_cfg

    from lrl.envs import make_env, run_tokenizer
    from lrl.pipeline.messages import Setup
    from lrl.pipeline.worker.shell import Worker
    from lrl.policy import make_policy

    cfg = quick_cfg(pipeline="async", rollout_workers=1, worker_threads=3)
    policy = make_policy(make_env(cfg, run_tokenizer(cfg.policy)).tok)
    board = SimpleNamespace(read_newest=lambda shadow, version: None)  # nothing published yet
    setup = Setup(cfg, 0, 1, board, type(policy), policy.config, None, shadow=policy)
    asked = []  # the process-wide thread count is not changed by the test: the calls are recorded instead
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    Worker(None, 0, setup, queue.Queue(), queue.Queue())  # a thread of the trainer's process
    assert asked == []
    Worker(os.getpid(), 0, setup, queue.Queue(), queue.Queue())  # a process of its own (the trainer's pid given)
    assert asked == [3]
