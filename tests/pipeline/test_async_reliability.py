"""The asynchronous pipeline's guarantees in use: a checkpoint resumes from its own step, a run killed at any
moment loses and repeats no episode, no process outlives the run, a hung or killed worker ends the run in
seconds with one line, and signals to the whole process group stop it cleanly with a checkpoint."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    ROOT,
    history_lines,
    ledger_is_lossless,
    marked_env,
    merged,
    one_clear_line,
    processes_of,
    rollout_workers,
    train,
    wait_until,
)

TIMING = ("time/", "pipeline/trainer_wait", "pipeline/worker_idle", "pipeline/episodes_per_s")
TIMING += ("pipeline/queue_depth", "pipeline/slot_util", "pipeline/generating", "pipeline/tool_wait")
TIMING += ("pipeline/episode_seconds", "pipeline/launched_seconds", "pipeline/occ")


def async_args(model_dir: Path, logs: Path, *extra: str) -> list[str]:
    return [
        "--pipeline",
        "async",
        "--model",
        str(model_dir),
        "--tasks-per-step",
        "2",
        "--episodes-per-task",
        "4",
        "--minibatches",
        "1",
        "--eval-every",
        "1000",
        "--eval-episodes",
        "1",
        "--eval-at-start",
        "false",
        "--progress",
        "false",
        "--threads",
        "1",
        "--log-dir",
        str(logs),
        *extra,
    ]


def popen(args: list[str], env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def without_timing(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.startswith(TIMING) and k != "run"} for h in lines]


# -- 1. an async checkpoint resumes, from its own step --------------------------------------------------
@pytest.mark.slow  # 70 s on 2 cores: out of the default run (pytest -m slow)
def test_an_async_checkpoint_resumes_from_its_step_with_last_and_with_a_path(tmp_path, model_dir):
    history = tmp_path / "h.jsonl"
    args = async_args(model_dir, tmp_path / "runs", "--checkpoint-every", "1", "--history-file", str(history))
    first = train(*args, "--max-steps", "3")
    one_clear_line(first, 0)
    ckpt = tmp_path / "runs" / "lrl" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 3
    written = len(history_lines(history))
    second = train(*args, "--max-steps", "5", "--resume", "last")
    one_clear_line(second, 0)
    assert "resumed from step 3" in second.stdout, second.stdout
    rows = history_lines(history)[written:]
    assert [h["step"] for h in rows] == [3, 4]  # the second run began at the checkpoint's step
    written = len(history_lines(history))
    third = train(*args, "--max-steps", "6", "--resume", str(tmp_path / "runs" / "lrl" / "version_0"))
    one_clear_line(third, 0)
    assert "resumed from step 5" in third.stdout, third.stdout
    assert [h["step"] for h in history_lines(history)[written:]] == [5]
    whole = merged([history_lines(history)])
    assert [h["step"] for h in whole] == list(range(6))
    trained, _ = ledger_is_lossless(whole)
    assert trained > 0


def test_resume_last_over_checkpoints_that_cannot_be_read_is_an_error(tmp_path, model_dir):
    for version, junk in [(0, os.urandom(4096)), (1, b"PK\x03\x04 not really a zip")]:
        folder = tmp_path / "runs" / "lrl" / f"version_{version}" / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "last.ckpt").write_bytes(junk)
    out = train(*async_args(model_dir, tmp_path / "runs", "--max-steps", "2", "--resume", "last"))
    one_clear_line(out, 2, "version_1", "last.ckpt", "cannot be read")
    assert "started fresh" not in out.stdout + out.stderr
    assert "weights_only=False" not in out.stderr and "likely succeed" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs" / "lrl" / "version_2").exists()  # nothing new was started


# -- 2. killed at a random moment, resumed: nothing lost, nothing trained twice --------------------------
@pytest.mark.parametrize(
    "deterministic, slots, policy",
    [
        # the deterministic equality (merged history equal to an uninterrupted run's), with slots and a kill
        # during tool waits; the free-running variants check the ledger alone and run with -m slow, as do the
        # staleness policies (--stale-policy: what a kill may not lose is also what was masked or aborted)
        pytest.param(
            True, 8, "drop", marks=pytest.mark.slow
        ),  # 68 s; threads: test_thread_backend, by default
        pytest.param(False, 0, "drop", marks=pytest.mark.slow),
        pytest.param(True, 0, "drop", marks=pytest.mark.slow),
        pytest.param(False, 8, "drop", marks=pytest.mark.slow),
        *[
            pytest.param(False, 8, p, marks=pytest.mark.slow)
            for p in ("mask", "abort", "oldest-first", "cut", "ordered")
        ],
        *[
            pytest.param(True, 8, p, marks=pytest.mark.slow)
            for p in ("mask", "abort", "oldest-first", "cut", "ordered")
        ],
    ],
)
def test_sigkill_at_a_random_moment_then_resume_loses_and_repeats_nothing(
    tmp_path, model_dir, deterministic, slots, policy
):
    steps = 10
    history = tmp_path / "h.jsonl"
    extra = ["--checkpoint-every", "1", "--max-steps", str(steps), "--max-staleness", "1"]
    extra += ["--rollout-workers", "2", "--deterministic", "true" if deterministic else "false"]
    extra += ["--stale-policy", policy]
    if slots:  # episodes in flight wait on their tools most of the time: the kill lands in a tool wait
        extra += ["--slots", str(slots), "--tool-latency", "lognormal:0.05:1.0"]
    args = async_args(model_dir, tmp_path / "runs", *extra, "--history-file", str(history))
    whole = None
    if deterministic:  # the uninterrupted run to compare with, at the same time as the killed one
        whole = popen(
            async_args(model_dir, tmp_path / "whole", *extra, "--history-file", str(tmp_path / "w.jsonl"))
        )
    rng = random.Random(11 + deterministic + slots)
    env, mark = marked_env()
    killed = popen([*args, "--resume", "last"], env=env)
    target = rng.randint(1, 3)
    wait_until(lambda: len(history_lines(history)) >= target or killed.poll() is not None, 300, "steps")
    time.sleep(rng.uniform(0.0, 0.4))  # anywhere in the next step: sampling, update or checkpoint write
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    before = history_lines(history)
    assert 0 < len(before) < steps
    ckpt = tmp_path / "runs" / "lrl" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"]
    wait_until(lambda: not processes_of(mark), 10, "the killed run's processes to end")
    done = train(
        *args, "--resume", "last"
    )  # in this process: the kill is over, its imports are paid here once
    one_clear_line(done, 0)
    assert f"resumed from step {saved}" in done.stdout, done.stdout[-2000:]
    after = history_lines(history)[len(before) :]
    assert after[0]["step"] == saved > 0  # it continued from the checkpoint, not from scratch
    whole_history = merged([before, after])
    assert [h["step"] for h in whole_history] == list(range(steps))
    trained, _ = ledger_is_lossless(whole_history)
    assert trained > 0
    assert all(h["staleness/token_max"] <= 1 for h in whole_history)
    if whole is not None:
        whole.communicate(timeout=300)
        assert whole.returncode == 0
        assert without_timing(whole_history) == without_timing(history_lines(tmp_path / "w.jsonl"))


# -- 3. no process of the run outlives it -----------------------------------------------------------
@pytest.mark.slow  # 36 s on 2 cores: out of the default run (pytest -m slow)
def test_a_trainer_killed_soon_after_spawning_its_workers_leaves_no_process(tmp_path, model_dir):
    runs = []
    for delay in (0.2, 0.8, 1.5):  # three runs at once: each is killed `delay` s after its workers appear
        env, mark = marked_env()
        logs = tmp_path / f"runs{delay}"
        proc = popen(async_args(model_dir, logs, "--max-steps", "1000"), env=env)
        runs.append((delay, proc, mark))
    for delay, proc, _ in runs:
        wait_until(lambda p=proc: rollout_workers(p.pid) or p.poll() is not None, 120, "the workers")
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    time.sleep(5)
    left = {delay: processes_of(mark) for delay, _, mark in runs}
    assert not any(left.values()), left


@pytest.mark.slow  # 32 s on 2 cores: out of the default run (pytest -m slow)
def test_a_stopped_worker_ends_the_run_within_the_heartbeat_timeout(tmp_path, model_dir):
    history = tmp_path / "h.jsonl"
    args = async_args(model_dir, tmp_path / "runs", "--max-steps", "1000", "--history-file", str(history))
    env, mark = marked_env()
    proc = popen([*args, "--worker-timeout", "3"], env=env)
    wait_until(lambda: history_lines(history) or proc.poll() is not None, 120, "the first step")
    worker = rollout_workers(proc.pid)[0]
    os.kill(worker, signal.SIGSTOP)
    stopped = time.time()
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        os.kill(worker, signal.SIGCONT) if worker in processes_of(mark) else None
    took = time.time() - stopped
    assert took < 3 + 15, took  # the timeout, plus the step in progress and closing (generous: a loaded CPU)
    done = type("Done", (), {"returncode": proc.returncode, "stdout": out, "stderr": err})
    one_clear_line(done, 5, "rollout worker 0", "no heartbeat", "3")
    assert len(err.strip().splitlines()) == 1, err
    wait_until(lambda: not processes_of(mark), 10, "every process of the run to end")


@pytest.mark.early
def test_a_worker_and_a_trainer_busy_longer_than_the_heartbeat_timeout_is_no_hang(tmp_path, model_dir):
    """With --worker-timeout 1.5, in one run: a decode step of 4 s (a real model's prefill on one thread), during
    which the worker's keep-alive thread beats; and a training step 4 s long, after which the trainer reads what its
    workers said meanwhile before it judges any of them silent. The run is not stopped as hung. (One run for both:
    each is a separate path, and either one judged silent would stop it with "no heartbeat".)"""
    plugins = Path(__file__).resolve().parents[1] / "plugins"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    args = async_args(model_dir, tmp_path / "runs", "--max-steps", "3", "--worker-timeout", "1.5")
    both = ["--sampler", "slow_decode", "--callbacks", "slow_trainer"]
    proc = popen([*args, "--plugins", "slow_decode", *both], env=env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "no heartbeat" not in err


@pytest.mark.slow  # 28 s on 2 cores: out of the default run (pytest -m slow)
def test_sigterm_to_the_process_group_stops_with_a_checkpoint(tmp_path, model_dir):
    history = tmp_path / "h.jsonl"
    ckpts = tmp_path / "ck"
    extra = ["--max-steps", "1000", "--checkpoint-every", "100", "--checkpoint-dir", str(ckpts)]
    args = async_args(model_dir, tmp_path / "runs", *extra, "--history-file", str(history))
    env, mark = marked_env()
    proc = popen(args, env=env, start_new_session=True)
    wait_until(lambda: len(history_lines(history)) >= 2 or proc.poll() is not None, 120, "two steps")
    # a second run on the same checkpoint folder, while the first holds it, is refused
    second = train(
        *async_args(model_dir, tmp_path / "runs2", "--checkpoint-dir", str(ckpts), "--overwrite", "true")
    )
    one_clear_line(second, 2, "checkpoint_dir", "in use")
    os.killpg(proc.pid, signal.SIGTERM)  # what `timeout`, job schedulers and `kill -TERM -PGID` send
    out, err = proc.communicate(timeout=60)
    done = type("Done", (), {"returncode": proc.returncode, "stdout": out, "stderr": err})
    one_clear_line(done, 143, "stopped by SIGTERM after step", "continue with")
    steps = len(merged([history_lines(history)]))
    saved = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)["global_step"]
    assert saved == steps  # the last step was saved, not the last interval
    wait_until(lambda: not processes_of(mark), 10, "every process of the run to end")


@pytest.mark.slow  # 38 s on 2 cores: out of the default run (pytest -m slow)
def test_a_worker_killed_with_sigkill_is_one_line_naming_it_and_its_exit(tmp_path, model_dir):
    history = tmp_path / "h.jsonl"
    args = async_args(model_dir, tmp_path / "runs", "--max-steps", "1000", "--history-file", str(history))
    env, mark = marked_env()
    proc = popen([*args, "--rollout-workers", "2"], env=env)
    wait_until(lambda: history_lines(history) or proc.poll() is not None, 120, "the first step")
    os.kill(rollout_workers(proc.pid)[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    done = type("Done", (), {"returncode": proc.returncode, "stdout": out, "stderr": err})
    one_clear_line(done, 5, "rollout worker 1", "SIGKILL")
    assert len(err.strip().splitlines()) == 1, err
    wait_until(lambda: not processes_of(mark), 10, "every process of the run to end")


# -- 4. a bound far above the run's length ---------------------------------------------------------------
@pytest.mark.slow  # 16-37 s: a regression guard for one defect (a bound far above the run's length once hung)
def test_a_huge_staleness_bound_finishes_promptly(tmp_path, model_dir):
    shape = ["--tasks-per-step", "8", "--episodes-per-task", "8"]  # about 8,000 groups allowed at once
    history = tmp_path / "h.jsonl"
    proc = popen(
        async_args(
            model_dir,
            tmp_path / "runs",
            "--max-steps",
            "2",
            "--max-staleness",
            "1000",
            *shape,
            "--history-file",
            str(history),
        )
    )
    try:  # the hang guard: the same run takes 16-37 s on 2 cores (no wall-clock target asserted here)
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError("the run hung") from None
    assert proc.returncode == 0, err[-2000:]
    rows = history_lines(history)
    assert [h["step"] for h in rows] == [0, 1]
    # what the bound allows is not what the workers start: at the end a few batches are in flight, not thousands
    assert 0 < len(rows[-1]["unfinished_ids"]) <= 4 * 8 * 8
