"""The asynchronous pipeline: the staleness bound holds for every trained token, a killed run resumes without
losing or repeating an episode (checked from the history file), deterministic runs repeat exactly, a crashing
worker stops the run with a clear error, and starting and stopping workers leaves no process behind."""

from __future__ import annotations

import copy
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from conftest import quick_cfg
from helpers import Tokens

from lrl.checkpoint import read_history
from lrl.policy import save_policy
from lrl.run import build_run, fit

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = Path(__file__).resolve().parents[1] / "plugins"


def async_cfg(**kw):
    base = dict(
        pipeline="async",
        max_steps=6,
        tasks_per_step=4,
        episodes_per_task=4,
        minibatches=2,
        eval_at_start=False,
        threads=1,
    )
    return quick_cfg(**{**base, **kw})


@pytest.mark.parametrize(
    "eta, workers, partial",
    [
        (0, 1, "interrupt"),
        pytest.param(1, 2, "interrupt", marks=pytest.mark.slow),
        pytest.param(2, 1, "drain", marks=pytest.mark.slow),
    ],  # 17-33 s each
)
@pytest.mark.early
def test_no_trained_token_is_staler_than_the_bound(format_policy, eta, workers, partial):
    tokens = Tokens()
    cfg = async_cfg(max_staleness=eta, rollout_workers=workers, partial_rollouts=partial)
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    assert tokens.staleness and max(tokens.staleness) <= eta
    history = run.module.history
    trained = [i for h in history for i in h["trained_ids"]]
    assert len(trained) == len(set(trained))  # nothing trained twice
    if eta > 0:
        assert max(tokens.staleness) >= 1  # the workers ran ahead of the trainer: data really were stale
    assert all(0 <= h["pipeline/worker_idle"] <= 1 for h in history)


def ledger_is_lossless(history: list[dict], rank: str = "0") -> tuple[int, int]:
    """Every started episode trained exactly once or recorded as dropped (or unfinished at the end) ->
    (trained, dropped)."""
    trained = [i for h in history for i in h["trained_ids"]]
    dropped = [i for h in history for i in h["dropped_ids"]]
    unfinished = history[-1].get("unfinished_ids", [])
    assert len(trained) == len(set(trained)), "an episode was trained twice"
    seen = trained + dropped + unfinished
    assert len(seen) == len(set(seen)), "an episode is both trained and dropped"
    serials = sorted(int(i.split(":")[1]) for i in seen)
    assert serials == list(range(len(serials))), "an episode the stream started is missing"
    assert all(i.split(":")[0] == rank for i in seen)
    return len(trained), len(dropped)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path, tok, format_policy):
    save_policy(format_policy, tok, tmp_path / "policy")
    history = tmp_path / "h.jsonl"
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        "--pipeline",
        "async",
        "--model",
        str(tmp_path / "policy"),
        "--max-steps",
        "10",
        "--tasks-per-step",
        "4",
        "--episodes-per-task",
        "4",
        "--minibatches",
        "2",
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
        "--checkpoint-every",
        "1",
        "--max-staleness",
        "1",
        "--log-dir",
        str(tmp_path / "runs"),
        "--history-file",
        str(history),
    ]
    rng = random.Random(7)
    for _ in range(2):  # killed twice, at a random moment after a random number of steps
        proc = subprocess.Popen(
            [*args, "--resume", "last"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        lines = len(history.read_text().splitlines()) if history.exists() else 0
        target, deadline = lines + rng.randint(1, 3), time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if history.exists() and len(history.read_text().splitlines()) >= target:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))  # anywhere in the next step: sampling, update or checkpoint write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    done = subprocess.run([*args, "--resume", "last"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = read_history(history)
    assert [h["step"] for h in steps] == list(range(10))
    trained, _ = ledger_is_lossless(steps)
    assert trained > 0
    assert all(h["staleness/token_max"] <= 1 for h in steps)  # the bound held after every resume
    time.sleep(0.5)
    assert not orphans(), orphans()


def orphans() -> list[str]:
    """Rollout worker processes left running: spawned processes (their command line names the spawn entry
    point) that are this process's children or were orphaned to init."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "multiprocessing.spawn" not in cmd or int(pid) == os.getpid():
            continue
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent in (1, os.getpid()):
            found.append(f"{pid}: {cmd[:120]}")
    return found


def history_without_times(run) -> list[dict]:
    timing = (
        "time/",
        "pipeline/trainer_wait",
        "pipeline/worker_idle",
        "pipeline/episodes_per_s",
        "pipeline/queue_depth",
        "pipeline/occ",  # occupancy shares and samples: wall-clock slot-seconds
        "pipeline/slot_util",  # and the other wall-clock shares and durations
        "pipeline/generating",
        "pipeline/tool_wait",
        "pipeline/episode_seconds",
        "pipeline/launched_seconds",
    )
    return [{k: v for k, v in h.items() if not k.startswith(timing)} for h in run.module.history]


class Died(Exception):
    pass


class DieAfter(L.Callback):
    """Raise as the step after `steps` begins: its checkpoint is written, the next batch already drawn."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if len(module.history) == self.steps:
            raise Died(f"died after step {self.steps}")


@pytest.mark.slow
def test_deterministic_async_repeats_exactly(format_policy, tmp_path):
    cfg = async_cfg(
        deterministic=True, max_staleness=1, rollout_workers=2, checkpoint_every=2, log_dir=str(tmp_path)
    )
    first = build_run(cfg, callbacks=[], logger=False, policy=copy.deepcopy(format_policy))
    fit(first)
    second = build_run(
        cfg.replace(log_dir=str(tmp_path / "b")),
        callbacks=[],
        logger=False,
        policy=copy.deepcopy(format_policy),
    )
    fit(second)
    a, b = history_without_times(first), history_without_times(second)
    assert a == b and len(a) == 6
    assert max(h["staleness/token_max"] for h in a) == 1  # concurrent and stale, yet repeatable
    # a run that dies after step 4 (the same config: a shorter max_steps would change the learning-rate schedule)
    # and is resumed from its step-4 checkpoint gives the same curve
    cut = build_run(
        cfg.replace(log_dir=str(tmp_path / "c")),
        callbacks=[DieAfter(4)],
        logger=False,
        policy=copy.deepcopy(format_policy),
    )
    with pytest.raises(Died):
        fit(cut)
    assert len(cut.module.history) == 4
    resumed = build_run(
        cfg.replace(log_dir=str(tmp_path / "c"), resume="last"),
        callbacks=[],
        logger=False,
        policy=copy.deepcopy(format_policy),
    )
    fit(resumed)
    assert history_without_times(resumed) == a


@pytest.mark.slow  # 20 s on 2 cores: out of the default run (pytest -m slow)
def test_a_crashing_worker_stops_the_run_with_a_clear_error(format_policy, monkeypatch):
    from lrl.pipeline import WorkerError

    monkeypatch.syspath_prepend(str(PLUGIN))
    cfg = async_cfg(plugins=["crashing_env"], env="crashing", max_steps=50)
    run = build_run(cfg, callbacks=[], logger=False)
    start = time.time()
    with pytest.raises(WorkerError, match=r"rollout worker 0 failed: RuntimeError: the environment crashed"):
        fit(run)
    assert time.time() - start < 60
    time.sleep(0.5)
    assert not orphans(), orphans()


@pytest.mark.slow
def test_start_and_stop_cycles_leave_no_process_behind(format_policy, monkeypatch):
    from lrl.pipeline import WorkerError

    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.setenv("LRL_CRASH_AFTER", "3")
    cycles = int(os.environ.get("LRL_PIPELINE_CYCLES", "4"))
    for i in range(cycles):
        crash = i % 2 == 1
        cfg = async_cfg(
            plugins=["crashing_env"], env="crashing" if crash else "tinyagent", max_steps=2, rollout_workers=2
        )
        run = build_run(
            cfg, callbacks=[], logger=False, policy=None if crash else copy.deepcopy(format_policy)
        )
        if crash:
            with pytest.raises(WorkerError):
                fit(run)
        else:
            fit(run)
    time.sleep(0.5)
    assert not orphans(), orphans()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 10-16 s a cycle on 2 cores: past the default 600 s
def test_fifty_start_and_stop_cycles(format_policy, monkeypatch):
    monkeypatch.setenv("LRL_PIPELINE_CYCLES", "50")
    test_start_and_stop_cycles_leave_no_process_behind(format_policy, monkeypatch)


@pytest.mark.slow
def test_worker_messages_are_stopped_by_ctrl_c(tmp_path, tok, format_policy):
    save_policy(format_policy, tok, tmp_path / "policy")
    args = [
        sys.executable,
        str(ROOT / "train.py"),
        "--pipeline",
        "async",
        "--model",
        str(tmp_path / "policy"),
        "--max-steps",
        "500",
        "--tasks-per-step",
        "4",
        "--episodes-per-task",
        "4",
        "--eval-every",
        "1000",
        "--eval-at-start",
        "false",
        "--progress",
        "false",
        "--threads",
        "1",
        "--checkpoint-every",
        "100",
        "--log-dir",
        str(tmp_path / "runs"),
        "--history-file",
        str(tmp_path / "h.jsonl"),
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    history = tmp_path / "h.jsonl"
    while time.time() < deadline and not (history.exists() and history.stat().st_size):
        time.sleep(0.05)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    stopped_in = time.time() - sent
    assert proc.returncode == 130, err[-1500:]
    assert stopped_in < 8, stopped_in  # the run and its workers stop within seconds
    assert "continue with" in err
    assert (tmp_path / "runs" / "lrl" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    time.sleep(0.5)
    assert not orphans(), orphans()


@pytest.mark.slow
def test_each_ddp_rank_has_its_own_workers_and_the_history_holds_every_rank(tmp_path, tok, format_policy):
    save_policy(format_policy, tok, tmp_path / "policy")
    history = tmp_path / "h.jsonl"
    args = ["--model", str(tmp_path / "policy"), "--pipeline", "async", "--devices", "2", "--strategy", "ddp"]
    args += ["--tasks-per-step", "4", "--episodes-per-task", "4", "--max-steps", "3", "--threads", "1"]
    args += [
        "--eval-every",
        "1000",
        "--eval-at-start",
        "false",
        "--eval-episodes",
        "1",
        "--progress",
        "false",
    ]
    args += ["--log-dir", str(tmp_path / "runs"), "--history-file", str(history)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = read_history(history)
    trained = [i for h in lines for i in h["trained_ids"]]
    assert len(lines) == 3 and len(trained) == len(set(trained)) == 3 * 16  # both ranks' episodes, each once
    assert {i.split(":")[0] for i in trained} == {"0", "1"}
    assert all(sum(h["staleness_counts"]) > 0 for h in lines)
