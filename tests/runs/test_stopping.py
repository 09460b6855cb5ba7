"""A signal in the middle of a long step: the run says at once that it stops at the end of the step and how to stop
it now; a second signal stops it now, with one line saying what was kept and how to continue; no library's own
lines on the way. (Signals before the first step and between steps: tests/runs/test_reliability.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAST, ROOT, wait_until

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def started():
    """The runs a test started; any still alive when it ends (a failed assertion) is killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(started, tmp_path, model_dir, seconds: float) -> tuple[subprocess.Popen, Path, Path]:
    """A run whose second step lasts `seconds`, with a checkpoint every step -> (process, its stderr, the file
    touched when the long step starts)."""
    marker, err = tmp_path / "long-step-started", tmp_path / "stderr.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT)]),
        "LRL_TEST_STEP_FILE": str(marker),
        "LRL_TEST_STEP_SECONDS": str(seconds),
    }
    args = [*FAST, "--max-steps", "4", "--model", str(model_dir), "--log-dir", str(tmp_path / "runs")]
    args += ["--checkpoint-every", "1", "--plugins", "long_step", "--callbacks", "long_step"]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    started.append(proc)
    wait_until(lambda: marker.exists() or proc.poll() is not None, 120, "the long step")
    assert proc.poll() is None, err.read_text()[-2000:]
    return proc, err, marker


def lines(err: Path) -> list[str]:
    return [line for line in err.read_text().splitlines() if line.strip()]


@pytest.mark.early
@pytest.mark.parametrize("signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_in_a_long_step_is_answered_at_once_and_the_step_ends_with_a_checkpoint(
    started, tmp_path, model_dir, signum
):
    proc, err, _ = start(started, tmp_path, model_dir, seconds=4)
    proc.send_signal(signum)
    name = signal.Signals(signum).name
    notice = wait_until(lambda: lines(err), 3, "the notice of the stop")  # the step has seconds left
    assert len(notice) == 1 and "end of the current step" in notice[0] and "again" in notice[0], notice
    assert proc.wait(timeout=120) == 128 + signum, err.read_text()[-2000:]
    out = lines(err)
    assert len(out) == 2 and f"stopped by {name} after step 2" in out[1] and "--resume" in out[1], out
    assert "weights_only" not in err.read_text()


@pytest.mark.early
def test_a_second_signal_stops_the_step_now_and_says_what_was_kept(started, tmp_path, model_dir):
    proc, err, _ = start(started, tmp_path, model_dir, seconds=600)
    proc.send_signal(signal.SIGINT)
    wait_until(lambda: lines(err), 3, "the notice of the stop")
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    assert code in (-signal.SIGINT, 128 + signal.SIGINT), (code, err.read_text()[-2000:])
    out = lines(err)
    assert len(out) == 2, out
    now = out[1]
    assert "stopped by SIGINT" in now and "step 1" in now and "last.ckpt" in now, now
    assert "continue with:" in now and "--resume" in now, now
    assert "Traceback" not in err.read_text()
