"""The contracts of a rollout backend, and what every backend shares: the errors, the timeouts, the health checks.

A backend is where the rollout workers run (``--rollout-backend``): processes on this machine, threads of the
trainer's process, Ray actors. The controller (:class:`lrl.pipeline.source.AsyncSource`) reaches its workers only
through :class:`Workers`, and the workers read the trainer's weights only through a :class:`Board`. Both are
Protocols: a new backend is one class that has these methods, plus its registration (``lrl.pipeline.backends``).

Whatever the backend, a worker is the same loop (:mod:`lrl.pipeline.worker`) talking typed messages
(:mod:`lrl.pipeline.messages`); the controller's guarantees (the staleness bound, the ledger, lossless resume,
deterministic results) belong to the controller, so a backend must not change a deterministic run's result.
"""

from __future__ import annotations

import queue
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from lrl.errors import WorkerError
from lrl.pipeline.messages import Failed

STARTUP_SECONDS = 120.0  # a worker imports torch and builds its model before its first word
CLOSE_SECONDS = 3.0  # a worker told to stop has this long to end its loop before it is ended
CHECK_SECONDS = 0.25  # how often liveness and heartbeats are looked at


class Board(Protocol):
    """The versions of the trainer's weights, as the workers see them: the trainer publishes every version once;
    a worker loads the newest at a token boundary, or waits for an exact one (a deterministic schedule)."""

    @property
    def version(self) -> int:
        """The newest version a worker can load now (-1 before any)."""

    def publish(self, model, version: int) -> float:
        """The trainer's weights as `version` -> seconds it took."""

    def publish_state(self, state: dict, version: int) -> float:
        """A state dict as `version` (an older version restored from a checkpoint) -> seconds it took."""

    def kept(self) -> dict[int, dict]:
        """Every version still held -> a copy of its weights (a deterministic run's checkpoint)."""

    def read(self, model, version: int) -> bool:
        """Load exactly `version` into `model` if it can be had whole now -> whether it was."""

    def read_newest(self, model, known: int) -> int | None:
        """Load the newest version when it is newer than `known` -> it, or None."""

    def wait_for(self, model, version: int, alive: Callable[[], bool] = ..., poll: float = ...) -> None:
        """Block until exactly `version` can be loaded, and load it; `alive()` is called while waiting (a
        heartbeat) and returns False when waiting should stop (RuntimeError then)."""


class Workers(Protocol):
    """The controller's only way to reach its rollout workers, wherever they run."""

    @property
    def running(self) -> bool:
        """Whether workers are started (and not closed)."""

    def make_board(self, model, version: int, copies: int) -> Board:
        """The run's weight board, holding `copies` versions at a time, with `version` of `model` on it."""

    def start(self, setups: Sequence[Any]) -> None:
        """Start one worker per :class:`lrl.pipeline.messages.Setup` and give it its setup."""

    def send(self, worker: int, message) -> None:
        """A controller message (Work, Pause, Resume, Stop) to `worker`, delivered in the order sent."""

    def receive(self, timeout: float):
        """The next worker message (None when none came within `timeout`); raises :class:`WorkerError` for a
        worker that failed, died or went silent (all workers are closed first)."""

    def check(self) -> None:
        """Every worker alive and heard from recently enough, else close them all and raise WorkerError."""

    def close(self, hung: int | None = None) -> None:
        """Stop every worker (`hung`: one that cannot be asked, ended at once); never blocks for long; safe to
        call twice."""


# -- health checks every backend shares ---------------------------------------------------------------
class Liveness:
    """When each worker was last heard from, and whether it has said anything yet; the silence rule.

    A worker that has started must say something (a heartbeat at least) every ``timeout`` seconds; one that has
    not said anything yet gets ``max(STARTUP_SECONDS, timeout)`` (it imports torch and builds its model)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.heard: list[float] = []
        self.started: list[bool] = []

    def reset(self, workers: int) -> None:
        now = time.monotonic()
        self.heard = [now] * workers
        self.started = [False] * workers

    def restart(self, worker: int) -> None:
        """A replacement for `worker`: heard from now, not started."""
        self.heard[worker] = time.monotonic()
        self.started[worker] = False

    def heard_from(self, worker: int) -> None:
        self.heard[worker] = time.monotonic()
        self.started[worker] = True

    def limit(self, worker: int) -> float:
        return self.timeout if self.started[worker] else max(STARTUP_SECONDS, self.timeout)

    def silent(self, worker: int, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return now - self.heard[worker] > self.limit(worker)

    def silence_error(self, worker: int, who: str, state: str = "") -> WorkerError:
        """The one line of a silent worker (`who` names it: 'rollout worker 0 (pid 123)')."""
        what = "no heartbeat" if self.started[worker] else "no word since it was started"
        detail = f"; its {state}" if state else ""
        return WorkerError(f"{who} sent {what} for {self.limit(worker):g} s (--worker-timeout){detail}")


def failed_error(who: str, error: str, where: str) -> WorkerError:
    """The one line of a worker that reported an exception."""
    return WorkerError(f"{who} failed: {error} (at {where})")


def failure_left_in(outbox):
    """A Failed message a dead worker left in its queue, if any (a worker puts it there just before it ends, so
    its end can be seen before the message is read)."""
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        try:
            message = outbox.get(timeout=0.05)
        except (queue.Empty, OSError, ValueError):
            continue
        if isinstance(message, Failed):
            return message
    return None


def process_state(pid: int) -> str:
    """What the kernel says a process is doing, in words ('' when it cannot tell)."""
    try:
        code = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    names = {"T": "stopped (SIGSTOP?)", "t": "stopped by a debugger", "D": "in uninterruptible I/O"}
    names.update({"R": "running", "S": "sleeping", "Z": "a zombie"})
    return names.get(code, code)


def exit_words(code: int | None) -> str:
    """A process's exit status in words: 'exited with status 1', 'killed by SIGKILL'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


__all__ = [
    "Board",
    "CHECK_SECONDS",
    "CLOSE_SECONDS",
    "Liveness",
    "STARTUP_SECONDS",
    "WorkerError",
    "Workers",
    "exit_words",
    "failed_error",
    "OutboxReader",
    "process_state",
]


class OutboxReader:
    """``receive`` of a backend whose workers answer on one queue (local processes, threads): what came while the
    trainer was away is read, and each worker heard from, before any worker is judged silent (a real model's update
    outlasts the heartbeat timeout). A backend gives ``_get(timeout)`` (raising queue.Empty), ``_get_nowait()``,
    ``check``, ``close``, ``liveness``, ``_checked`` and ``_pending``; ``_where`` names its workers in errors."""

    _where = ""
    _nowait_errors: tuple[type[BaseException], ...] = (queue.Empty,)

    def receive(self, timeout: float):
        """The next message from any worker (None when none came within `timeout`); raises WorkerError for a
        worker that failed, died or went silent."""
        if time.monotonic() - self._checked > CHECK_SECONDS:  # also while others keep talking
            self._read_waiting()
            self.check()
        if self._pending:
            message = self._pending.popleft()
        else:
            try:
                message = self._get(timeout)
            except queue.Empty:
                self.check()
                return None
            self.liveness.heard_from(message.worker)
        if isinstance(message, Failed):
            self._fail(message)
        return message

    def _read_waiting(self) -> None:
        while True:
            try:
                message = self._get_nowait()
            except self._nowait_errors:
                return
            self.liveness.heard_from(message.worker)
            if isinstance(message, Failed):  # raised now: `check` looks for it in the queue, no longer here
                self._fail(message)
            self._pending.append(message)

    def _fail(self, message: Failed):
        """Close the workers and raise the failure a worker reported."""
        self.close()
        raise failed_error(f"rollout worker {message.worker}{self._where}", message.error, message.where)
