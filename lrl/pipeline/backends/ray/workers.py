"""Rollout workers as Ray actors: a :class:`~lrl.pipeline.backends.base.Workers`, the controller's only way to
reach them.

Each worker is one actor (:class:`lrl.pipeline.backends.ray.actor.RolloutActor`) with the resources it declares (``--worker-cpus``,
``--worker-gpus``), spread over the cluster's nodes. Inside it the worker loop of :mod:`lrl.pipeline.worker` runs
unchanged, in a thread, between two in-process queues: the controller's messages arrive by actor calls, numbered
and put in order (a threaded actor may run calls out of order), and its results leave by a long poll (one
pending ``collect`` call per actor returns whatever the worker said, at least a heartbeat every 0.2 s). The
weights travel through the object store (:mod:`lrl.pipeline.backends.ray.board`).

Faults, each one line naming the worker, its node and the cause (:class:`~lrl.errors.WorkerError`):
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
import sys
import time
from typing import TYPE_CHECKING

from lrl.pipeline.backends.base import CHECK_SECONDS, CLOSE_SECONDS, Liveness, WorkerError, failed_error
from lrl.pipeline.backends.ray.actor import RolloutActor
from lrl.pipeline.backends.ray.board import ObjectStoreBoard
from lrl.pipeline.backends.ray.cluster import RayRuntime, RayStartError
from lrl.pipeline.messages import BatchDone, Beat, Failed, GroupDone, Pause, Paused, Stop, Work
from lrl.pipeline.worker import held_work

if TYPE_CHECKING:
    from lrl.sections import RolloutOptions

PLACE_SECONDS = 60.0  # an actor Ray has not placed by then asks for more than the cluster has free
UNREACHABLE_SECONDS = 3.0  # an actor Ray cannot reach for this long is lost (its node went away)
COLLECT_SECONDS = 0.5  # the longest a collect call waits for a first message


@dataclasses.dataclass
class _Actor:
    """The controller's record of one worker's actor."""

    handle: object = None
    place: dict | None = None
    place_ref: object = None
    pending: object = None  # the collect call in flight
    number: int = 0  # of the next message sent
    created: float = 0.0
    unreachable_since: float | None = None
    held: list = dataclasses.field(default_factory=list)  # Work sent and not all back, in order
    pausing: bool = False  # a Pause sent, its Paused not yet back
    restarts: int = 0
    base: object = None  # WorkerStats of its earlier actors, added to what the current one reports
    last: object = None  # the last WorkerStats it reported


class RayWorkers:
    """`n` rollout workers as Ray actors; the controller's only way to reach them (see the module docstring)."""

    def __init__(self, rollout: RolloutOptions):
        self.liveness = Liveness(rollout.worker_timeout)
        self.restarts = rollout.worker_restarts
        self.options = {"num_cpus": rollout.worker_cpus, "num_gpus": rollout.worker_gpus}
        own_cpus = max(os.cpu_count() or 1, rollout.rollout_workers * rollout.worker_cpus)
        self.runtime = RayRuntime(rollout.ray_address, own_cpus)
        self.actors: list[_Actor] = []
        self.setups: list = []
        self.board: ObjectStoreBoard | None = None
        self.buffer: list = []  # messages collected and not yet handed to the controller
        self.places: list[dict] = []  # where each worker's actor ran (kept after close, for the record)
        self._actor_class = None
        self._checked = 0.0

    @property
    def running(self) -> bool:
        return bool(self.actors)

    def make_board(self, model, version: int, copies: int) -> ObjectStoreBoard:
        """The run's weight board (its first publish connects to Ray)."""
        self.board = ObjectStoreBoard(model, copies, owner=self)
        return self.board

    def connect(self):
        try:
            return self.runtime.connect()
        except RayStartError as err:
            raise WorkerError(f"rollout workers on Ray: {err}") from None

    def announce(self, version: int, ref) -> None:
        for actor in self.actors:
            actor.handle.announce.remote(version, [ref])

    # -- starting -------------------------------------------------------------------------------------
    def start(self, setups: list) -> None:
        """One actor per Setup, each sent its setup."""
        ray = self.connect()
        if self._actor_class is None:
            self._actor_class = ray.remote(max_concurrency=8)(RolloutActor)
        self.setups = list(setups)
        self.actors = [
            _Actor(held=held_work(s.cfg.rollout.deterministic, s.cfg.batch.episodes_per_task, s.restore))
            for s in setups
        ]
        self.liveness.reset(len(setups))
        for i in range(len(setups)):
            self._launch(i, setups[i])

    def _launch(self, i: int, setup) -> None:
        """A new actor for worker `i`, sent `setup` and the versions on the board."""
        actor = self.actors[i]
        paths = [os.getcwd(), *sys.path]
        actor.handle = self._actor_class.options(
            **self.options, scheduling_strategy="SPREAD", max_restarts=0, max_task_retries=0
        ).remote(i, paths)
        actor.place_ref = actor.handle.place.remote()
        actor.place = None
        actor.number = 0
        actor.unreachable_since = None
        actor.created = time.monotonic()
        self.liveness.restart(i)
        self._deliver(i, setup)
        for version, ref in sorted(self.board.refs.items()) if self.board is not None else []:
            actor.handle.announce.remote(version, [ref])
        actor.pending = actor.handle.collect.remote(COLLECT_SECONDS)

    def _deliver(self, i: int, message) -> None:
        actor = self.actors[i]
        actor.handle.deliver.remote(actor.number, message)
        actor.number += 1

    # -- talking ----------------------------------------------------------------------------------------
    def send(self, worker: int, message) -> None:
        actor = self.actors[worker]
        if isinstance(message, Work):
            actor.held.append(message)
        elif isinstance(message, Pause):
            actor.pausing = True
        self._deliver(worker, message)

    def receive(self, timeout: float):
        """The next message from any worker (None when none came within `timeout`); raises WorkerError for a
        worker that failed, died or went silent (or restarts one that died, when restarts are allowed)."""
        import ray

        if not self.buffer:
            self._poll(ray, timeout)
        if time.monotonic() - self._checked > CHECK_SECONDS:
            if self.buffer:  # what came while the trainer computed counts before anyone is judged silent
                self._poll(ray, 0.0)
            self.check()
        if not self.buffer:
            return None
        return self._accept(self.buffer.pop(0))

    def _poll(self, ray, timeout: float) -> None:
        pending = {actor.pending: i for i, actor in enumerate(self.actors) if actor.pending is not None}
        if not pending:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if ready:  # take every collect that is done, not only the first
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            i = pending[ref]
            actor = self.actors[i]
            try:
                messages = ray.get(ref)
            except ray.exceptions.ActorUnavailableError as err:
                actor.unreachable_since = actor.unreachable_since or time.monotonic()
                if time.monotonic() - actor.unreachable_since > UNREACHABLE_SECONDS:
                    self._lost(i, f"unreachable for {UNREACHABLE_SECONDS:g} s ({_cause(err)})")
                    continue
                time.sleep(0.05)
                actor.pending = actor.handle.collect.remote(COLLECT_SECONDS)
                continue
            except ray.exceptions.RayActorError as err:
                self._lost(i, _cause(err))
                continue
            actor.unreachable_since = None
            actor.pending = actor.handle.collect.remote(COLLECT_SECONDS)
            if messages:
                self.liveness.heard_from(i)
            self.buffer.extend(messages)

    def _accept(self, message):
        """Bookkeeping of a worker's message (what it still holds, its totals across restarts) -> it."""
        if isinstance(message, Failed):
            where = self._where(message.worker)
            self.close()
            raise failed_error(f"rollout worker {message.worker}{where}", message.error, message.where)
        actor = self.actors[message.worker]
        if isinstance(message, Beat):
            actor.last = message.stats
            if actor.base is not None:
                return Beat(message.worker, _added(actor.base, message.stats), message.timeline)
        elif isinstance(message, GroupDone):
            _returned(actor.held, lambda w: [g for g in w.groups if g.serial != message.serial])
        elif isinstance(message, BatchDone):
            _returned(actor.held, lambda w: [] if w.batch == message.batch else w.groups)
        elif isinstance(message, Paused):
            actor.pausing = False
        return message

    def check(self) -> None:
        """Every actor placed in time and heard from recently enough; else close them all and raise."""
        now = time.monotonic()
        self._checked = now
        for i, actor in enumerate(self.actors):
            if actor.place is None:
                self._placed(i)
            if actor.place is None and now - actor.created > PLACE_SECONDS:
                wanted = ", ".join(f"{k} {v:g}" for k, v in self.options.items() if v)
                self.close()
                raise WorkerError(
                    f"rollout worker {i} was not placed on the Ray cluster within {PLACE_SECONDS:g} s: it asks "
                    f"for {wanted} (--worker-cpus, --worker-gpus)"
                )
            if self.liveness.silent(i, now):
                error = self.liveness.silence_error(i, f"rollout worker {i}{self._where(i)}")
                self.close()
                raise error

    def _placed(self, i: int) -> None:
        import ray

        actor = self.actors[i]
        ready, _ = ray.wait([actor.place_ref], timeout=0)
        if not ready:
            return
        try:
            actor.place = ray.get(ready[0])
        except ray.exceptions.RayActorError:
            actor.place = {}  # it died before it could say where: its collect reports the death
        self.places = [s.place or {} for s in self.actors]

    def _where(self, i: int) -> str:
        place = self.actors[i].place if i < len(self.actors) else None
        if not place:
            return " (Ray actor, not placed yet)"
        return f" (Ray actor on node {place['ip']} {place['node'][:12]}, pid {place['pid']})"

    # -- deaths -----------------------------------------------------------------------------------------
    def _lost(self, i: int, cause: str) -> None:
        """Worker `i`'s actor died: restart it when restarts are left (its groups given again), else raise."""
        actor = self.actors[i]
        where = self._where(i)
        if actor.restarts >= self.restarts:
            self.close()
            allowed = f" (restarted {actor.restarts} times, --worker-restarts {self.restarts})"
            raise WorkerError(f"rollout worker {i}{where} died: {cause}" + (allowed if self.restarts else ""))
        import ray

        if actor.held is None:
            self.close()
            raise WorkerError(
                f"rollout worker {i}{where} died: {cause}; it cannot be restarted: it was resumed from a "
                "checkpoint that does not say which groups it held"
            )
        ray.kill(actor.handle, no_restart=True)
        actor.restarts += 1
        held = [w for w in actor.held if w.groups]
        lost = sum(g.episodes for w in held for g in w.groups)
        actor.base = _added(actor.base, actor.last)
        actor.base.restarts += 1
        actor.base.lost += lost
        actor.last = None
        self.buffer.append(Beat(i, dataclasses.replace(actor.base)))  # the step's metrics count it at once
        print(
            f"lrl: rollout worker {i}{where} died: {cause}; restarting it ({actor.restarts} of "
            f"{self.restarts}), {lost} episodes in flight generated again",
            file=sys.stderr,
            flush=True,
        )
        self._launch(i, dataclasses.replace(self.setups[i], restore=None))
        actor.held = []
        for work in held:
            self.send(i, work)
        if actor.pausing:  # a checkpoint is waiting for this worker's state
            self._deliver(i, Pause())

    # -- stopping ---------------------------------------------------------------------------------------
    def close(self, hung: int | None = None) -> None:
        """Stop every actor (Stop, then kill), disconnect, and stop the Ray lrl started. Safe to call twice."""
        if self.actors:
            import ray

            for i in range(len(self.actors)):
                try:
                    if i != hung:
                        self._deliver(i, Stop())
                except Exception:  # noqa: BLE001 (a dead actor cannot be told to stop)
                    pass
            # the workers end their loops (an engine shuts down), then the actors go
            launched = [
                s for s in self.actors if s.handle is not None
            ]  # a failed start leaves some without one
            finishing = [s.handle.finish.remote(CLOSE_SECONDS) for s in launched]
            try:
                ray.wait(finishing, num_returns=len(finishing), timeout=CLOSE_SECONDS + 1)
            except Exception:  # noqa: BLE001
                pass
            for actor in launched:
                try:
                    ray.kill(actor.handle, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
            self.actors = []
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


__all__ = ["RayWorkers", "RolloutActor"]
