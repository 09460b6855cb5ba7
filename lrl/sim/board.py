"""A simulator of the pipeline as lrl runs it (``--pipeline async`` and the synchronous stream with slots).

:func:`lrl.sim.simulate_pipeline` follows the reference rules: one trainer, one pool of slots, and a weight sync
that is a barrier for everyone (the trainer waits for it, and in drain mode for every episode in flight). lrl's
pipeline differs in ways that matter for a prediction of its throughput and staleness, so this module models
it as it is:

- **a weight board**: the trainer publishes a version and goes on with its next step at once; each worker loads
  the newest version on its own, pausing its decoding for ``switch_time``: at once with partial rollouts
  (``interrupt``), or, with ``drain``, only once its episodes in flight have finished, starting none meanwhile;
- **groups**: the trainer takes whole groups (``group_size`` episodes of one task), the oldest finished first;
  a group is finished when its last episode is;
- **issuing**: a batch's groups go out round robin to the workers, as units, while the throttle allows
  (``(v + 1 + max_staleness)`` batches by the time the trainer is at version ``v``) and while a worker holds no
  more than its slots plus one unit. The controller issues while the trainer waits for data and when it
  publishes, not during a training step;
- **the consumer-side bound** (``drop``): an episode that started on a version more than ``max_staleness``
  behind the trainer is dropped when its group is taken; a batch with nothing left is taken again;
- **token staleness**: an episode's tokens are spread over its duration, so an episode interrupted by weight
  switches contributes to each version it ran on in proportion to the time it ran on it (an approximation:
  real tokens come in bursts between tool calls).

Durations are consumed in start order, as the reference simulator does; one design at a time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Episode:
    index: int
    group: int
    duration: float
    start: float
    end: float
    version: int  # the worker's weights when it started
    switches: list[tuple[float, int]] = field(
        default_factory=list
    )  # (time, version) of each switch in flight


@dataclass
class _Worker:
    slots: int
    version: int = 0
    queue: deque = field(default_factory=deque)  # (episode index, group) issued, not started
    running: dict = field(default_factory=dict)  # episode index -> _Episode
    held: int = 0  # episodes issued to it and not yet finished
    paused_until: float = -math.inf  # loading weights
    busy: float = 0.0  # slot-seconds with an episode in flight


def simulate_board(
    durations,
    n_slots: int,
    group_size: int,
    groups_per_batch: int,
    train_time: float,
    switch_time: float,
    max_staleness: int = 1,
    interrupt: bool = True,
    steps: int = 10,
    *,
    workers: int = 1,
    drop: bool = True,
    sync_before: bool = False,
) -> dict:
    """Simulate `steps` training steps of lrl's pipeline on episode durations (seconds, in start order) -> dict.

    ``n_slots`` is the slots of each of ``workers`` workers. ``sync_before`` models the synchronous stream: the
    trainer publishes, then generates its next batch itself (a bound of 0, no overlap, no issuing lag).
    Keys: ``time``, ``episodes_per_s`` (trained per second), ``step_ends`` (seconds), ``step_trained``
    (episodes each step trained), ``slot_util``,
    ``staleness_mean`` / ``staleness_max`` / ``staleness_hist`` (per token, time-weighted; the max is over
    episodes' oldest tokens), ``episode_staleness_hist`` (oldest token per trained episode), ``trained``,
    ``dropped``, ``trained_duration``, ``launched_duration``.
    """
    durs = [float(d) for d in durations]
    if not durs or any(not math.isfinite(d) or d < 0 for d in durs):
        raise ValueError("durations: need a non-empty list of finite seconds >= 0")
    G, E, eta = groups_per_batch, group_size, max_staleness
    share = -(-G // workers) * E
    capacity = max(n_slots, share) + share
    pool = [_Worker(n_slots) for _ in range(workers)]
    t = 0.0
    version = 0  # the trainer's
    issued_batches = 0
    started = 0  # episodes handed a duration
    ends: list[tuple[float, int, int]] = []  # heap of (end, episode, worker)
    group_left: dict[int, int] = {}  # group -> episodes not finished
    group_episodes: dict[int, list[_Episode]] = {}
    finished: deque[int] = deque()  # finished groups, oldest first
    training_until: float | None = None
    step_ends: list[float] = []
    step_trained: list[int] = []
    hist: list[float] = []  # token-time per staleness
    ep_hist: list[int] = []
    trained = dropped = 0
    trained_seconds = 0.0
    launched: list[float] = []

    def duration(i: int) -> float:
        return durs[i % len(durs)]

    def issue() -> None:
        nonlocal issued_batches
        while issued_batches < version + 1 + eta:
            units = [list(range(w, G, workers)) for w in range(workers)]
            if any(pool[w].held + len(u) * E > capacity for w, u in enumerate(units) if u):
                return
            for w, unit in enumerate(units):
                for g in unit:
                    group = issued_batches * G + g
                    group_left[group] = E
                    group_episodes[group] = []
                    for _ in range(E):
                        pool[w].queue.append(group)
                pool[w].held += len(unit) * E
            issued_batches += 1

    def admit(now: float) -> None:
        nonlocal started
        for w, worker in enumerate(pool):
            newer = worker.version < version  # a newer version is on the board
            if newer and now >= worker.paused_until and (interrupt or not worker.running):
                switch(worker, now)
                newer = False
            if now < worker.paused_until or (newer and not interrupt):
                continue  # loading weights, or draining: start nothing until the episodes in flight are done
            while worker.queue and len(worker.running) < worker.slots:
                group = worker.queue.popleft()
                d = duration(started)
                ep = _Episode(started, group, d, now, now + d, worker.version)
                started += 1
                worker.running[ep.index] = ep
                heapq.heappush(ends, (ep.end, ep.index, w))

    def switch(worker: _Worker, now: float) -> None:
        worker.version = version
        worker.paused_until = now + switch_time
        for ep in worker.running.values():  # decoding pauses while the weights load
            ep.end += switch_time
            ep.switches.append((now, version))
        if worker.running and switch_time:
            rebuilt = [(ep.end, ep.index, w) for w, wk in enumerate(pool) for ep in wk.running.values()]
            ends[:] = rebuilt
            heapq.heapify(ends)

    def take() -> list[_Episode] | None:
        """The trainer's next batch: G finished groups, stale episodes dropped (None: not enough yet)."""
        nonlocal dropped
        while len(finished) >= G:
            groups = [finished.popleft() for _ in range(G)]
            batch = []
            for g in groups:
                for ep in group_episodes.pop(g):
                    if drop and version - ep.version > eta:
                        dropped += 1
                    else:
                        batch.append(ep)
            if batch:
                return batch
        return None

    def train(batch: list[_Episode], now: float) -> None:
        nonlocal training_until, trained, trained_seconds
        step_trained.append(len(batch))
        for ep in batch:
            trained += 1
            trained_seconds += ep.duration
            oldest = version - ep.version
            ep_hist.extend([0] * (oldest + 1 - len(ep_hist)))
            ep_hist[oldest] += 1
            marks = [(ep.start, ep.version), *ep.switches, (ep.end, None)]
            total = max(ep.end - ep.start, 1e-12)
            for (a, v), (b, _) in zip(marks, marks[1:]):
                age = version - v
                hist.extend([0.0] * (age + 1 - len(hist)))
                hist[age] += (b - a) / total
        training_until = now + train_time

    if sync_before:
        eta = 0
    issue()
    admit(t)
    while version < steps:
        if training_until is None:
            batch = take()
            if batch is not None:
                train(batch, t)
        pauses = [wk.paused_until for wk in pool if wk.paused_until > t]
        step = [training_until] if training_until is not None else []
        t_next = min([ends[0][0]] if ends else [], default=math.inf)
        t_next = min([t_next, *step, *pauses])
        if t_next == math.inf:
            raise RuntimeError("the simulated pipeline stalled: nothing runs, trains or loads")
        for wk in pool:
            wk.busy += len(wk.running) * (t_next - t)
        t = t_next
        while ends and ends[0][0] <= t:
            _, index, w = heapq.heappop(ends)
            ep = pool[w].running.pop(index)
            pool[w].held -= 1
            launched.append(ep.duration)
            group_episodes[ep.group].append(ep)
            group_left[ep.group] -= 1
            if not group_left[ep.group]:
                del group_left[ep.group]
                finished.append(ep.group)
        if training_until is not None and training_until <= t:
            training_until = None
            version += 1
            step_ends.append(t)
            issue()  # the controller issues when it publishes
        if training_until is None:
            issue()  # and while the trainer waits for data
        admit(t)
    capacity_time = workers * n_slots * t
    n_hist = sum(hist)
    return {
        "time": t,
        "step_ends": step_ends,
        "step_trained": step_trained,
        "episodes_per_s": trained / t if t else math.nan,
        "slot_util": sum(wk.busy for wk in pool) / capacity_time if capacity_time else math.nan,
        "staleness_mean": sum(k * c for k, c in enumerate(hist)) / n_hist if n_hist else math.nan,
        "staleness_max": len(ep_hist) - 1,
        "staleness_hist": [c / n_hist for c in hist] if n_hist else [],
        "episode_staleness_hist": ep_hist,
        "trained": trained,
        "dropped": dropped,
        "started": started,
        "trained_duration": trained_seconds / trained if trained else math.nan,
        "launched_duration": sum(launched) / len(launched) if launched else math.nan,
    }
