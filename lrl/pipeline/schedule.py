"""The controller's two scheduling policies: which work goes to which worker when, and which finished work a
batch is made of. The worker's side of each is in :mod:`lrl.pipeline.worker`.

Both obey the **throttle**: by the time the trainer is at version ``v``, at most ``(v + 1 + max_staleness) *
groups_per_batch`` groups have been handed out (AReaL's capacity rule, counted in episodes started), so no more
work starts than can be trained within the bound. Both also respect each worker's **capacity**: a worker is
sent work only while what it holds fits its slots plus one unit more, so a bound far above the run's length
never floods a queue (both rules: :mod:`lrl.pipeline.policies`).

- :class:`FreeSchedule`: each batch's groups are split round robin into one unit per worker; the trainer takes
  finished groups, whatever batch they were drawn for, as the run's staleness policy chooses
  (:meth:`lrl.pipeline.policies.StalePolicy.choose`: the oldest finished by default). A policy may ask the workers
  to send groups without their unfinished episodes (:class:`~lrl.pipeline.messages.Cut`, ``ordered`` out of
  patience): the schedule keeps the asks, their answers and the time they took.
- :class:`DeterministicSchedule`: batch ``b`` goes whole to worker ``b mod W`` and starts on version
  ``max(0, b - max_staleness)``; the trainer takes batches in order, whatever the policy.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from lrl.pipeline.messages import BatchDone, CutDone, Group, GroupDone, Work
from lrl.pipeline.policies import Drop, StalePolicy, issue_limit, unit_episodes, worker_capacity

if TYPE_CHECKING:
    from lrl.sections import RolloutOptions


class _Schedule:
    def __init__(
        self,
        groups_per_batch: int,
        episodes_per_group: int,
        workers: int,
        eta: int,
        slots: int,
        policy: StalePolicy | None = None,
    ):
        self.groups_per_batch = groups_per_batch
        self.episodes_per_group = episodes_per_group
        self.workers = workers
        self.max_staleness = eta
        self.policy = policy if policy is not None else Drop()  # the run's staleness policy
        self.share = unit_episodes(groups_per_batch, workers, episodes_per_group)  # episodes of a worker's unit
        self.capacity = worker_capacity(slots, self.share)  # what a worker may hold: its slots, one unit more
        self.held = [0] * workers  # episodes each worker holds (sent, not yet back)
        self.issued_batches = 0
        self.outbox: list[tuple[int, list[int]]] = []  # (worker, serials) to send a Cut to: the source sends them

    def limit(self, version: int) -> int:
        """Batches the throttle lets start by the time the trainer is at `version`."""
        return issue_limit(version, self.max_staleness)

    def metrics(self) -> dict[str, float]:
        """What the schedule logs with each batch."""
        return {}


class FreeSchedule(_Schedule):
    """Units round robin as the throttle and the workers' capacity allow; the policy chooses what is taken."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ready: deque[tuple[int, list]] = deque()  # finished (serial, episodes), oldest finished first
        self.seconds: dict[int, float] = {}  # serial -> its generation time
        self.owner: dict[int, int] = {}  # serial -> the worker it was sent to, while its group is out
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
        """The batch's groups, once enough have finished -> [(serial, episodes)], or None (not yet): those the
        policy chooses, in its order (:meth:`lrl.pipeline.policies.StalePolicy.choose`)."""
        if len(self.ready) < self.groups_per_batch:
            return None
        positions = self.policy.choose(self)
        if positions is None:
            return None
        chosen = set(positions)
        taken = [self.ready[i] for i in positions]
        self.ready = deque(g for i, g in enumerate(self.ready) if i not in chosen)
        return taken

    @property
    def now(self) -> float:
        """The clock a staleness policy's take reads (seconds)."""
        return time.monotonic()

    def ask_cut(self, serials: list[int], now: float) -> None:
        """Ask the workers holding `serials` to send each without its unfinished episodes (``outbox``: the source
        sends the Cut messages); the asks are open (``cutting``) until every one is answered."""
        self.cutting = set(serials)
        self.cut_asked = now
        by_worker: dict[int, list[int]] = {}
        for serial in serials:
            by_worker.setdefault(self.owner[serial], []).append(serial)
        self.outbox.extend(sorted(by_worker.items()))

    def cuts_answered(self) -> None:
        """Every ask is answered: count the time it took, and close it."""
        self.cut_wait += time.monotonic() - self.cut_asked
        self.cutting = None

    def metrics(self) -> dict[str, float]:
        """The seconds the workers took to answer asks to cut since the last batch (0.0 without one)."""
        waited, self.cut_wait = self.cut_wait, 0.0
        return {"pipeline/cut_wait": waited}

    @property
    def flying(self) -> set[int]:
        """The serials issued whose group has not come back."""
        return set(self.owner)

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

    def load_state_dict(self, state: dict, episode, unconsumed=()) -> None:
        """`episode(saved)` makes an episode of its saved state; `unconsumed`: the serials issued and not trained
        yet (the source's ledger), for a checkpoint from before the groups out were kept."""
        self.ready = deque((s, [episode(e) for e in eps]) for s, eps in state["ready"])
        self.seconds = {int(k): v for k, v in state["seconds"].items()}
        self.held = list(state["held"])
        self.issued_batches = state["issued_batches"]
        if "owner" in state:
            self.owner = {int(k): v for k, v in state["owner"].items()}
        else:  # the groups out are those neither consumed nor finished, on a worker not recorded
            ready = {s for s, _ in self.ready}
            self.owner = {s: 0 for s in unconsumed if s not in ready}
        self.cutting = None  # a wait begins again after a resume
        self.outbox = []


class DeterministicSchedule(_Schedule):
    """Batch b whole to worker b mod W, on version max(0, b - eta); batches taken in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
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

    def load_state_dict(self, state: dict, episode, unconsumed=()) -> None:
        self.batches = {
            int(b): {int(s): [episode(e) for e in eps] for s, eps in g.items()}
            for b, g in state["batches"].items()
        }
        self.seconds = {int(k): v for k, v in state["seconds"].items()}
        self.held = list(state["held"])
        self.issued_batches = state["issued_batches"]
        self.taken = state["taken"]


def make_schedule(
    rollout: RolloutOptions, episodes_per_task: int, groups_per_batch: int, policy: StalePolicy | None = None
):
    """The controller's schedule for a run's rollout options and groups of `episodes_per_task` episodes, taking
    finished groups as `policy` chooses (default: drop's)."""
    kind = DeterministicSchedule if rollout.deterministic else FreeSchedule
    return kind(
        groups_per_batch, episodes_per_task, rollout.rollout_workers, rollout.max_staleness, rollout.slots, policy
    )


__all__ = ["DeterministicSchedule", "FreeSchedule", "Group", "make_schedule"]
