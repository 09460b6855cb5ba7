"""The staleness policy in the simulator: the pipeline's own policy objects (:mod:`lrl.pipeline.policies`), built
from the registry as a run builds its own and driven through the views the pipeline gives them, so that every
registered policy, a plugin's included, is simulated by the code it trains with.

- :func:`make_policy`: the policy a simulated run uses, built from a name as ``--stale-policy`` names it;
- :class:`SimSchedule`: the event model's groups as a policy's take sees the controller's schedule
  (:class:`lrl.pipeline.policies.ScheduleView`): the finished groups ``(serial, episodes)`` in the order they
  finished, the groups out and the worker of each, the simulated clock, and asks to cut that the workers answer
  at once (a group at least half finished is sent without its unfinished episodes; any other is declined);
- :class:`SimWorker`: a simulated worker as :meth:`~lrl.pipeline.policies.StalePolicy.published` sees one
  (:class:`lrl.pipeline.policies.WorkerView`).

A simulated episode shows a policy one action-token version, the one it started on (its oldest token): its
``version`` and ``generated`` are that tag alone.
"""

from __future__ import annotations

import math
from dataclasses import fields
from types import SimpleNamespace
from typing import NamedTuple

from lrl.pipeline.policies import DEFAULT_POLICY, Drop, StalePolicy, make_stale_policy
from lrl.registry import STALENESS
from lrl.sections import OPTIONS, SECTIONS

HOOKS = ("choose", "verdict", "published")  # what decides which work is trained, stopped or cut


class Tags(NamedTuple):
    """A simulated episode as a policy reads one: its action tokens' versions (the one it started on)."""

    version: tuple[int, ...]
    generated: tuple[bool, ...]


def policy_options(**given) -> SimpleNamespace:
    """What a policy is built with: every option's default (by its flat name, and each section with its
    defaults), `given` over them; a policy reads its options as it reads a run's config."""
    flat = {name: opt.default for name, opt in OPTIONS.items()}
    flat.update(given)
    sections = {
        section: kind(**{f.name: flat[f.name] for f in fields(kind) if f.name in given})
        for section, kind in SECTIONS.items()
    }
    return SimpleNamespace(**flat, **sections)


def make_policy(name: str = DEFAULT_POLICY, *, drop: bool = True, patience: float = math.inf) -> StalePolicy:
    """The registered policy `name`, as a run with ``--stale-policy name`` builds it (``drop=False``: the
    throttle alone, as ``--staleness-drop false``). `patience`: the take patience in seconds
    (``--take-patience``; inf: none given). ValueError for a name not registered."""
    if name not in STALENESS:
        raise ValueError(f"policy: one of {', '.join(STALENESS)} (a plugin's: load it first), not {name!r}")
    options = policy_options(
        stale_policy=name,
        staleness_drop=drop,
        take_patience=None if math.isinf(patience) else float(patience),
    )
    return make_stale_policy(options)


def acts_as_drop(name: str) -> bool:
    """Whether the registered policy `name` takes, judges and stops work as ``drop`` does (its deciding hooks are
    drop's own): what the windowed model (:mod:`lrl_lab.sim.windowed`) simulates."""
    policy = make_policy(name)
    return all(getattr(type(policy), hook) is getattr(Drop, hook) for hook in HOOKS)


class SimSchedule:
    """The event model's groups (:class:`lrl_lab.sim.event.EventModel`) as the controller's schedule, for its
    policy's take: :meth:`take` -> the groups of the batch, or None (the take waits)."""

    def __init__(self, model, policy: StalePolicy):
        self.model, self.policy = model, policy
        self.groups_per_batch = model.G
        self.ready: list = []  # (serial, [Tags]) of each finished group, in the order they finished
        self.cutting: set[int] | None = None
        self.answered = False  # asks to cut were answered during this choice

    @property
    def now(self) -> float:
        return self.model.t

    @property
    def owner(self) -> dict[int, int]:
        return self.model.groups.worker  # group -> its worker, until it is finished

    def take(self) -> list[int] | None:
        """The groups the policy chooses, in its order (the rest wait, in their order); None: it waits. A choice
        that asked to cut is asked again at once: the simulated workers have answered."""
        groups = self.model.groups
        for _ in range(2):
            self.ready = [
                (g, [Tags((ep.version,), (True,)) for ep in groups.episodes[g]]) for g in groups.finished
            ]
            self.answered = False
            positions = self.policy.choose(self)
            if positions is not None:
                chosen = [self.ready[i][0] for i in positions]
                groups.keep_unchosen(chosen)
                return chosen
            if not self.answered:
                return None
        return None

    def ask_cut(self, serials, now: float) -> None:
        """Each worker holding one of `serials` sends it without its unfinished episodes if at least half of it
        has finished, else declines: at once."""
        left, size = self.model.groups.left, self.model.E
        for g in serials:
            if g in left and 2 * (size - left[g]) >= size:
                self.model.cut_group(g, now)
        self.cutting, self.answered = set(), True

    def cuts_answered(self) -> None:
        self.cutting = None


class SimWorker:
    """A simulated worker at `now`, as a policy's :meth:`~lrl.pipeline.policies.StalePolicy.published` acts on
    it (the event model's mechanisms)."""

    def __init__(self, model, worker, now: float):
        self.model, self.worker, self.now = model, worker, now

    def abort_stale(self, version: int) -> int:
        return self.model.abort_stale(self.worker, self.now, version)

    def cut_stragglers(self, version: int) -> int:
        return self.model.cut_short(self.worker, self.now, version)


__all__ = ["SimSchedule", "SimWorker", "Tags", "acts_as_drop", "make_policy", "policy_options"]
