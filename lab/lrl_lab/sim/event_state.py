"""The pieces of the event model (:class:`lrl_lab.sim.event.EventModel`): an episode, a worker, the groups issued and
not yet taken, and the tally of what was trained and what was wasted."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from lrl_lab.sim.load import LoadEngine


@dataclass
class Episode:
    index: int
    group: int
    duration: float
    start: float
    end: float
    version: int  # the worker's weights when it started
    switches: list[tuple[float, int]] = field(
        default_factory=list
    )  # (time, version) of each switch in flight
    # the load model: its turns, the turn it is at, tokens decoded per version [(version, tokens)]
    turns: list | None = None
    turn: int = 0
    tokens: list = field(default_factory=list)
    began: float = 0.0  # engine steps when its current action (or what is left of it after a switch) began
    cur_version: int = 0  # the weights its current action decodes with
    masked: bool = False  # trained with its tokens past the bound masked (the policy's verdict)

    def work(self, load: bool) -> float:
        """What it decoded: its tokens (the load model), or one unit of work (the duration model)."""
        return sum(n for _, n in self.tokens) if load else 1.0


@dataclass
class Worker:
    slots: int
    version: int = 0
    queue: deque = field(default_factory=deque)  # groups issued, one entry an episode, not started
    running: dict = field(default_factory=dict)  # episode index -> Episode
    held: int = 0  # episodes issued to it whose group has not finished
    paused_until: float = -math.inf  # loading weights
    busy: float = 0.0  # slot-seconds with an episode in flight
    ends: list = field(default_factory=list)  # the duration model: heap of (end, episode index)
    engine: LoadEngine | None = None  # the load model
    gate: float = -math.inf  # the load model: work issued to it is seen from then (it was blocked on tools)
    seen: int = 0  # the last trainer version it looked at (cut)

    def flying(self, group: int) -> list[Episode]:
        """Its episodes in flight of `group`."""
        return [ep for ep in self.running.values() if ep.group == group]


class Groups:
    """The groups issued and not yet taken: the episodes of each not finished, the worker it went to, its finished
    episodes, and the finished groups in the order they finished (oldest first)."""

    def __init__(self):
        self.left: dict[int, int] = {}  # group -> episodes not finished, until the group is
        self.worker: dict[int, int] = {}  # group -> its worker, until it is finished
        self.episodes: dict[int, list[Episode]] = {}  # group -> its finished episodes, until it is taken
        self.finished: deque[int] = deque()

    def open(self, group: int, worker: int, size: int) -> None:
        self.left[group] = size
        self.worker[group] = worker
        self.episodes[group] = []

    def close(self, group: int) -> int:
        """`group` is finished (its last episode ended, or it was cut) -> the worker that held it."""
        del self.left[group]
        self.finished.append(group)
        return self.worker.pop(group)

    def keep_unchosen(self, chosen: list[int]) -> None:
        """The finished groups but `chosen`, in their order, wait for a later take."""
        taken = set(chosen)
        rest = [g for g in self.finished if g not in taken]
        self.finished.clear()
        self.finished.extend(rest)


class Tally:
    """What the trainer trained and what was wasted: counts, the staleness histograms, token totals, durations."""

    def __init__(self):
        self.hist: list[float] = []  # token-time (duration model) or tokens (load model) per staleness
        self.ep_hist: list[int] = []  # trained episodes per staleness of their oldest token
        self.trained = self.dropped = self.aborted = self.cut = 0
        self.tokens = {"decoded": 0.0, "wasted": 0.0, "masked": 0.0}  # the load model's action tokens
        self.trained_seconds = 0.0
        self.launched: list[float] = []  # durations of the episodes that ended or were stopped

    def add(self, age: int, amount: float) -> None:
        self.hist.extend([0.0] * (age + 1 - len(self.hist)))
        self.hist[age] += amount

    def episode(self, age: int) -> None:
        self.ep_hist.extend([0] * (age + 1 - len(self.ep_hist)))
        self.ep_hist[age] += 1

    def wasted(self, work: float) -> None:
        """Work decoded and never trained (stopped in a worker)."""
        self.tokens["decoded"] += work
        self.tokens["wasted"] += work
