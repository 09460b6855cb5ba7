"""What several test modules share: train.py in this process or as its own, the processes a run left behind,
the ledger check of an asynchronous run's history, and the staleness of every trained token."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
MARK = "LRL_TEST_RUN"  # an environment variable every process of a test's run inherits

FAST = [
    "--max-steps",
    "2",
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
    "--progress",
    "false",
    "--threads",
    "1",
]


class Tokens(L.Callback):
    """Every trained action token's staleness: the trainer's version minus the token's version."""

    def __init__(self):
        self.staleness: list[int] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = module.last_step
        on = step.batch["action_mask"].bool()
        self.staleness += (step.version - step.batch["version"][on]).tolist()


class Done:
    """What a train.py run returned: exit status, stdout, stderr."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def two_worker_args(model_dir: Path, logs: Path, *extra: str) -> list[str]:
    """train.py flags of a short async run with two rollout workers on `model_dir`, logging under `logs`."""
    shape = [
        "--tasks-per-step",
        "4",
        "--episodes-per-task",
        "4",
        "--minibatches",
        "1",
        "--rollout-workers",
        "2",
    ]
    quiet = [
        "--eval-every",
        "1000",
        "--eval-episodes",
        "1",
        "--eval-at-start",
        "false",
        "--progress",
        "false",
    ]
    return ["--pipeline", "async", "--model", str(model_dir), *shape, *quiet, "--log-dir", str(logs), *extra]


def in_process(main, args) -> Done:
    """A command line's `main(args)` in this process (the imports are paid once): its exit status (a SystemExit's
    code included, as argparse raises) and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except Exception:  # a traceback: the test that called this fails on it
            import traceback

            traceback.print_exc(file=err)
            code = 1
    return Done(code, out.getvalue(), err.getvalue())


def train(*args) -> Done:
    """train.py's main (lrl.train) in this process: its exit status and what it printed."""
    from lrl import train as script

    return in_process(script.main, args)


def train_process(*args, timeout=300, env=None) -> subprocess.CompletedProcess:
    """train.py as its own process (for signals, kills and concurrency)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def one_clear_line(out, code: int, *needles: str) -> None:
    """Exit status `code`, no traceback, every needle in what the run wrote to stderr."""
    assert out.returncode == code, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "\x1b[" not in out.stderr + out.stdout, "a message carries terminal colour codes"
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr[-2000:])


# -- processes ------------------------------------------------------------------------------------------
def marked_env(mark: str | None = None) -> tuple[dict, str]:
    """A copy of the environment with a fresh marker -> (env, marker): every process of the run inherits it."""
    mark = mark or uuid.uuid4().hex
    return {**os.environ, MARK: mark}, mark


def processes_of(mark: str) -> list[int]:
    """Pids of the live processes whose environment carries the marker (zombies do not count)."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(pid))
    return found


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(p))
    return out


def rollout_workers(pid: int) -> list[int]:
    """The trainer's spawned rollout workers (not multiprocessing's resource tracker)."""
    out = []
    for child in children_of(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.spawn" in cmd and b"resource_tracker" not in cmd:
            out.append(child)
    return sorted(out)


def wait_until(condition, timeout: float, what: str, poll: float = 0.02):
    """Poll `condition()` until it is truthy -> its value; fail the test after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def history_lines(path: Path) -> list[dict]:
    """Every complete JSON line of a history file, in the order written. A line still being written (no newline
    yet: the file is read while the run appends) is not one; neither is the torn line a kill left, which the
    resumed run set apart on a line of its own (lrl.checkpoint.HistoryFile) and whose step it wrote again."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")[:-1]  # the part after the last newline is unfinished
    out = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if number == len(lines) - 1 or not lines[number + 1].strip().startswith("{"):
                raise
            continue  # torn by a kill: the next line starts afresh
    return out


def merged(invocations: list[list[dict]]) -> list[dict]:
    """The history of a run made of several invocations: per step, the line of the latest one that wrote it."""
    steps: dict[int, dict] = {}
    for lines in invocations:
        for line in lines:
            steps[line["step"]] = line
    return [steps[k] for k in sorted(steps)]


def ledger_is_lossless(history: list[dict], ranks=("0",)) -> tuple[int, int]:
    """Every started episode trained exactly once or recorded as dropped (or unfinished at the end) ->
    (trained, dropped)."""
    trained = [i for h in history for i in h["trained_ids"]]
    dropped = [i for h in history for i in h["dropped_ids"]]
    unfinished = history[-1].get("unfinished_ids", [])
    assert len(trained) == len(set(trained)), "an episode was trained twice"
    seen = trained + dropped + unfinished
    assert len(seen) == len(set(seen)), "an episode is both trained and dropped"
    for rank in ranks:
        serials = sorted(int(i.split(":")[1]) for i in seen if i.split(":")[0] == rank)
        assert serials == list(range(len(serials))), f"an episode rank {rank} started is missing"
    assert {i.split(":")[0] for i in seen} <= set(ranks)
    return len(trained), len(dropped)


def without_counts(table: str) -> str:
    """decide's table text with the count of runs that learned (the cell after a row's seeds, ``k of n (...)`` or
    ``only a, only b (p)``) taken out of every table line, for asserts on the figures after it."""
    import re

    count = re.compile(r"^(\| [^|]+ \| \d+ )\| (?:\d+ of \d+ \([^)]*\)|\d+, \d+ \([^)]*\)) ", re.M)
    return count.sub(r"\1", table)
