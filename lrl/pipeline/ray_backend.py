"""Rollout workers as Ray actors: the controller's only way to reach them, with the interface of
:class:`lrl.pipeline.local.LocalWorkers` (``start``, ``send``, ``receive``, ``check``, ``close``, ``running``).

Each worker is one actor (:class:`RolloutActor`) with the resources it declares (``--worker-cpus``,
``--worker-gpus``), spread over the cluster's nodes. Inside it the worker loop of :mod:`lrl.pipeline.worker` runs
unchanged, in a thread, between two in-process queues: the controller's messages arrive by actor calls, numbered
and put in order (a threaded actor may run calls out of order), and its results leave by a long poll (one
pending ``collect`` call per actor returns whatever the worker said, at least a heartbeat every 0.2 s). The
weights travel through the object store (:mod:`lrl.pipeline.ray_board`).

Faults, each one line naming the worker, its node and the cause (:class:`~lrl.pipeline.local.WorkerError`):
an actor that reports an exception; an actor that dies (its process killed, its node lost, unreachable for
:data:`UNREACHABLE_SECONDS`); one that sends nothing for ``--worker-timeout`` seconds; one that Ray cannot place
within :data:`PLACE_SECONDS` (the resources it asks for, and what the cluster has). With ``--worker-restarts K``
an actor that dies is replaced (at most K times per worker) and given again every group it held that had not
come back: the groups are generated anew under the same episode ids, the lost partial episodes are counted
(``pipeline/lost``, ``pipeline/restarts``), so nothing is trained twice and the controller's accounting
(``held``) stays exact; a deterministic batch is generated anew on its own version and seeds, so the run's
result does not change.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import sys
import threading
import time

from lrl.pipeline.local import CHECK_SECONDS, CLOSE_SECONDS, STARTUP_SECONDS, WorkerError
from lrl.pipeline.messages import BatchDone, Beat, Failed, Group, GroupDone, Pause, Paused, Stop, Work
from lrl.pipeline.ray_board import ObjectStoreBoard
from lrl.pipeline.ray_cluster import RayRuntime, RayStartError

PLACE_SECONDS = 60.0  # an actor Ray has not placed by then asks for more than the cluster has free
UNREACHABLE_SECONDS = 3.0  # an actor Ray cannot reach for this long is lost (its node went away)
COLLECT_SECONDS = 0.5  # the longest a collect call waits for a first message


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


@dataclasses.dataclass
class _Slot:
    """The controller's record of one worker's actor."""

    handle: object = None
    place: dict | None = None
    place_ref: object = None
    pending: object = None  # the collect call in flight
    number: int = 0  # of the next message sent
    created: float = 0.0
    heard: float = 0.0
    started: bool = False
    unreachable_since: float | None = None
    held: list = dataclasses.field(default_factory=list)  # Work sent and not all back, in order
    pausing: bool = False  # a Pause sent, its Paused not yet back
    restarts: int = 0
    base: object = None  # WorkerStats of its earlier actors, added to what the current one reports
    last: object = None  # the last WorkerStats it reported


class RayWorkers:
    """`n` rollout workers as Ray actors; the controller's only way to reach them (see the module docstring)."""

    def __init__(self, cfg):
        self.timeout = cfg.worker_timeout
        self.restarts = cfg.worker_restarts
        self.options = {"num_cpus": cfg.worker_cpus, "num_gpus": cfg.worker_gpus}
        own_cpus = max(os.cpu_count() or 1, cfg.rollout_workers * cfg.worker_cpus)
        self.runtime = RayRuntime(cfg.ray_address, own_cpus)
        self.slots: list[_Slot] = []
        self.setups: list = []
        self.board: ObjectStoreBoard | None = None
        self.buffer: list = []  # messages collected and not yet handed to the controller
        self.places: list[dict] = []  # where each worker's actor ran (kept after close, for the record)
        self._actor_class = None
        self._checked = 0.0

    @property
    def running(self) -> bool:
        return bool(self.slots)

    def make_board(self, model, version: int, slots: int) -> ObjectStoreBoard:
        """The run's weight board (its first publish connects to Ray)."""
        self.board = ObjectStoreBoard(model, slots, owner=self)
        return self.board

    def connect(self):
        try:
            return self.runtime.connect()
        except RayStartError as err:
            raise WorkerError(f"rollout workers on Ray: {err}") from None

    def announce(self, version: int, ref) -> None:
        for slot in self.slots:
            slot.handle.announce.remote(version, [ref])

    # -- starting -------------------------------------------------------------------------------------
    def start(self, setups: list) -> None:
        """One actor per Setup, each sent its setup."""
        ray = self.connect()
        if self._actor_class is None:
            self._actor_class = ray.remote(max_concurrency=8)(RolloutActor)
        self.setups = list(setups)
        self.slots = [_Slot(held=restored_work(s.restore, s.cfg["episodes_per_task"])) for s in setups]
        for i in range(len(setups)):
            self._launch(i, setups[i])

    def _launch(self, i: int, setup) -> None:
        """A new actor for worker `i`, sent `setup` and the versions on the board."""
        slot = self.slots[i]
        paths = [os.getcwd(), *sys.path]
        slot.handle = self._actor_class.options(
            **self.options, scheduling_strategy="SPREAD", max_restarts=0, max_task_retries=0
        ).remote(i, paths)
        slot.place_ref = slot.handle.place.remote()
        slot.place = None
        slot.number = 0
        slot.started = False
        slot.unreachable_since = None
        slot.created = slot.heard = time.monotonic()
        self._deliver(i, setup)
        for version, ref in sorted(self.board.refs.items()) if self.board is not None else []:
            slot.handle.announce.remote(version, [ref])
        slot.pending = slot.handle.collect.remote(COLLECT_SECONDS)

    def _deliver(self, i: int, message) -> None:
        slot = self.slots[i]
        slot.handle.deliver.remote(slot.number, message)
        slot.number += 1

    # -- talking ----------------------------------------------------------------------------------------
    def send(self, worker: int, message) -> None:
        slot = self.slots[worker]
        if isinstance(message, Work):
            slot.held.append(message)
        elif isinstance(message, Pause):
            slot.pausing = True
        self._deliver(worker, message)

    def receive(self, timeout: float):
        """The next message from any worker (None when none came within `timeout`); raises WorkerError for a
        worker that failed, died or went silent (or restarts one that died, when restarts are allowed)."""
        import ray

        if not self.buffer:
            self._poll(ray, timeout)
        if time.monotonic() - self._checked > CHECK_SECONDS:
            self.check()
        if not self.buffer:
            return None
        return self._accept(self.buffer.pop(0))

    def _poll(self, ray, timeout: float) -> None:
        pending = {slot.pending: i for i, slot in enumerate(self.slots) if slot.pending is not None}
        if not pending:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if ready:  # take every collect that is done, not only the first
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            i = pending[ref]
            slot = self.slots[i]
            try:
                messages = ray.get(ref)
            except ray.exceptions.ActorUnavailableError as err:
                slot.unreachable_since = slot.unreachable_since or time.monotonic()
                if time.monotonic() - slot.unreachable_since > UNREACHABLE_SECONDS:
                    self._lost(i, f"unreachable for {UNREACHABLE_SECONDS:g} s ({_cause(err)})")
                    continue
                time.sleep(0.05)
                slot.pending = slot.handle.collect.remote(COLLECT_SECONDS)
                continue
            except ray.exceptions.RayActorError as err:
                self._lost(i, _cause(err))
                continue
            slot.unreachable_since = None
            slot.pending = slot.handle.collect.remote(COLLECT_SECONDS)
            now = time.monotonic()
            if messages:
                slot.heard = now
                slot.started = True
            self.buffer.extend(messages)

    def _accept(self, message):
        """Bookkeeping of a worker's message (what it still holds, its totals across restarts) -> it."""
        if isinstance(message, Failed):
            where = self._where(message.worker)
            self.close()
            raise WorkerError(
                f"rollout worker {message.worker}{where} failed: {message.error} (at {message.where})"
            )
        slot = self.slots[message.worker]
        if isinstance(message, Beat):
            slot.last = message.stats
            if slot.base is not None:
                return Beat(message.worker, _added(slot.base, message.stats))
        elif isinstance(message, GroupDone):
            _returned(slot.held, lambda w: [g for g in w.groups if g.serial != message.serial])
        elif isinstance(message, BatchDone):
            _returned(slot.held, lambda w: [] if w.batch == message.batch else w.groups)
        elif isinstance(message, Paused):
            slot.pausing = False
        return message

    def check(self) -> None:
        """Every actor placed in time and heard from recently enough; else close them all and raise."""
        now = time.monotonic()
        self._checked = now
        for i, slot in enumerate(self.slots):
            if slot.place is None:
                self._placed(i)
            if slot.place is None and now - slot.created > PLACE_SECONDS:
                wanted = ", ".join(f"{k} {v:g}" for k, v in self.options.items() if v)
                self.close()
                raise WorkerError(
                    f"rollout worker {i} was not placed on the Ray cluster within {PLACE_SECONDS:g} s: it asks "
                    f"for {wanted} (--worker-cpus, --worker-gpus)"
                )
            limit = self.timeout if slot.started else max(STARTUP_SECONDS, self.timeout)
            if now - slot.heard > limit:
                where = self._where(i)
                what = "no heartbeat" if slot.started else "no word since it was started"
                self.close()
                raise WorkerError(f"rollout worker {i}{where} sent {what} for {limit:g} s (--worker-timeout)")

    def _placed(self, i: int) -> None:
        import ray

        slot = self.slots[i]
        ready, _ = ray.wait([slot.place_ref], timeout=0)
        if not ready:
            return
        try:
            slot.place = ray.get(ready[0])
        except ray.exceptions.RayActorError:
            slot.place = {}  # it died before it could say where: its collect reports the death
        self.places = [s.place or {} for s in self.slots]

    def _where(self, i: int) -> str:
        place = self.slots[i].place if i < len(self.slots) else None
        if not place:
            return " (Ray actor, not placed yet)"
        return f" (Ray actor on node {place['ip']} {place['node'][:12]}, pid {place['pid']})"

    # -- deaths -----------------------------------------------------------------------------------------
    def _lost(self, i: int, cause: str) -> None:
        """Worker `i`'s actor died: restart it when restarts are left (its groups given again), else raise."""
        slot = self.slots[i]
        where = self._where(i)
        if slot.restarts >= self.restarts:
            self.close()
            allowed = f" (restarted {slot.restarts} times, --worker-restarts {self.restarts})"
            raise WorkerError(f"rollout worker {i}{where} died: {cause}" + (allowed if self.restarts else ""))
        import ray

        if slot.held is None:
            self.close()
            raise WorkerError(
                f"rollout worker {i}{where} died: {cause}; it cannot be restarted: it was resumed from a "
                "checkpoint that does not say which groups it held"
            )
        ray.kill(slot.handle, no_restart=True)
        slot.restarts += 1
        held = [w for w in slot.held if w.groups]
        lost = sum(g.episodes for w in held for g in w.groups)
        slot.base = _added(slot.base, slot.last)
        slot.base.restarts += 1
        slot.base.lost += lost
        slot.last = None
        self.buffer.append(Beat(i, dataclasses.replace(slot.base)))  # the step's metrics count it at once
        print(
            f"lrl: rollout worker {i}{where} died: {cause}; restarting it ({slot.restarts} of "
            f"{self.restarts}), {lost} episodes in flight generated again",
            file=sys.stderr,
            flush=True,
        )
        self._launch(i, dataclasses.replace(self.setups[i], restore=None))
        slot.held = []
        for work in held:
            self.send(i, work)
        if slot.pausing:  # a checkpoint is waiting for this worker's state
            self._deliver(i, Pause())

    # -- stopping ---------------------------------------------------------------------------------------
    def close(self, hung: int | None = None) -> None:
        """Stop every actor (Stop, then kill), disconnect, and stop the Ray lrl started. Safe to call twice."""
        if self.slots:
            import ray

            for i in range(len(self.slots)):
                try:
                    if i != hung:
                        self._deliver(i, Stop())
                except Exception:  # noqa: BLE001 (a dead actor cannot be told to stop)
                    pass
            # the workers end their loops (an engine shuts down), then the actors go
            launched = [
                s for s in self.slots if s.handle is not None
            ]  # a failed start leaves some without one
            finishing = [s.handle.finish.remote(CLOSE_SECONDS) for s in launched]
            try:
                ray.wait(finishing, num_returns=len(finishing), timeout=CLOSE_SECONDS + 1)
            except Exception:  # noqa: BLE001
                pass
            for slot in launched:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
            self.slots = []
            self.buffer = []
        self.runtime.close()


def _returned(held: list, remaining) -> None:
    """Update the Work a worker holds after a result: `remaining(work)` is what is still out of each."""
    for k, work in enumerate(held):
        groups = remaining(work)
        if len(groups) != len(work.groups):
            held[k] = Work(groups, work.batch, work.start_version)
            break
    held[:] = [w for w in held if w.groups]


def _added(a, b):
    """Two WorkerStats summed field by field (None counts as zeros)."""
    from lrl.pipeline.messages import WorkerStats

    a = a or WorkerStats()
    b = b or WorkerStats()
    return WorkerStats(**{k: getattr(a, k) + getattr(b, k) for k in vars(a)})


def restored_work(state: dict | None, episodes: int) -> list[Work] | None:
    """The work a worker restored from a checkpoint holds, as Work to give again -> [Work], or None when the
    state does not say (a checkpoint from before groups recorded their tasks)."""
    if state is None:
        return []

    def work(saved: dict) -> Work:
        return Work([Group(**g) for g in saved["groups"]], saved["batch"], saved["start_version"])

    if "current" in state:  # deterministic: the batch in progress, then those waiting
        current = [work(state["current"]["work"])] if state["current"] is not None else []
        return current + [work(b) for b in state["batches"]]
    opened = state["groups"]
    if "tasks" not in opened and opened["elapsed"]:
        return None
    started = [Group(int(s), t, episodes) for s, t in sorted(opened.get("tasks", {}).items())]
    return ([Work(started, -1)] if started else []) + [work(u) for u in state["units"]]


def _cause(err: Exception) -> str:
    """A Ray actor error's cause on one line, without Ray's generic lines."""
    lines = [line.strip() for line in str(err).splitlines()]
    skip = ("The actor died unexpectedly before finishing this task.", "class_name:", "actor_id:", "pid:")
    skip += ("name:", "namespace:", "ip:")
    kept = [line for line in lines if line and not line.startswith(skip)]
    text = (" ".join(kept) or lines[0]) if lines else type(err).__name__
    for advice in ("Some common causes", "There are some potential root causes"):  # Ray's general advice
        text = text.split(advice)[0]
    return " ".join(text.split())[:300]


__all__ = ["Group", "RayWorkers", "RolloutActor"]
