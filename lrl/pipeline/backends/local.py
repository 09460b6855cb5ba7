"""Rollout workers as processes on this machine: spawned, a queue each way, watched for death and silence.

Start-up: each worker process is spawned with only the trainer's pid and its two queues as arguments
(:mod:`lrl.pipeline.backends.spawn`), then sent its :class:`lrl.pipeline.messages.Setup`. Faults, each one line
naming the worker (:class:`~lrl.errors.WorkerError`): a worker that reports an exception; a worker that dies (its
exit status or the signal that killed it); a worker that sends nothing for ``timeout`` seconds once it has started
(stopped, hung, starved), and one that has not started within :data:`~lrl.pipeline.backends.base.STARTUP_SECONDS`.
Stopping: a Stop message, the result queue drained while waiting, a join with a timeout, then SIGTERM and SIGKILL
for whatever is left, and the queues' feeder threads are never joined, so closing cannot hang on work that was
never taken.
"""

from __future__ import annotations

import collections
import os
import queue
import time

import torch.multiprocessing as mp

from lrl.pipeline.backends import spawn
from lrl.pipeline.backends.base import (
    CLOSE_SECONDS,
    Liveness,
    OutboxReader,
    WorkerError,
    exit_words,
    failed_error,
    failure_left_in,
    process_state,
)
from lrl.pipeline.messages import Failed, Stop


class LocalWorkers(OutboxReader):
    """`n` rollout worker processes on this machine (a :class:`~lrl.pipeline.backends.base.Workers`)."""

    _nowait_errors = (queue.Empty, OSError, ValueError)  # a queue closed under the reader

    def __init__(self, timeout: float):
        self.procs: list = []
        self.inboxes: list = []
        self.outbox = None
        self.liveness = Liveness(timeout)
        self._checked = 0.0
        self._pending: collections.deque = collections.deque()  # read from the queue, not yet handed out

    @property
    def running(self) -> bool:
        return bool(self.procs)

    def make_board(self, model, version: int, copies: int):
        """The run's weight board: shared memory the workers read."""
        from lrl.pipeline.backends.shared_board import WeightBoard

        return WeightBoard(model, version, copies)

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
        self.liveness.reset(len(setups))

    def send(self, worker: int, message) -> None:
        self.inboxes[worker].put(message)

    def _get(self, timeout: float):
        return self.outbox.get(timeout=timeout)

    def _get_nowait(self):
        return self.outbox.get_nowait()

    def check(self) -> None:
        """Every worker alive and heard from recently enough; else close them all and raise WorkerError."""
        now = time.monotonic()
        self._checked = now
        for i, proc in enumerate(self.procs):
            if not proc.is_alive():
                reported = next((m for m in self._pending if isinstance(m, Failed)), None)
                reported = reported or failure_left_in(self.outbox)
                self.close()
                if reported is not None:
                    raise failed_error(f"rollout worker {reported.worker}", reported.error, reported.where)
                raise WorkerError(
                    f"rollout worker {i} (pid {proc.pid}) died: {exit_words(proc.exitcode)}, without reporting an error"
                )
            if self.liveness.silent(i, now):
                state = process_state(proc.pid)
                error = self.liveness.silence_error(
                    i, f"rollout worker {i} (pid {proc.pid})", f"process is {state}" if state else ""
                )
                self.close(hung=i)
                raise error

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
