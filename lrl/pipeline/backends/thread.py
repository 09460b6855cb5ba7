"""Rollout workers as threads of the trainer's process (``--rollout-backend thread``).

For a debugger (one process: a breakpoint in the worker's code stops there), a notebook, or a machine where
spawning a process is costly. Each worker is the same loop as a process's (:mod:`lrl.pipeline.worker`), in a
daemon thread, between two in-process queues, reading the trainer's weights from the same shared-memory board as
local processes do. Every message is copied on its way, as a process boundary would copy it. The controller's
guarantees do not depend on the backend: the per-token bound, the lossless ledger and resume, and a deterministic
run's result are the same as with ``local`` or ``ray``.

What a thread cannot do: run beside the trainer on another core (Python's lock: the decode loop and the trainer
take turns, so it is slower than ``local`` on a machine with cores to spare), or be killed. A worker that goes
silent for ``--worker-timeout`` ends the run with one line all the same; at close, a thread that does not stop
within :data:`~lrl.pipeline.backends.base.CLOSE_SECONDS` is left to the end of the process (a daemon).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import queue
import threading
import time

from lrl.pipeline.backends.base import (
    CLOSE_SECONDS,
    Liveness,
    OutboxReader,
    WorkerError,
    failed_error,
    failure_left_in,
)
from lrl.pipeline.messages import Stop


class ThreadWorkers(OutboxReader):
    """`n` rollout workers as threads of this process (a :class:`~lrl.pipeline.backends.base.Workers`)."""

    _where = " (thread)"

    def __init__(self, timeout: float):
        self.threads: list[threading.Thread] = []
        self.inboxes: list[queue.Queue] = []
        self.outbox: queue.Queue = queue.Queue()
        self.liveness = Liveness(timeout)
        self._checked = 0.0
        self._pending: collections.deque = collections.deque()  # read from the queue, not yet handed out

    @property
    def running(self) -> bool:
        return bool(self.threads)

    def make_board(self, model, version: int, copies: int):
        from lrl.pipeline.backends.shared_board import WeightBoard

        return WeightBoard(model, version, copies)

    def start(self, setups: list) -> None:
        from lrl.pipeline.worker import shadow_model, worker_main

        self.outbox = queue.Queue()
        for i, setup in enumerate(setups):
            inbox: queue.Queue = queue.Queue()
            # the worker's model is built here, in the trainer's thread: built in the worker's thread, its
            # initialisation would draw from the global generator while the trainer runs; its config is its own
            # copy, rebuilt from the values as a worker process's is (Config.resolved), not the trainer's object
            inbox.put(dataclasses.replace(setup, cfg=copy.deepcopy(setup.cfg), shadow=shadow_model(setup)))
            thread = threading.Thread(
                target=worker_main, args=(None, i, inbox, self.outbox), daemon=True, name=f"lrl-rollout-{i}"
            )
            self.inboxes.append(inbox)
            self.threads.append(thread)
        self.liveness.reset(len(setups))
        for thread in self.threads:
            thread.start()

    def send(self, worker: int, message) -> None:
        self.inboxes[worker].put(copy.deepcopy(message))

    # a copy, as a process boundary makes one: a checkpoint's state must not change with the worker's episodes
    # once the worker goes on (the lists of an episode's state are the episode's own)
    def _get(self, timeout: float):
        return copy.deepcopy(self.outbox.get(timeout=timeout))

    def _get_nowait(self):
        return copy.deepcopy(self.outbox.get_nowait())

    def check(self) -> None:
        now = time.monotonic()
        self._checked = now
        for i, thread in enumerate(self.threads):
            if not thread.is_alive():
                reported = failure_left_in(self.outbox)
                self.close()
                if reported is not None:
                    raise failed_error(
                        f"rollout worker {reported.worker} (thread)", reported.error, reported.where
                    )
                raise WorkerError(f"rollout worker {i} (thread) ended without reporting an error")
            if self.liveness.silent(i, now):
                error = self.liveness.silence_error(i, f"rollout worker {i} (thread)")
                self.close()
                raise error

    def close(self, hung: int | None = None) -> None:
        if not self.threads:
            return
        for inbox in self.inboxes:
            inbox.put(Stop())
        deadline = time.monotonic() + CLOSE_SECONDS
        for thread in self.threads:
            while thread.is_alive() and time.monotonic() < deadline:
                self._drain()  # a worker blocked on nothing but its own loop sees its Stop
                thread.join(timeout=0.02)
        self.threads, self.inboxes = [], []
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self.outbox.get_nowait()
        except queue.Empty:
            pass
