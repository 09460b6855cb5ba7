"""What a rollout worker's scheduling modes share: the engine and its tools, the groups it has started, the
admission of waiting episodes into the engine, and the worker's slot accounting.

A mode is one class (:class:`lrl.pipeline.worker.free.FreeRunning`,
:class:`lrl.pipeline.worker.deterministic.Deterministic`) that decides what runs when and on which weights, and
owns its checkpoint format: ``state()`` / ``restore(state)``, and ``held_work(state)``, the work a state holds,
which a backend gives again to a replacement worker. Nothing outside a mode reads its state's keys.
"""

from __future__ import annotations

import time
from collections import deque

from lrl.pipeline.messages import Group, Work
from lrl.pipeline.policies import oldest_tag, unit_episodes


class Mode:
    """The part of a scheduling mode that does not depend on the mode (see the module docstring)."""

    def __init__(self, worker):
        self.worker = worker
        self.cfg = worker.cfg
        from lrl.pipeline.worker.groups import Groups

        self.groups = Groups(self.cfg.batch.episodes_per_task)
        self.rollout = None
        self.waiting: deque[tuple[int, int, int]] = (
            deque()
        )  # (serial, j, task) of started groups, not in a slot
        self._slot_seconds = 0.0  # of rollouts that have ended
        self._phase_seconds = {
            "decoding": 0.0,
            "ready": 0.0,
            "tool": 0.0,
            "paused": 0.0,
        }  # the same, by state
        self._capacity_seconds = 0.0
        self._capacity_since = time.monotonic()

    # -- what every mode has --------------------------------------------------------------------------
    def begin(self) -> None:
        """A fresh start (not a restore)."""

    def accept(self, work: Work) -> None:
        raise NotImplementedError

    def idle(self) -> bool:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def done_group(self, serial: int, episodes: list, seconds: float) -> None:
        """A group's episodes are all finished."""
        raise NotImplementedError

    def state(self) -> dict:
        raise NotImplementedError

    def restore(self, state: dict) -> None:
        raise NotImplementedError

    @staticmethod
    def held_work(state: dict, episodes_per_group: int) -> list[Work] | None:
        """The work a saved state holds, to give again -> [Work] (None: the state does not say)."""
        raise NotImplementedError

    # -- the engine ------------------------------------------------------------------------------------
    def new_rollout(self, generator, tools, clock=None):
        from lrl.rollout import Rollout

        worker = self.worker
        rollout = Rollout(
            worker.sampler.decoder(),
            worker.failing_spec,
            (),
            generator,
            worker.sampler.sampling,
            worker.version,
            lockstep=not self.cfg.rollout.slots,
            tools=tools,
            clock=clock,
        )
        rollout.trace = True  # its occupancy samples go to the controller with each beat
        return rollout

    def open_groups(self, groups: list[Group]) -> None:
        """Groups start: their episodes wait for room in the engine."""
        for group in groups:
            self.groups.open(group.serial, group.task)
            self.waiting.extend((group.serial, j, group.task) for j in range(group.episodes))

    def admit(self) -> int:
        """Start as many waiting episodes as the engine has room for (lrl.rollout.Rollout.room) -> how many."""
        n = min(self.rollout.room(self.cfg.rollout.slots), len(self.waiting))
        starting = [self.waiting.popleft() for _ in range(n)]
        if starting:
            tasks = [self.worker.tasks[task] for _, _, task in starting]
            self.rollout.add(tasks, tags=[(serial, j) for serial, j, _ in starting])
        return n

    def abort_stale(self, version: int) -> int:
        """``--stale-policy abort``: stop every episode in flight that can no longer be trained within the bound
        (the trainer is at `version` or later when it takes it, so an action token older than ``version -
        max_staleness`` is past the bound for good) and put its task first in line, to start again on the
        newest weights -> how many were stopped. What they had decoded is counted as aborted work."""
        oldest = version - self.cfg.rollout.max_staleness
        stopped = self.rollout.abort(lambda episode: oldest_tag([episode]) >= oldest)
        for episode in reversed(stopped):
            serial, j = episode.tag
            self.waiting.appendleft((serial, j, self.groups.tasks[serial]))
        stats = self.worker.stats
        stats.aborted += len(stopped)
        stats.aborted_tokens += sum(sum(e.generated) for e in stopped)
        return len(stopped)

    def cut_stragglers(self, version: int) -> int:
        """``--stale-policy cut``: once the trainer is at `version`, the last version a group whose oldest action
        token is ``version - max_staleness`` can be trained on, send every such group that has at least half of
        its episodes finished without the rest: its unfinished episodes are stopped (those not started are never
        started) and recorded as not trained -> how many episodes were cut."""
        last = version - self.cfg.rollout.max_staleness  # groups this old must be taken now or never
        size = self.cfg.batch.episodes_per_task
        running: dict[int, list] = {}
        for slot in self.rollout.slots.values():
            running.setdefault(slot.episode.tag[0], []).append(slot.episode)
        for serial, _, _ in self.waiting:  # a group whose rest has not started yet
            running.setdefault(serial, [])
        chosen = []
        for serial, episodes in running.items():
            finished = self.groups.done.get(serial, [])
            if 2 * len(finished) < size:
                continue
            if oldest_tag([*finished, *episodes]) == last:  # a group with no action token yet never equals it
                chosen.append(serial)
        return self._cut(chosen)

    def cut_groups(self, serials: list[int]) -> list[int]:
        """The controller's :class:`~lrl.pipeline.messages.Cut`: send each of `serials` this worker holds with at
        least half of its episodes finished without the rest (as ``cut`` does) -> the serials not sent."""
        size = self.cfg.batch.episodes_per_task
        held = {slot.episode.tag[0] for slot in self.rollout.slots.values()} if self.rollout is not None else set()
        held |= {serial for serial, _, _ in self.waiting}
        chosen = [s for s in serials if s in held and 2 * len(self.groups.done.get(s, [])) >= size]
        self._cut(chosen)
        return [s for s in serials if s not in chosen]

    def _cut(self, chosen: list[int]) -> int:
        """Send the groups `chosen` without their unfinished episodes -> how many episodes were cut."""
        if not chosen:
            return 0
        cut = set(chosen)
        stopped = self.rollout.abort(lambda e: e.tag[0] not in cut)
        unstarted = [w for w in self.waiting if w[0] in cut]
        self.waiting = deque(w for w in self.waiting if w[0] not in cut)
        stats = self.worker.stats
        stats.cut += len(stopped) + len(unstarted)
        stats.cut_tokens += sum(sum(e.generated) for e in stopped)
        for serial in chosen:
            self.done_group(*self.groups.cut(serial))
        return len(stopped) + len(unstarted)

    def finished(self, episodes) -> None:
        for episode in episodes:
            complete = self.groups.finish(episode)
            if complete is not None:
                self.done_group(*complete)

    # -- accounting ------------------------------------------------------------------------------------
    def slot_seconds(self) -> float:
        current = self.rollout.slot_seconds if self.rollout is not None else 0.0
        return self._slot_seconds + current

    def phase_seconds(self) -> dict[str, float]:
        """Slot-seconds by occupancy state (lrl.rollout.OCCUPANCY), of every rollout so far."""
        current = self.rollout.phase_seconds if self.rollout is not None else {}
        return {k: v + current.get(k, 0.0) for k, v in self._phase_seconds.items()}

    def end_rollout(self) -> None:
        """The current rollout is done with: keep its totals."""
        self._slot_seconds += self.rollout.slot_seconds
        for k, v in self.rollout.phase_seconds.items():
            self._phase_seconds[k] += v

    def capacity_seconds(self) -> float:
        return self._capacity_seconds + self.capacity() * (time.monotonic() - self._capacity_since)

    def capacity(self) -> int:
        """Slots: --slots, or in lockstep the size of the worker's share of a batch."""
        cfg = self.cfg
        workers = cfg.rollout.rollout_workers * self.worker.world
        batch = cfg.batch
        return cfg.rollout.slots or unit_episodes(batch.tasks_per_step, workers, batch.episodes_per_task)

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.tools.close()
        self.worker.sampler.close()  # an engine (vLLM) shuts down with the worker


def work_from_state(state: dict) -> Work:
    """A Work record back from its plain-data form (dataclasses.asdict)."""
    return Work([Group(**g) for g in state["groups"]], state["batch"], state["start_version"])
