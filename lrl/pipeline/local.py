"""Rollout workers as processes on this machine: spawned, a queue each way, watched for death and silence.

Start-up: each worker process is spawned with only the trainer's pid and its two queues as arguments
(:mod:`lrl.pipeline.spawn`), then sent its :class:`lrl.pipeline.messages.Setup`. Faults, each one line naming the
worker (:class:`WorkerError`): a worker that reports an exception; a worker that dies (its exit status or the
signal that killed it); a worker that sends nothing for ``timeout`` seconds once it has started (stopped,
hung, starved), and one that has not started within :data:`STARTUP_SECONDS`. Stopping: a Stop message, the
result queue drained while waiting, a join with a timeout, then SIGTERM and SIGKILL for whatever is left, and
the queues' feeder threads are never joined, so closing cannot hang on work that was never taken.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path

import torch.multiprocessing as mp

from lrl.errors import WorkerError
from lrl.pipeline import spawn
from lrl.pipeline.messages import Failed, Stop

STARTUP_SECONDS = 120.0  # a worker imports torch and builds its model before its first word
CLOSE_SECONDS = 3.0
CHECK_SECONDS = 0.25  # how often liveness and heartbeats are looked at


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


class LocalWorkers:
    """`n` rollout worker processes on this machine; the controller's only way to reach them."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.procs: list = []
        self.inboxes: list = []
        self.outbox = None
        self.heard: list[float] = []  # when each worker last said anything
        self.started: list[bool] = []  # whether it has said anything yet
        self._checked = 0.0

    @property
    def running(self) -> bool:
        return bool(self.procs)

    def make_board(self, model, version: int, slots: int):
        """The run's weight board: shared memory the workers read (lrl.pipeline.board)."""
        from lrl.pipeline.board import WeightBoard

        return WeightBoard(model, version, slots)

    def start(self, setups: list) -> None:
        """Spawn one worker per Setup and send it its setup."""
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        for i, setup in enumerate(setups):
            inbox = ctx.Queue()
            proc = ctx.Process(
                target=spawn.main,
                args=(os.getpid(), i, inbox, self.outbox),
                daemon=True,
                name=f"lrl-rollout-{i}",
            )
            proc.start()
            inbox.put(setup)
            self.procs.append(proc)
            self.inboxes.append(inbox)
        now = time.monotonic()
        self.heard = [now] * len(setups)
        self.started = [False] * len(setups)

    def send(self, worker: int, message) -> None:
        self.inboxes[worker].put(message)

    def receive(self, timeout: float):
        """The next message from any worker (None when none came within `timeout`); raises WorkerError for a
        worker that failed, died or went silent."""
        if time.monotonic() - self._checked > CHECK_SECONDS:  # also while others keep talking
            self.check()
        try:
            message = self.outbox.get(timeout=timeout)
        except queue.Empty:
            self.check()
            return None
        self.heard[message.worker] = time.monotonic()
        self.started[message.worker] = True
        if isinstance(message, Failed):
            self.close()
            raise WorkerError(f"rollout worker {message.worker} failed: {message.error} (at {message.where})")
        return message

    def check(self) -> None:
        """Every worker alive and heard from recently enough; else close them all and raise WorkerError."""
        now = time.monotonic()
        self._checked = now
        for i, proc in enumerate(self.procs):
            if not proc.is_alive():
                reported = self._drain_for_failure()
                self.close()
                if reported is not None:
                    raise WorkerError(
                        f"rollout worker {reported.worker} failed: {reported.error} (at {reported.where})"
                    )
                raise WorkerError(
                    f"rollout worker {i} (pid {proc.pid}) died: {exit_words(proc.exitcode)}, without reporting an error"
                )
            limit = self.timeout if self.started[i] else max(STARTUP_SECONDS, self.timeout)
            if now - self.heard[i] > limit:
                state = process_state(proc.pid)
                self.close(hung=i)
                what = "no heartbeat" if self.started[i] else "no word since it was started"
                raise WorkerError(
                    f"rollout worker {i} (pid {proc.pid}) sent {what} for {limit:g} s (--worker-timeout)"
                    + (f"; its process is {state}" if state else "")
                )

    def _drain_for_failure(self):
        """A Failed message a dead worker left in the queue, if any."""
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            try:
                message = self.outbox.get(timeout=0.05)
            except (queue.Empty, OSError, ValueError):
                continue
            if isinstance(message, Failed):
                return message
        return None

    def close(self, hung: int | None = None) -> None:
        """Stop every worker (a Stop message, then signals; a `hung` one is killed at once); never blocks on a
        queue. Safe to call twice."""
        if not self.procs:
            return
        if hung is not None and self.procs[hung].is_alive():
            self.procs[hung].kill()
        for inbox in self.inboxes:
            try:
                inbox.put(Stop())
            except (ValueError, OSError):
                pass
        deadline = time.monotonic() + CLOSE_SECONDS
        while any(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
            self._drain()
            time.sleep(0.02)
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=0.5)
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=1.0)
        for q in [*self.inboxes, self.outbox]:
            q.cancel_join_thread()  # work never taken must not hold the trainer's exit
            q.close()
        self.procs, self.inboxes, self.outbox = [], [], None

    def _drain(self) -> None:
        try:
            while True:
                self.outbox.get_nowait()
        except (queue.Empty, ValueError, OSError):
            pass
