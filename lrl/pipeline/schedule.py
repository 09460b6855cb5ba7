"""The controller's two scheduling policies: which work goes to which worker when, and which finished work a
batch is made of. The worker's side of each is in :mod:`lrl.pipeline.worker`.

Both obey the **throttle**: by the time the trainer is at version ``v``, at most ``(v + 1 + max_staleness) *
groups_per_batch`` groups have been handed out (AReaL's capacity rule, counted in episodes started), so no more
work starts than can be trained within the bound. Both also respect each worker's **capacity**: a worker is
sent work only while what it holds fits its slots plus one unit more, so a bound far above the run's length
never floods a queue.

- :class:`FreeSchedule`: each batch's groups are split round robin into one unit per worker; the trainer takes
  the oldest *finished* groups, whatever batch they were drawn for (``--stale-policy oldest-first``: the finished
  groups whose oldest action token is oldest, so that those closest to the bound are trained before they pass it;
  ``ordered``: the earliest *issued* finished groups, once no group issued before them is still out; once it
  has waited ``--take-patience`` seconds for one, it asks the workers to send each such group with at least half
  of it finished without the rest (:class:`~lrl.pipeline.messages.Cut`), and takes once they have answered).
- :class:`DeterministicSchedule`: batch ``b`` goes whole to worker ``b mod W`` and starts on version
  ``max(0, b - max_staleness)``; the trainer takes batches in order.
"""

from __future__ import annotations

import math
import time
from collections import deque

from lrl.pipeline.messages import BatchDone, CutDone, Group, GroupDone, Work


class _Schedule:
    def __init__(self, groups_per_batch: int, episodes_per_group: int, workers: int, eta: int, slots: int):
        self.groups_per_batch = groups_per_batch
        self.episodes_per_group = episodes_per_group
        self.workers = workers
        self.max_staleness = eta
        self.share = -(-groups_per_batch // workers) * episodes_per_group  # episodes of a worker's unit
        self.capacity = (
            max(slots, self.share) + self.share
        )  # what a worker may hold: its slots, one unit more
        self.held = [0] * workers  # episodes each worker holds (sent, not yet back)
        self.issued_batches = 0
        self.oldest_first = False  # take the finished groups with the oldest tokens first (--stale-policy)
        self.ordered = False  # take the earliest issued finished groups, waiting for earlier ones (--stale-policy)
        self.outbox: list[tuple[int, list[int]]] = []  # (worker, serials) to send a Cut to (ordered)
        self.patience = math.inf  # seconds an ordered take waits for an earlier group (--take-patience)
        self.patience_steps: float | None = None  # or in trainer steps (--take-patience-steps)

    def limit(self, version: int) -> int:
        """Batches the throttle lets start by the time the trainer is at `version`."""
        return version + 1 + self.max_staleness


class FreeSchedule(_Schedule):
    """Units round robin as the throttle and the workers' capacity allow; oldest finished groups first."""

    def __init__(self, *args):
        super().__init__(*args)
        self.ready: deque[tuple[int, list]] = deque()  # finished (serial, episodes), oldest finished first
        self.seconds: dict[int, float] = {}  # serial -> its generation time
        self.owner: dict[int, int] = {}  # serial -> the worker it was sent to, while its group is out
        self.deadline: float | None = None  # until when an ordered take waits (time.monotonic)
        self.cutting: set[int] | None = None  # serials asked to be cut, not answered yet (None: none asked)
        self.cut_asked = 0.0  # when the Cut of the wait going on was asked (time.monotonic)
        self.cut_wait = 0.0  # seconds from asking a Cut to its last answer, summed since the last step's report

    def issue(self, version: int, new_groups, send) -> None:
        """Hand out every batch allowed now: `new_groups()` draws a batch's groups, `send(w, Work)` sends."""
        while self.issued_batches < self.limit(version):
            units = [list(range(w, self.groups_per_batch, self.workers)) for w in range(self.workers)]
            if any(
                self.held[w] + len(u) * self.episodes_per_group > self.capacity
                for w, u in enumerate(units)
                if u
            ):
                return  # a worker is full: the rest waits for its results
            groups = new_groups()
            for w, unit in enumerate(units):
                if unit:
                    self.owner.update((groups[i].serial, w) for i in unit)
                    send(w, Work([groups[i] for i in unit], self.issued_batches))
                    self.held[w] += len(unit) * self.episodes_per_group
            self.issued_batches += 1

    def accept(self, message) -> None:
        if isinstance(message, CutDone):
            if self.cutting is not None:
                self.cutting -= set(message.declined)
        elif isinstance(message, GroupDone):
            self.owner.pop(message.serial, None)
            if self.cutting is not None:
                self.cutting.discard(message.serial)
            self.ready.append((message.serial, message.episodes))
            self.seconds[message.serial] = message.seconds
            self.held[message.worker] -= self.episodes_per_group  # the whole group, cut episodes included

    def take(self) -> list[tuple[int, list]] | None:
        """The batch's groups, once enough have finished -> [(serial, episodes)], or None (not yet): the oldest
        finished, or with ``oldest_first`` the ones whose oldest action token is oldest (closest to the bound,
        or past it), in the order they finished among equals."""
        if len(self.ready) < self.groups_per_batch:
            return None
        if self.ordered:
            return self._take_ordered()
        if not self.oldest_first:
            return [self.ready.popleft() for _ in range(self.groups_per_batch)]
        ranked = sorted(range(len(self.ready)), key=lambda i: (oldest_tag(self.ready[i][1]), i))
        chosen = set(ranked[: self.groups_per_batch])
        taken = [g for i, g in enumerate(self.ready) if i in chosen]
        self.ready = deque(g for i, g in enumerate(self.ready) if i not in chosen)
        return sorted(taken, key=lambda g: oldest_tag(g[1]))

    def _take_ordered(self) -> list[tuple[int, list]] | None:
        """``ordered``: the G earliest issued finished groups, in serial order, once no group issued before the
        last of them is still out. After ``patience`` seconds of waiting for one, the workers are asked to cut
        every such group (``outbox``: the source sends the Cut messages), and the take waits for their answers
        (the group, sent without its unfinished episodes, or a refusal), then takes without what is still out."""
        if self.cutting is None:
            ranked = self._ranked()
            last = self.ready[ranked[-1]][0]
            earlier = sorted(s for s in self.owner if s < last)
            if earlier:
                now = time.monotonic()
                if self.deadline is None:
                    self.deadline = now + self.patience
                if now < self.deadline:
                    return None
                self.cutting = set(earlier)
                self.cut_asked = now
                by_worker: dict[int, list[int]] = {}
                for serial in earlier:
                    by_worker.setdefault(self.owner[serial], []).append(serial)
                self.outbox.extend(sorted(by_worker.items()))
                return None
        elif self.cutting:
            return None  # answers still to come
        else:
            self.cut_wait += time.monotonic() - self.cut_asked
        self.deadline = self.cutting = None
        chosen = set(self._ranked())
        taken = [g for i, g in enumerate(self.ready) if i in chosen]
        self.ready = deque(g for i, g in enumerate(self.ready) if i not in chosen)
        return sorted(taken, key=lambda g: g[0])

    @property
    def flying(self) -> set[int]:
        """The serials issued whose group has not come back."""
        return set(self.owner)

    def _ranked(self) -> list[int]:
        """Positions in ``ready`` of the G earliest issued finished groups."""
        return sorted(range(len(self.ready)), key=lambda i: self.ready[i][0])[: self.groups_per_batch]

    @property
    def queued(self) -> int:
        return sum(len(eps) for _, eps in self.ready)

    def state_dict(self) -> dict:
        return {
            "ready": [(s, [e.state() for e in eps]) for s, eps in self.ready],
            "seconds": dict(self.seconds),
            "held": list(self.held),
            "issued_batches": self.issued_batches,
            "owner": {int(k): v for k, v in self.owner.items()},
        }

    def load_state_dict(self, state: dict, episode) -> None:
        self.ready = deque((s, [episode(e) for e in eps]) for s, eps in state["ready"])
        self.seconds = {int(k): v for k, v in state["seconds"].items()}
        self.held = list(state["held"])
        self.issued_batches = state["issued_batches"]
        # a checkpoint from before it was kept: lrl.pipeline.source rebuilds it
        self.owner = {int(k): v for k, v in state.get("owner", {}).items()}
        self.deadline = self.cutting = None  # a wait begins again after a resume
        self.outbox = []


class DeterministicSchedule(_Schedule):
    """Batch b whole to worker b mod W, on version max(0, b - eta); batches taken in order."""

    def __init__(self, *args):
        super().__init__(*args)
        self.capacity = (
            2 * self.groups_per_batch * self.episodes_per_group
        )  # the batch being generated and the next one
        self.batches: dict[int, dict[int, list]] = {}  # finished batch -> {serial: episodes}
        self.seconds: dict[int, float] = {}
        self.taken = 0

    def issue(self, version: int, new_groups, send) -> None:
        while self.issued_batches < self.limit(version):
            b = self.issued_batches
            w = b % self.workers
            if self.held[w] + self.groups_per_batch * self.episodes_per_group > self.capacity:
                return  # in order: a later batch never overtakes a waiting one
            send(w, Work(new_groups(), b, max(0, b - self.max_staleness)))
            self.held[w] += self.groups_per_batch * self.episodes_per_group
            self.issued_batches += 1

    def accept(self, message) -> None:
        if isinstance(message, BatchDone):
            self.batches[message.batch] = message.groups
            self.seconds.update({serial: message.seconds for serial in message.groups})
            self.held[message.worker] -= self.groups_per_batch * self.episodes_per_group

    def take(self) -> list[tuple[int, list]] | None:
        if self.taken not in self.batches:
            return None
        groups = sorted(self.batches.pop(self.taken).items())
        self.taken += 1
        return groups

    @property
    def queued(self) -> int:
        return sum(len(e) for b in self.batches.values() for e in b.values())

    def state_dict(self) -> dict:
        return {
            "batches": {
                b: {s: [e.state() for e in eps] for s, eps in g.items()} for b, g in self.batches.items()
            },
            "seconds": dict(self.seconds),
            "held": list(self.held),
            "issued_batches": self.issued_batches,
            "taken": self.taken,
        }

    def load_state_dict(self, state: dict, episode) -> None:
        self.batches = {
            int(b): {int(s): [episode(e) for e in eps] for s, eps in g.items()}
            for b, g in state["batches"].items()
        }
        self.seconds = {int(k): v for k, v in state["seconds"].items()}
        self.held = list(state["held"])
        self.issued_batches = state["issued_batches"]
        self.taken = state["taken"]


def oldest_tag(episodes: list) -> int:
    """The version of a group's oldest action token (a group without one sorts last)."""
    return min((v for e in episodes for v, g in zip(e.version, e.generated) if g), default=1 << 62)


def make_schedule(cfg, groups_per_batch: int):
    """The controller's policy for a config."""
    policy = DeterministicSchedule if cfg.deterministic else FreeSchedule
    schedule = policy(
        groups_per_batch, cfg.episodes_per_task, cfg.rollout_workers, cfg.max_staleness, cfg.slots
    )
    schedule.oldest_first = cfg.staleness_drop and cfg.stale_policy == "oldest-first"
    schedule.ordered = cfg.staleness_drop and cfg.stale_policy == "ordered"
    schedule.patience = math.inf if cfg.take_patience is None else float(cfg.take_patience)
    schedule.patience_steps = cfg.take_patience_steps  # trainer steps: the source sets `patience` from them
    return schedule


__all__ = ["DeterministicSchedule", "FreeSchedule", "Group", "make_schedule"]
