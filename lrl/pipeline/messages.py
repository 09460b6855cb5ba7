"""What the controller and its rollout workers say to each other: typed records, one class per message.

Controller to worker: :class:`Setup` (once, first), :class:`Work`, :class:`Cut`, :class:`Pause`,
:class:`Resume`, :class:`Stop`. Worker to controller: :class:`GroupDone` (free-running), :class:`BatchDone`
(deterministic), :class:`CutDone`, :class:`Beat`, :class:`Paused`, :class:`Failed`. Episodes travel as :class:`lrl.rollout.Episode` objects
between live processes; what is saved in a checkpoint is plain data (``Episode.state()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Group:
    """One task's group of episodes: `serial` numbers it in the rank's order of issue, `task` is the task's
    position in the rank's train tasks."""

    serial: int
    task: int
    episodes: int


@dataclass
class Setup:
    """Everything a worker needs that is too heavy for its process arguments: sent first, after spawn."""

    # the run's lrl.config.Config, as its values on the way (a pickled config is rebuilt by Config.resolved:
    # plugins loaded, nothing checked again), so that the worker never imports the config that imports it
    cfg: Any
    rank: int
    world: int  # ranks in the run (the worker's share of a batch depends on it)
    board: Any  # a lrl.pipeline.backends.base.Board: shared memory, or Ray's object store
    model_class: type
    model_config: Any
    restore: dict | None  # the worker's state from a checkpoint, or None for a fresh start
    # the worker's own copy of the model, built beforehand by a backend whose workers share the trainer's process
    # (so that its initialisation never draws from the global generator while the trainer runs); None: built
    # by the worker
    shadow: Any = None


@dataclass
class Work:
    """Groups to generate. Free-running: one unit (a worker's share of a batch); deterministic: one whole
    batch `batch`, to start on version `start_version`."""

    groups: list[Group]
    batch: int
    start_version: int | None = None


@dataclass
class Cut:
    """Send each of these groups that has at least half of its episodes finished now, without the rest (the
    controller ran out of patience waiting for them: ``--stale-policy ordered``); answer :class:`CutDone`."""

    serials: list[int]


@dataclass
class CutDone:
    worker: int
    declined: list[int]  # the serials of the Cut not sent: not held any more, or less than half finished


@dataclass
class Pause:
    """Answer with your whole state at the next token boundary, then wait for Resume or Stop."""


@dataclass
class Resume:
    pass


@dataclass
class Stop:
    pass


@dataclass
class GroupDone:
    worker: int
    serial: int
    episodes: list  # lrl.rollout.Episode, in the group's order
    seconds: float  # from the group's first episode starting to its last ending


@dataclass
class BatchDone:
    worker: int
    batch: int
    groups: dict[int, list]  # serial -> episodes
    seconds: float


@dataclass
class WorkerStats:
    """A worker's running totals (seconds unless named otherwise); the controller differences them per step."""

    idle: float = 0.0  # waiting for work
    busy: float = 0.0  # engine steps
    slot_seconds: float = 0.0  # summed over episodes in flight
    capacity_seconds: float = 0.0  # summed over the slots it has
    switches: int = 0  # weight loads
    switch_seconds: float = 0.0  # spent loading weights (decoding paused)
    restarts: int = 0  # times the worker was replaced after it died (Ray actors, --worker-restarts)
    lost: int = 0  # episodes in flight on a worker that died, generated again by its replacement
    decoding: float = 0.0  # slot-seconds of episodes decoding an action
    ready: float = 0.0  # slot-seconds of episodes whose tool answered, waiting for the engine's next step
    tool: float = 0.0  # slot-seconds of episodes waiting for their tool
    paused: float = 0.0  # slot-seconds of episodes in flight while the worker loaded weights
    aborted: int = 0  # episodes stopped past the staleness bound and started again (--stale-policy abort)
    aborted_tokens: int = 0  # the action tokens those episodes had decoded (never trained)
    cut: int = 0  # episodes left out of their group so that it could be trained within the bound (--stale-policy cut)
    cut_tokens: int = 0  # the action tokens those episodes had decoded (never trained)


@dataclass
class Beat:
    worker: int
    stats: WorkerStats = field(default_factory=WorkerStats)
    timeline: list = field(
        default_factory=list
    )  # occupancy samples since the last beat (lrl.rollout.Rollout)


@dataclass
class Paused:
    worker: int
    state: dict


@dataclass
class Failed:
    worker: int
    error: str
    where: str
