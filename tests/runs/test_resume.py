"""Exact resume: a run killed with SIGKILL and resumed from its last checkpoint equals an uninterrupted run."""

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lrl.checkpoint import AtomicCheckpointIO, read_history
from lrl.policy import save_policy

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def train_cmd(tmp: Path, history: str, *extra: str) -> list[str]:
    # a lagged sampler with TIS and injected env failures: the sampler's kept versions, the env generator and
    # the carried tasks must all come back from the checkpoint for the curves to match
    return [
        sys.executable,
        "train.py",
        "--model",
        str(tmp / "policy"),
        "--max-steps",
        str(STEPS),
        "--threads",
        "1",
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
        "--progress",
        "false",
        "--log-dir",
        str(tmp / "logs"),
        "--sampler",
        "lagged",
        "--lag",
        "2",
        "--correction",
        "tis",
        "--env-failure-rate",
        "0.1",
        "--history-file",
        str(tmp / history),
        *extra,
    ]


def final_line(stdout: str) -> str:
    """The held-out result of the final policy, without the timing."""
    match = re.search(r"held-out pass rate .*? invalid [0-9.]+", stdout)
    assert match, stdout[-2000:]
    return match.group(0)


def without_times(history: list[dict]) -> list[dict]:
    """The per-step metrics without wall times and without the run folder each line names."""
    return [{k: v for k, v in h.items() if not k.startswith("time/") and k != "run"} for h in history]


@pytest.mark.slow  # 44 s on 2 cores: out of the default run (pytest -m slow)
def test_sigkill_then_resume_gives_the_uninterrupted_curves(tmp_path, tok, format_policy):
    save_policy(format_policy, tok, tmp_path / "policy")
    ckpt = ["--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "ckpt")]
    whole = subprocess.Popen(
        train_cmd(tmp_path, "whole.jsonl"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    killed = subprocess.Popen(
        train_cmd(tmp_path, "resumed.jsonl", *ckpt),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    history, deadline = tmp_path / "resumed.jsonl", time.time() + 300
    while time.time() < deadline and killed.poll() is None:
        if history.exists() and len(history.read_text().splitlines()) >= 3:  # checkpoint at step 2 is written
            break
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL  # killed mid-run, not a clean exit
    done_before_kill = len(read_history(history))
    assert 3 <= done_before_kill < STEPS
    resumed = subprocess.run(
        train_cmd(tmp_path, "resumed.jsonl", *ckpt, "--resume", "last"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole_out, _ = whole.communicate(timeout=600)
    assert whole.returncode == 0

    a, b = read_history(tmp_path / "whole.jsonl"), read_history(history)
    assert [h["batch"] for h in b] == list(range(STEPS))  # lines past the checkpoint were dropped and redone
    assert sum(h.get("env/failures", 0) for h in a) > 0  # failures (and carried tasks) happened on the way
    assert without_times(a) == without_times(
        b
    )  # every reward, loss, weight and failure statistic, bit for bit
    assert final_line(whole_out) == final_line(resumed.stdout)  # the same final policy on the held-out tasks


def test_checkpoint_write_is_atomic(tmp_path):
    """A write that dies half-way leaves the previous checkpoint intact and no temporary file behind."""
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(1000), "boom": Boom()}, path)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_resume_refuses_other_settings_and_bad_files(tmp_path, tok, format_policy):
    from conftest import quick_cfg

    from lrl.config import ConfigError
    from lrl.run import build_run, fit

    cfg = dict(max_steps=2, checkpoint_every=1, checkpoint_dir=str(tmp_path / "ck"), threads=1)
    fit(build_run(quick_cfg(**cfg), logger=False, policy=copy.deepcopy(format_policy)))
    last = str(tmp_path / "ck" / "last.ckpt")
    with pytest.raises(ConfigError, match=r"lr: 0.001 -> 0.002"):
        build_run(quick_cfg(**cfg, resume=last, lr=2e-3), logger=False, policy=format_policy)
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(
        ConfigError, match="cannot be read as an lrl checkpoint: it is not a torch checkpoint"
    ):
        build_run(quick_cfg(**cfg, resume=str(tmp_path / "junk.ckpt")), logger=False, policy=format_policy)
    with pytest.raises(ConfigError, match="does not exist"):
        build_run(quick_cfg(**cfg, resume=str(tmp_path / "missing.ckpt")), logger=False, policy=format_policy)
    fresh = build_run(
        quick_cfg(**{**cfg, "checkpoint_dir": str(tmp_path / "empty")}, resume="last"),
        logger=False,
        policy=format_policy,
    )
    assert fresh.ckpt_path is None  # 'last' with no checkpoint yet: a new run
