"""One rollout worker inside a Ray actor: the worker loop of :mod:`lrl.pipeline.worker`, unchanged, in a thread,
between two in-process queues; the controller's messages arrive numbered (a threaded actor may run calls out of
order) and are put in order, and the worker's results leave by a long poll (:meth:`RolloutActor.collect`)."""

from __future__ import annotations

import os
import queue
import sys
import threading

from lrl.pipeline.backends.ray.board import ObjectStoreBoard


class RolloutActor:
    """One rollout worker inside a Ray actor: the worker loop in a thread, two queues, an announced board."""

    def __init__(self, index: int, paths: list[str]):
        for path in paths:  # the driver's import paths (plugins, a source checkout) where they exist here
            if path not in sys.path and os.path.isdir(path):
                sys.path.append(path)
        self.index = index
        self.inbox: queue.Queue = queue.Queue()
        self.outbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.next = 0  # the number of the next message to put in the inbox
        self.early: dict[int, object] = {}  # messages that arrived before one sent earlier
        self.board: ObjectStoreBoard | None = None  # the Setup's board, once it has arrived
        self.announced: dict[int, object] = {}  # versions announced before the Setup
        self.thread: threading.Thread | None = None

    def place(self) -> dict:
        """Where this actor runs."""
        import ray

        context = ray.get_runtime_context()
        return {"node": context.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def deliver(self, number: int, message) -> None:
        """The controller's message `number`; messages go into the inbox in the order they were sent."""
        with self.lock:
            self.early[number] = message
            while self.next in self.early:
                self._put(self.early.pop(self.next))
                self.next += 1

    def _put(self, message) -> None:
        from lrl.pipeline.messages import Setup

        if isinstance(message, Setup):  # the worker's board is the one told of versions, from now on
            self.board = message.board
            for version, ref in sorted(self.announced.items()):
                self.board.update(version, ref)
            self.announced = {}
            self.thread = threading.Thread(target=self._run, name="lrl-rollout", daemon=True)
            self.inbox.put(message)
            self.thread.start()
            return
        self.inbox.put(message)

    def _run(self) -> None:
        from lrl.pipeline.worker import worker_main

        # the worker stops itself when its parent (the node's raylet) goes away, as a local one does when the
        # trainer does; the trainer's own death ends the actor through Ray (its job ends)
        worker_main(os.getppid(), self.index, self.inbox, self.outbox)

    def announce(self, version: int, refs: list) -> None:
        """A new version of the weights, at ``refs[0]`` (nested, so Ray passes the reference, not the weights)."""
        with self.lock:
            if self.board is None:
                self.announced[version] = refs[0]
            else:
                self.board.update(version, refs[0])

    def finish(self, timeout: float) -> bool:
        """Wait up to `timeout` for the worker loop to end (after a Stop) -> whether it did."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.thread is None or not self.thread.is_alive()

    def collect(self, timeout: float) -> list:
        """What the worker said: wait up to `timeout` for a first message, then take every one waiting."""
        out = []
        try:
            out.append(self.outbox.get(timeout=timeout))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self.outbox.get_nowait())
            except queue.Empty:
                return out
