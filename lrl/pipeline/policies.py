"""Staleness policies (``--stale-policy``): what the asynchronous pipeline does with work past ``--max-staleness``.

A policy is one class with the hooks of :class:`StalePolicy`, registered under its name
(:func:`register_stale_policy`, the registry :data:`lrl.registry.STALENESS`), so a plugin adds one the way it adds
a rollout backend. The pipeline's parts call the hooks and never ask which policy they hold:

- the controller's free-running take (:class:`lrl.pipeline.schedule.FreeSchedule`) asks :meth:`~StalePolicy.choose`
  which finished groups make the batch, in what order, or whether to wait (and may ask workers to cut groups);
- the consumer (:class:`lrl.pipeline.source.AsyncSource`) asks :meth:`~StalePolicy.verdict` of every episode taken:
  keep it, mask its tokens past the bound, or drop it; before each take it tells :meth:`~StalePolicy.measured` the
  trainer's step times, and logs :meth:`~StalePolicy.metrics` with the batch;
- a free-running worker (:class:`lrl.pipeline.worker.free.FreeRunning`) calls :meth:`~StalePolicy.published` once
  for each newer version it sees on the board, with its mechanisms at hand (stop stale episodes, cut groups);
- the simulator (:mod:`lrl_lab.sim.policy`) builds the same objects from the registry and calls the same hooks on its
  own schedule and workers, so a plugin's policy is simulated as it runs (:meth:`~StalePolicy.wakes` tells it
  when a waiting take is to be asked again).

A deterministic run takes batches in order and its workers never stop work (nothing there passes the bound), so
there only :meth:`~StalePolicy.verdict` applies. Built in: ``drop`` (the default), ``mask``, ``abort``,
``oldest-first``, ``cut``, ``ordered`` (docs/pipeline.md, "Staleness policies"), and ``none``, the throttle alone
(``--staleness-drop false``).

Also here, written once for the pipeline and its simulator (:mod:`lrl_lab.sim`): the throttle (:func:`issue_limit`)
and a worker's capacity (:func:`unit_episodes`, :func:`worker_capacity`). This module imports nothing heavy: the
simulator and a spawned worker import it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from lrl.registry import STALENESS

if TYPE_CHECKING:
    from lrl.sections import RolloutOptions


class Verdict(enum.Enum):
    """What the consumer does with one episode it takes."""

    KEEP = "kept"  # trained whole
    MASK = "masked"  # trained; its action tokens older than the bound get no gradient
    DROP = "dropped"  # not trained: recorded, its length logged, its tokens counted as wasted


class ScheduleView(Protocol):
    """What a policy's take reads and asks of the controller's free-running schedule
    (:class:`lrl.pipeline.schedule.FreeSchedule` has it)."""

    groups_per_batch: int  # groups a batch is made of
    ready: list[tuple[int, list[Any]]]  # finished groups (serial, episodes), in the order they finished
    owner: Mapping[int, int]  # serial -> worker, of every group out
    cutting: set[int] | None  # serials asked to be cut and not answered yet; None when none was asked

    @property
    def now(self) -> float:
        """The schedule's clock, in seconds: ``time.monotonic()`` in the pipeline, the simulated time in the
        simulator (:mod:`lrl_lab.sim.policy`)."""

    def ask_cut(self, serials: Sequence[int], now: float) -> None:
        """Ask the workers holding `serials` to send them without their unfinished episodes."""

    def cuts_answered(self) -> None:
        """Close an ask whose every cut was answered."""


class WorkerView(Protocol):
    """What a policy does to the work a free-running worker holds (:class:`lrl.pipeline.worker.mode.Mode` has it)."""

    def abort_stale(self, version: int) -> int:
        """Stop the episodes that can no longer be trained within the bound at `version`; start their tasks again -> how many."""

    def cut_stragglers(self, version: int) -> int:
        """Send the groups at their last trainable version without their unfinished episodes, if half finished -> how many."""


class StalePolicy(Protocol):
    """The hooks of a staleness policy. :class:`Drop` has them all; a policy that differs in one overrides it."""

    name: ClassVar[str]  # its registered name (set by register_stale_policy)

    def choose(self, schedule: ScheduleView) -> list[int] | None:
        """The free-running take, once ``schedule.groups_per_batch`` groups have finished -> the positions in
        ``schedule.ready`` (finished groups ``(serial, episodes)``, in the order they finished) of the batch's
        groups, in the order they are trained; None: wait (the take is asked again as messages come).

        It may read ``schedule.owner`` (serial -> worker of each group out) and ask the workers to send groups
        without their unfinished episodes (``schedule.ask_cut``; ``schedule.cutting`` holds those not answered
        yet, None when none was asked, and ``schedule.cuts_answered()`` closes an answered ask)."""

    def verdict(self, tags: Sequence[int], oldest: int) -> Verdict:
        """An episode taken whose action tokens carry the versions `tags`, where `oldest` is the oldest version a
        trained token may have -> keep, mask (its tokens older than `oldest`) or drop it."""

    def published(self, worker: WorkerView, version: int) -> None:
        """A free-running worker sees `version` on the board, newer than any it saw before (its weights may still
        be older): what it does to the work it holds (``worker.abort_stale``, ``worker.cut_stragglers``)."""

    def measured(self, trainer_seconds: Sequence[float]) -> None:
        """Before each take: the trainer's last step times (seconds, oldest first; none before its first)."""

    def metrics(self) -> dict[str, float]:
        """What the policy logs with the batch just taken (``pipeline/...`` keys)."""

    def wakes(self) -> float | None:
        """While a take waits (:meth:`choose` returned None): when, on the schedule's clock (``schedule.now``), it
        is to be asked again though no group came; None: only when one comes. The pipeline asks again at every
        message and at least every poll; the simulator (:mod:`lrl_lab.sim`) asks again at this time."""


def register_stale_policy(name: str, *, uses=(), check=None, help: str = ""):
    """Class decorator: register a policy class under `name` (its ``name`` becomes that). The class is built with
    the run's rollout options (:class:`lrl.sections.RolloutOptions`, which hold every staleness option),
    ``cls(rollout)``; ``uses``, ``check`` and ``help`` are as for every registry entry."""

    def add(cls):
        STALENESS.register(name, uses=uses, check=check, help=help)(cls)  # raises before anything changes
        cls.name = name
        return cls

    return add


def make_stale_policy(rollout: RolloutOptions) -> StalePolicy:
    """The run's policy: ``stale_policy``, or ``none`` where ``staleness_drop`` is false."""
    name = rollout.stale_policy if rollout.staleness_drop else ThrottleOnly.name
    return STALENESS.get(name).factory(rollout)


def oldest_tag(episodes: Sequence) -> int:
    """The version of a group's oldest action token (a group without one sorts last)."""
    return min((v for e in episodes for v, g in zip(e.version, e.generated) if g), default=1 << 62)


def earliest_issued(ready: Sequence[tuple[int, list]], count: int) -> list[int]:
    """Positions in `ready` of the `count` groups issued first (the smallest serials), in serial order."""
    return sorted(range(len(ready)), key=lambda i: ready[i][0])[:count]


# -- the built-in policies ----------------------------------------------------------------------------------
@register_stale_policy("drop")
class Drop:
    """drop an episode past the bound when the trainer takes its group"""

    name: ClassVar[str]

    def __init__(self, rollout: RolloutOptions | None = None):
        pass

    def choose(self, schedule: ScheduleView) -> list[int] | None:
        return list(range(schedule.groups_per_batch))  # the oldest finished

    def verdict(self, tags: Sequence[int], oldest: int) -> Verdict:
        return Verdict.DROP if tags and min(tags) < oldest else Verdict.KEEP

    def published(self, worker: WorkerView, version: int) -> None:
        pass

    def measured(self, trainer_seconds: Sequence[float]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def wakes(self) -> float | None:
        return None


@register_stale_policy("none")
class ThrottleOnly(Drop):
    """train everything the throttle let start (--staleness-drop false): the oldest data may pass the bound"""

    def verdict(self, tags: Sequence[int], oldest: int) -> Verdict:
        return Verdict.KEEP


@register_stale_policy("mask")
class Mask(Drop):
    """train an episode past the bound with its over-stale action tokens masked (no gradient)"""

    def verdict(self, tags: Sequence[int], oldest: int) -> Verdict:
        return Verdict.MASK if tags and min(tags) < oldest else Verdict.KEEP


@register_stale_policy("abort")
class Abort(Drop):
    """stop an episode in the worker once it cannot be trained within the bound, and start its task again"""

    def published(self, worker: WorkerView, version: int) -> None:
        worker.abort_stale(version)


@register_stale_policy("oldest-first")
class OldestFirst(Drop):
    """take the finished groups whose oldest action token is oldest first (then drop)"""

    def choose(self, schedule: ScheduleView) -> list[int] | None:
        """The groups closest to the bound (or past it), in the order they finished among equals."""
        ready = schedule.ready
        tags = [oldest_tag(episodes) for _, episodes in ready]
        return sorted(range(len(ready)), key=lambda i: (tags[i], i))[: schedule.groups_per_batch]


@register_stale_policy("cut")
class Cut(Drop):
    """send a group at its last trainable version without its unfinished episodes, if half finished (then drop)"""

    def published(self, worker: WorkerView, version: int) -> None:
        worker.cut_stragglers(version)


@register_stale_policy("ordered", uses=("take_patience", "take_patience_steps"))
class Ordered(Drop):
    """take the earliest issued finished groups, waiting (up to a patience) for any issued before them (then drop)

    After ``patience`` seconds of waiting for an earlier group (``--take-patience``, or ``--take-patience-steps``
    times the trainer's median step), the workers are asked to cut every such group, and the take waits for their
    answers (the group, sent without its unfinished episodes, or a refusal), then takes without what is still out.
    """

    def __init__(self, rollout: RolloutOptions | None = None):
        given = None if rollout is None else rollout.take_patience
        self.patience = (
            math.inf if given is None else float(given)
        )  # seconds a take waits for an earlier group
        self.patience_steps: float | None = None if rollout is None else rollout.take_patience_steps
        self.deadline: float | None = None  # until when the take going on waits (the schedule's clock)

    def measured(self, trainer_seconds: Sequence[float]) -> None:
        if self.patience_steps is not None:
            self.patience = patience_seconds(self.patience_steps, trainer_seconds)

    def metrics(self) -> dict[str, float]:
        if self.patience_steps is not None and math.isfinite(self.patience):
            return {"pipeline/take_patience": self.patience}  # the patience this take had, in seconds
        return {}

    def choose(self, schedule: ScheduleView) -> list[int] | None:
        ready, count = schedule.ready, schedule.groups_per_batch
        if schedule.cutting is None:
            last = ready[earliest_issued(ready, count)[-1]][0]
            earlier = sorted(s for s in schedule.owner if s < last)
            if earlier:
                now = schedule.now
                if self.deadline is None:
                    self.deadline = now + self.patience
                if now < self.deadline:
                    return None
                schedule.ask_cut(earlier, now)
                return None
        elif schedule.cutting:
            return None  # answers still to come
        else:
            schedule.cuts_answered()
        self.deadline = None
        return earliest_issued(ready, count)

    def wakes(self) -> float | None:
        return self.deadline  # a take waiting for an earlier group asks for its cut then


def patience_seconds(steps: float, trainer_seconds: Sequence[float]) -> float:
    """``--take-patience-steps``: `steps` times the median of the trainer's measured step times (the upper
    median of an even count); inf while none is measured."""
    measured = sorted(trainer_seconds)
    return steps * measured[len(measured) // 2] if measured else math.inf


# the built-in policies that act past the bound, in the order the docs and the lab list them (--stale-policy offers
# every registered name, ``none`` and a plugin's among them)
STALE_POLICIES = tuple(cls.name for cls in (Drop, Mask, Abort, OldestFirst, Cut, Ordered))
DEFAULT_POLICY = Drop.name  # --stale-policy's default


def is_default(name: str) -> bool:
    """Whether `name` is the policy of a run that leaves ``--stale-policy`` unset (the lab files such runs under no
    policy's name). The one place a policy's name is compared, so no part switches on which policy it holds."""
    return name == DEFAULT_POLICY


def takes_patience(name: str) -> bool:
    """Whether the policy registered as `name` reads a take patience (``--take-patience``,
    ``--take-patience-steps``); False for a name that is not registered."""
    entry = STALENESS.get(name, None)
    return entry is not None and "take_patience" in entry.uses


# -- the throttle and a worker's capacity (the pipeline and the simulator) ----------------------------------------
def issue_limit(version: int, max_staleness: int) -> int:
    """Batches the throttle lets start by the time the trainer is at `version` (AReaL's capacity rule)."""
    return version + 1 + max_staleness


def unit_episodes(groups_per_batch: int, workers: int, group_size: int) -> int:
    """Episodes of a worker's unit: its round-robin share of a batch's groups (the largest share)."""
    return -(-groups_per_batch // workers) * group_size


def worker_capacity(slots: int, unit: int) -> int:
    """Episodes a free-running worker may hold: its slots, and one unit more (at least two units)."""
    return max(slots, unit) + unit


__all__ = [
    "DEFAULT_POLICY",
    "STALE_POLICIES",
    "Abort",
    "Cut",
    "Drop",
    "Mask",
    "OldestFirst",
    "Ordered",
    "ScheduleView",
    "StalePolicy",
    "ThrottleOnly",
    "Verdict",
    "WorkerView",
    "issue_limit",
    "make_stale_policy",
    "is_default",
    "oldest_tag",
    "patience_seconds",
    "register_stale_policy",
    "takes_patience",
    "unit_episodes",
    "worker_capacity",
]
