"""A rollout worker: an engine with slots, environment workers, its own copy of the weights, one torch thread.

Started by :mod:`lrl.pipeline.spawn`; its first message is its :class:`~lrl.pipeline.messages.Setup`. The worker
runs one :class:`lrl.rollout.Rollout` (the same episode loop as the synchronous pipeline): up to ``--slots``
episodes in flight, all those generating decoded in one batched step per token, environment steps on the tool
runner (:mod:`lrl.envs.workers`), so the engine decodes while tools run. With ``--slots 0`` a unit (the
worker's share of a batch) runs in lockstep turns, one unit at a time. What it runs, and when it loads new
weights, is its scheduling policy:

- :class:`FreeRunning`: units as they come; an episode starts whenever a slot is free. New weights from the
  board (``--partial-rollouts interrupt``) at the next token boundary of every slot, or (``drain``) once the
  episodes in flight have finished on the old ones, starting none meanwhile. Each group goes back as soon as its
  episodes are done.
- :class:`Deterministic`: whole batches in order, each on the version the logical clock gives it and from
  generators of its own; with ``interrupt``, switches at scheduled decode steps (waiting for a version that is
  not published yet); tool latency on a logical clock. What it generates does not depend on timing, nor on the
  number of workers.

A :class:`~lrl.pipeline.messages.Pause` (a checkpoint) is answered at a token boundary with the whole state as
plain data; the worker then waits for Resume or Stop.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections import deque

import torch

from lrl.pipeline.messages import (
    BatchDone,
    Beat,
    Failed,
    Group,
    GroupDone,
    Pause,
    Paused,
    Resume,
    Setup,
    Stop,
    Work,
    WorkerStats,
)

BEAT = 0.2  # seconds between heartbeats


def batch_seed(seed: int, rank: int, batch: int) -> int:
    """A generator seed from the run's seed, the rank and a batch (or worker) number."""
    return (seed * 1_000_003 + rank * 7919 + batch * 104_729) % (2**63)


class Stopping(Exception):
    """The trainer asked the worker to stop while it waited (for weights)."""


def worker_main(trainer: int, index: int, inbox, outbox) -> None:
    """The worker process: any exception goes to the trainer, named, and the worker exits."""
    try:
        setup = inbox.get()
        Worker(trainer, index, setup, inbox, outbox).run()
    except Stopping:
        return
    except BaseException as err:  # noqa: BLE001 (whatever stops the worker is reported before it exits)
        lines = traceback.format_exc().strip().splitlines()
        where = " | ".join(s.strip() for s in lines[-3:-1])
        outbox.put(Failed(index, f"{type(err).__name__}: {err}", where))


class Groups:
    """The episodes of started groups, until each group is complete."""

    def __init__(self, episodes_per_group: int):
        self.size = episodes_per_group
        self.done: dict[int, list] = {}  # serial -> finished episodes (Episode), in any order
        self.first: dict[int, float] = {}  # serial -> wall clock of its first episode's start
        self.tasks: dict[int, int] = {}  # serial -> its task's position, so that a group can be given again

    def open(self, serial: int, task: int) -> None:
        self.done.setdefault(serial, [])
        self.first.setdefault(serial, time.time())
        self.tasks[serial] = task

    def finish(self, episode) -> tuple[int, list, float] | None:
        """Record a finished episode (tag (serial, j)) -> (serial, its episodes in order, seconds) once complete."""
        serial, _ = episode.tag
        self.done[serial].append(episode)
        if len(self.done[serial]) < self.size:
            return None
        episodes = sorted(self.done.pop(serial), key=lambda e: e.tag[1])
        self.tasks.pop(serial, None)
        return serial, episodes, time.time() - self.first.pop(serial)

    def state(self) -> dict:
        return {
            "done": {s: [e.state() for e in eps] for s, eps in self.done.items()},
            "elapsed": {s: time.time() - t for s, t in self.first.items()},
            "tasks": dict(self.tasks),
        }

    def restore(self, state: dict, task_of) -> None:
        from lrl.rollout import Episode

        self.done = {
            int(s): [Episode.from_state(e, task_of(e["task_id"])) for e in eps]
            for s, eps in state["done"].items()
        }
        self.first = {int(s): time.time() - t for s, t in state["elapsed"].items()}
        self.tasks = {int(s): t for s, t in state.get("tasks", {}).items()}  # absent from older checkpoints


class Worker:
    """The process shell: configuration, weights, messages, heartbeats; its policy decides what runs when."""

    def __init__(self, trainer: int, index: int, setup: Setup, inbox, outbox):
        from lrl.config import Config
        from lrl.envs import make_env, run_tokenizer
        from samplers import make_sampler

        torch.set_num_threads(1)
        self.trainer = trainer
        self.index = index
        self.rank = setup.rank
        self.board = setup.board
        self.inbox = inbox
        self.outbox = outbox
        self.cfg = Config(**setup.cfg)
        self.world = setup.world
        self.spec = make_env(self.cfg, run_tokenizer(self.cfg))
        self.env_generator = torch.Generator().manual_seed(batch_seed(self.cfg.seed + 2, self.rank, index))
        self.failing_spec = self._failing_spec()
        self.tasks = list(self.spec.train_tasks)
        self.task_ids = {t.task_id: t for t in self.tasks}
        with torch.random.fork_rng(devices=[]):  # the copy's initialisation is overwritten by the board's
            self.shadow = setup.model_class(setup.model_config).float().eval()
        self.sampler = make_sampler(self.cfg, self.spec.tok)
        self.version = -1
        self.stats = WorkerStats()
        self.stopping = False
        self.last_beat = 0.0
        policy = Deterministic if self.cfg.deterministic else FreeRunning
        self.policy = policy(self)
        if setup.restore is not None:
            self.policy.restore(setup.restore)
        else:
            self.policy.begin()

    def _failing_spec(self):
        """The env spec whose envs inject the run's worker failures (drawn from the worker's env generator)."""
        from lrl.envs import FailureInjection

        rate = self.cfg.env_failure_rate
        hazard = self.cfg.env_failure_hazard
        generator = self.env_generator if rate or hazard else None
        make = self.spec.make
        return dataclasses.replace(self.spec, make=lambda: FailureInjection(make(), rate, hazard, generator))

    # -- weights ----------------------------------------------------------------------------------------
    def load(self, version: int | None) -> bool:
        """Load `version` from the board (None: the newest, if newer than what is held) -> whether it did.

        An exact version is waited for (a deterministic schedule may ask for one the trainer has not published
        yet); the worker keeps beating while it waits."""
        start = time.perf_counter()
        if version is None:
            newest = self.board.read_newest(self.shadow, self.version)
            if newest is None:
                return False
            version = newest
        else:
            try:
                self.board.wait_for(self.shadow, version, self._waiting)
            except RuntimeError:
                if self.stopping:
                    raise Stopping from None
                raise
        if self.sampler.policy is None:
            self.sampler.setup(self.shadow, version)
        else:
            self.sampler.sync(self.shadow, version)
        self.version = version
        self.stats.switches += 1
        self.stats.switch_seconds += time.perf_counter() - start
        return True

    def _waiting(self) -> bool:
        """While waiting for weights: beat, and answer a checkpoint's Pause (the trainer cannot publish the
        version waited for before its checkpoint is written)."""
        self.beat()
        self.messages(block=False)
        return self.parent_alive() and not self.stopping

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        except Stopping:
            pass
        self.policy.close()

    def _loop(self) -> None:
        while not self.stopping:
            self.messages(block=self.policy.idle())
            if self.stopping:
                break
            start = time.perf_counter()
            self.policy.step()
            self.stats.busy += time.perf_counter() - start
            self.beat()

    def messages(self, block: bool) -> None:
        """Take the messages waiting (with `block`, wait for one, beating meanwhile)."""
        import queue

        while True:
            start = time.perf_counter()
            try:
                message = self.inbox.get(timeout=BEAT) if block else self.inbox.get_nowait()
            except queue.Empty:
                if not block:
                    return
                self.stats.idle += time.perf_counter() - start
                self.beat()
                if self.stopping:
                    return
                continue
            if block:
                self.stats.idle += time.perf_counter() - start
            if isinstance(message, Work):
                self.policy.accept(message)
                block = False
            elif isinstance(message, Pause):
                self.pause()
            elif isinstance(message, Stop):
                self.stopping = True
                return

    def pause(self) -> None:
        """Answer a checkpoint's pause, at this token boundary, with the whole state; then wait to go on."""
        self.outbox.put(Paused(self.index, self.policy.state()))
        while True:
            message = self.inbox.get()
            if isinstance(message, Resume):
                return
            if isinstance(message, Stop):
                self.stopping = True
                return

    # -- health -----------------------------------------------------------------------------------------
    def parent_alive(self) -> bool:
        return os.getppid() == self.trainer

    def beat(self) -> None:
        now = time.monotonic()
        if now - self.last_beat < BEAT:
            return
        self.last_beat = now
        self.stats.slot_seconds = self.policy.slot_seconds()
        self.stats.capacity_seconds = self.policy.capacity_seconds()
        self.outbox.put(Beat(self.index, dataclasses.replace(self.stats)))
        if not self.parent_alive():
            self.stopping = True

    def send(self, message) -> None:
        """Send a result, after a heartbeat with up-to-date totals (so a step's metrics see its own work)."""
        self.last_beat = 0.0
        self.beat()
        self.outbox.put(message)


class _Policy:
    """What both policies share: the engine, its tools, and the episodes of started groups."""

    def __init__(self, worker: Worker):
        self.w = worker
        self.cfg = worker.cfg
        self.groups = Groups(self.cfg.episodes_per_task)
        self.rollout = None
        self._slot_seconds = 0.0  # of rollouts that have ended
        self._capacity_seconds = 0.0
        self._capacity_since = time.monotonic()

    def new_rollout(self, generator, tools, clock=None):
        from lrl.rollout import Rollout

        rollout = Rollout(
            self.w.sampler.decoder(),
            self.w.failing_spec,
            (),
            generator,
            self.w.sampler.sampling,
            self.w.version,
            lockstep=not self.cfg.slots,
            tools=tools,
            clock=clock,
        )
        return rollout

    def slot_seconds(self) -> float:
        current = self.rollout.slot_seconds if self.rollout is not None else 0.0
        return self._slot_seconds + current

    def capacity_seconds(self) -> float:
        return self._capacity_seconds + self.capacity() * (time.monotonic() - self._capacity_since)

    def capacity(self) -> int:
        """Slots: --slots, or in lockstep the size of the worker's share of a batch."""
        share = -(-self.cfg.tasks_per_step // (self.cfg.rollout_workers * self.w.world))
        return self.cfg.slots or share * self.cfg.episodes_per_task

    def finished(self, episodes) -> None:
        for episode in episodes:
            complete = self.groups.finish(episode)
            if complete is not None:
                self.done_group(*complete)

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.tools.close()
        close = getattr(self.w.sampler, "close", None)  # an engine (vLLM) shuts down with the worker
        if close is not None:
            close()


class FreeRunning(_Policy):
    """Units as they come, episodes into free slots, the newest weights at the moments the mode allows."""

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self.units: deque[Work] = deque()  # not started
        self.waiting: deque[tuple[int, int, int]] = (
            deque()
        )  # (serial, j, task) of started units, not in a slot
        cfg = self.cfg
        self.generator = torch.Generator().manual_seed(
            batch_seed(cfg.seed, self.w.rank, 10_000 + worker.index)
        )
        self.tool_generator = torch.Generator().manual_seed(
            batch_seed(cfg.seed + 3, self.w.rank, worker.index)
        )

    def begin(self) -> None:
        self.w.load(None)
        self.rollout = self._rollout()

    def _rollout(self):
        from lrl.envs.workers import make_tools

        return self.new_rollout(self.generator, make_tools(self.cfg, self.tool_generator))

    def accept(self, work: Work) -> None:
        self.units.append(work)

    def idle(self) -> bool:
        return not self.units and not self.waiting and self.rollout.done

    def step(self) -> None:
        newer = self.w.board.version > self.w.version
        drain = self.cfg.partial_rollouts == "drain"
        if newer and (not drain or self.rollout.done) and self.w.load(None):
            self.rollout.switch(self.w.version)
        elif not (newer and drain):  # draining starts nothing new
            self._admit()
        if not self.rollout.done:
            self.finished(self.rollout.advance())

    def _admit(self) -> None:
        if not self.cfg.slots:  # lockstep: a whole unit once the last one is done
            if self.rollout.done and self.units:
                self._open(self.units.popleft())
                self._start(len(self.waiting))
            return
        room = self.cfg.slots - self.rollout.in_flight
        while room > len(self.waiting) and self.units:
            self._open(self.units.popleft())
        self._start(min(room, len(self.waiting)))

    def _open(self, work: Work) -> None:
        for group in work.groups:
            self.groups.open(group.serial, group.task)
            self.waiting.extend((group.serial, j, group.task) for j in range(group.episodes))

    def _start(self, n: int) -> None:
        starting = [self.waiting.popleft() for _ in range(n)]
        if starting:
            tasks = [self.w.tasks[task] for _, _, task in starting]
            self.rollout.add(tasks, tags=[(serial, j) for serial, j, _ in starting])

    def done_group(self, serial: int, episodes: list, seconds: float) -> None:
        self.w.send(GroupDone(self.w.index, serial, episodes, seconds))

    def state(self) -> dict:
        return {
            "units": [dataclasses.asdict(u) for u in self.units],
            "waiting": [list(x) for x in self.waiting],
            "groups": self.groups.state(),
            "rollout": self.rollout.state(),
            "tool_generator": self.tool_generator.get_state(),
            "env_generator": self.w.env_generator.get_state(),
            "version": self.w.version,
        }

    def restore(self, state: dict) -> None:
        from lrl.envs.workers import make_tools
        from lrl.rollout import Rollout

        self.units = deque(_work(u) for u in state["units"])
        self.waiting = deque(tuple(x) for x in state["waiting"])
        self.groups.restore(state["groups"], self.w.task_ids.__getitem__)
        self.tool_generator.set_state(state["tool_generator"])
        self.w.env_generator.set_state(state["env_generator"])
        self.w.load(None)  # free-running: the newest weights; the episodes' earlier tokens keep their tags
        tools = make_tools(self.cfg, self.tool_generator)
        self.rollout = Rollout.restore(
            state["rollout"],
            self.w.sampler.decoder(),
            self.w.failing_spec,
            self.w.task_ids.__getitem__,
            lockstep=not self.cfg.slots,
            tools=tools,
        )
        self.generator = self.rollout.generator
        self.rollout.switch(self.w.version)


class Deterministic(_Policy):
    """Whole batches in order, each from generators of its own, on a logical clock (see the module)."""

    def __init__(self, worker: Worker):
        super().__init__(worker)
        self.batches: deque[Work] = deque()
        self.current: Work | None = None
        self.waiting: deque[tuple[int, int, int]] = deque()
        self.tool_generator: torch.Generator | None = None

    def begin(self) -> None:
        pass

    def accept(self, work: Work) -> None:
        self.batches.append(work)

    def idle(self) -> bool:
        return self.current is None and not self.batches

    def step(self) -> None:
        if self.current is None:
            if not self.batches:
                return
            # its version first, waiting if need be: a checkpoint meanwhile finds the batch still queued
            self.w.load(self.batches[0].start_version)
            self._begin_batch(self.batches.popleft())
        self._switch_on_schedule()
        room = (self.cfg.slots or len(self.waiting)) - self.rollout.in_flight
        if self.waiting and room > 0 and (self.cfg.slots or self.rollout.done):
            starting = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            tasks = [self.w.tasks[task] for _, _, task in starting]
            self.rollout.add(tasks, tags=[(serial, j) for serial, j, _ in starting])
        self.finished(self.rollout.advance())
        if self.rollout.done and not self.waiting:
            self._end_batch()

    def _begin_batch(self, work: Work) -> None:
        from lrl.envs.workers import LogicalClock, make_tools

        cfg = self.cfg
        b = work.batch
        self.current = work
        generator = torch.Generator().manual_seed(batch_seed(cfg.seed, self.w.rank, b))
        self.w.env_generator.manual_seed(batch_seed(cfg.seed + 2, self.w.rank, b))
        self.tool_generator = torch.Generator().manual_seed(batch_seed(cfg.seed + 3, self.w.rank, b))
        clock = LogicalClock()
        self.rollout = self.new_rollout(generator, make_tools(cfg, self.tool_generator, clock), clock)
        self.batch_done: dict[int, list] = {}
        self.batch_started = time.time()
        for group in work.groups:
            self.groups.open(group.serial, group.task)
            self.waiting.extend((group.serial, j, group.task) for j in range(group.episodes))

    def _switch_on_schedule(self) -> None:
        """With interrupt: every switch_tokens decode steps, the next scheduled version (waited for)."""
        every = self.cfg.switch_tokens
        steps = self.rollout.decode_steps
        if self.cfg.partial_rollouts != "interrupt" or not steps or steps % every:
            return
        b = self.current.batch
        v0 = self.current.start_version
        scheduled = min(v0 + steps // every, max(b - 1, v0))
        if scheduled > self.w.version:
            self.w.load(scheduled)
            self.rollout.switch(self.w.version)

    def done_group(self, serial: int, episodes: list, seconds: float) -> None:
        self.batch_done[serial] = episodes

    def _end_batch(self) -> None:
        seconds = time.time() - self.batch_started
        self.w.send(BatchDone(self.w.index, self.current.batch, self.batch_done, seconds))
        self._slot_seconds += self.rollout.slot_seconds
        self.current = None
        self.rollout = None

    def state(self) -> dict:
        current = None
        if self.current is not None:
            current = {
                "work": dataclasses.asdict(self.current),
                "waiting": [list(x) for x in self.waiting],
                "batch_done": {s: [e.state() for e in eps] for s, eps in self.batch_done.items()},
                "elapsed": time.time() - self.batch_started,
                "rollout": self.rollout.state(),
                "tool_generator": self.tool_generator.get_state(),
                "env_generator": self.w.env_generator.get_state(),
                "version": self.w.version,
            }
        return {
            "batches": [dataclasses.asdict(b) for b in self.batches],
            "groups": self.groups.state(),
            "current": current,
        }

    def restore(self, state: dict) -> None:
        from lrl.envs.workers import LogicalClock, make_tools
        from lrl.rollout import Episode, Rollout

        self.batches = deque(_work(b) for b in state["batches"])
        self.groups.restore(state["groups"], self.w.task_ids.__getitem__)
        current = state["current"]
        if current is None:
            return
        self.current = _work(current["work"])
        self.waiting = deque(tuple(x) for x in current["waiting"])
        task_of = self.w.task_ids.__getitem__
        self.batch_done = {
            int(s): [Episode.from_state(e, task_of(e["task_id"])) for e in eps]
            for s, eps in current["batch_done"].items()
        }
        self.batch_started = time.time() - current["elapsed"]
        self.tool_generator = torch.Generator()
        self.tool_generator.set_state(current["tool_generator"])
        self.w.env_generator.set_state(current["env_generator"])
        self.w.load(current["version"])
        clock = LogicalClock()
        self.rollout = Rollout.restore(
            current["rollout"],
            self.w.sampler.decoder(),
            self.w.failing_spec,
            task_of,
            lockstep=not self.cfg.slots,
            tools=make_tools(self.cfg, self.tool_generator, clock),
            clock=clock,
        )


def _work(state: dict) -> Work:
    """A Work record back from its plain-data form."""
    groups = [Group(**g) for g in state["groups"]]
    return Work(groups, state["batch"], state["start_version"])
