"""A discrete-event simulator of a rollout pipeline (docs/simulate.md).

`n_slots` generation slots run one episode each; one trainer consumes `batch_size` finished episodes per
step in `train_time` seconds; a weight sync of `sync_time` seconds follows every step and pauses all
generation. Time jumps from event to event. The rules, in the order they are applied at each event time:

1. fill: while no sync runs (in drain mode: and none is waiting), start episodes on the lowest free slots
   with the next durations, as long as fewer than (version + 1 + max_staleness) * batch_size have started;
2. train: if the trainer and sync are idle, no sync waits and batch_size episodes are finished, train on
   the oldest finished ones; staleness = trainer version - version that started the episode;
3. advance to the earliest pending end (episode, step or sync) and handle it: a finished sync publishes
   the next version; a finished step asks for a sync; finished episodes join the buffer (ties in the order
   the episodes started); a requested sync starts at once (partial rollouts: in-flight episodes pause and
   end sync_time later) or, in drain mode, once no episode is in flight.

Cost: episodes in flight sit in a heap and in sorted arrays keyed by end time (lab/lrl_lab/sim/inflight.py), free
slots in a heap of slot ids, so one event costs O(log n_slots). Between two moments where anything but an
episode end can happen, episode ends are handled in bulk with numpy: if the next episodes to start are at
least m seconds long, nothing started from now on ends before now + m, so every end before then (and
before the training step ends) can be taken at once, in order, with the rules applied to the whole batch
(`_Pipeline.bulk_step`). Every float is computed by the same operations in the same order as one event at a
time would, so results agree with the plain rules to the last bit (lab/lrl_lab/sim/reference.py, tests).
"""

from __future__ import annotations

import gc
import heapq
import math
from itertools import repeat
from typing import Any

import numpy as np
import torch

from lrl_lab.sim.checks import check_args, check_durations
from lrl_lab.sim.feed import Feed
from lrl_lab.sim.finished import Finished
from lrl_lab.sim.inflight import InFlight

Event = tuple[str, int, float, float, int]  # (kind, slot, start s, end s, version); kind gen|fail|train|sync

# Bulk steps (docs/simulate.md): from how many slots and episodes in flight they run (below, they do not pay);
# episodes started at one time from which they go to the array store; a bulk step of fewer ends than
# BULK_WORTH costs more than handling them one at a time, so BULK_BACKOFF events then go one at a time before
# the next try, doubled (up to BULK_BACKOFF_MAX) while bulk steps stay small.
BULK_MIN = 1024
RUN_MIN = 64
BULK_WORTH = 32
BULK_BACKOFF = 16
BULK_BACKOFF_MAX = 4096


def float32_mean(hist: list[int]) -> float:
    """Mean of a histogram of integers, rounded as a float32 mean of the raw values is: counts [K] -> float."""
    n = sum(hist)
    total = sum(k * c for k, c in enumerate(hist))
    return (torch.tensor(float(total)) / torch.tensor(float(n))).item()


def running_sum(total: float, values: np.ndarray) -> float:
    """total + values[0] + values[1] + ..., one addition at a time in order (a cumulative sum): [n] -> float."""
    if not len(values):
        return total
    return float(np.cumsum(np.concatenate(([total], values)))[-1])


class _Pipeline:
    """The state of one simulation and the rules that move it (the module docstring)."""

    def __init__(
        self,
        feed: Feed,
        n_slots: int,
        batch_size: int,
        train_time: float,
        sync_time: float,
        max_staleness: int,
        interrupt: bool,
        *,
        consume_max_staleness: int | None,
        bulk: bool,
        keep_events: bool,
    ):
        self.feed = feed
        self.n_slots = n_slots
        self.batch_size = batch_size
        self.train_time = train_time
        self.sync_time = sync_time
        self.max_staleness = max_staleness
        self.interrupt = interrupt
        self.consume_max_staleness = consume_max_staleness
        # ends in bulk and starts in the array store; never with failures
        self.bulk = bulk and n_slots >= BULK_MIN
        self.events: list[Event] | None = [] if keep_events else None
        self.t = 0.0
        self.version = 0
        self.started = 0
        self.lost = 0  # episodes dropped or failed: their throttle budget is free again
        self.free = list(range(n_slots))  # heap of free slot ids (sorted, so already a heap)
        self.running = InFlight(n_slots)
        self.done = Finished()
        self.hist: list[int] = []  # trained episodes per staleness
        self.step_until: float | None = None
        self.sync_until: float | None = None
        self.sync_wanted = False  # a step has finished; its sync has not started
        self.skip = 0  # events left to handle one at a time before the next bulk step
        self.backoff = BULK_BACKOFF  # the next skip after a bulk step that did not pay
        self.n_events = 0
        self.busy = 0.0
        self.trained_sum = 0.0
        self.failed_sum = 0.0
        self.discarded = 0
        self.failed = 0
        self.truncated = 0

    def log(self, event: Event) -> None:
        self.n_events += 1
        if self.events is not None:
            self.events.append(event)

    def run(self, steps: int) -> None:
        while self.version < steps:
            self.fill()
            if self.trainer_ready():
                if self.drop_stale():
                    continue  # the dropped episodes' throttle budget is free again: refill at this t
                self.train()
            if self.bulk and self.sync_until is None and self.running.count >= BULK_MIN and self.bulk_step():
                continue
            self.step()

    def room(self) -> int:
        """Episodes the throttle still lets start."""
        return (self.version + 1 + self.max_staleness) * self.batch_size + self.lost - self.started

    def fill(self) -> None:
        """Rule 1: start episodes on the lowest free slots."""
        if self.sync_until is not None or (self.sync_wanted and not self.interrupt):
            return
        room = min(len(self.free), self.room())
        if room <= 0:
            return
        if self.bulk and room >= RUN_MIN:
            self.start_many(room)
            return
        t = self.t
        free = self.free
        for _ in range(room):
            busy_s, d, cut, fails = self.feed.next(self.started)
            self.running.push([t + busy_s, self.started, heapq.heappop(free), t, self.version, d, fails])
            self.started += 1
            self.truncated += cut

    def start_many(self, n: int) -> None:
        """Start n episodes at once on the n lowest free slots (none of them fails)."""
        self.free.sort()  # a sorted list is a heap, and so is what is left of it
        slots = np.array(self.free[:n], dtype=np.int64)
        del self.free[:n]
        busy, dur, cut, _ = self.feed.take(n, self.started)
        order = np.arange(self.started, self.started + n)
        self.running.add(self.t + busy, order, slots, np.full(n, self.t), self.version, dur)
        self.started += n
        self.truncated += int(cut.sum())

    def trainer_ready(self) -> bool:
        idle = self.step_until is None and self.sync_until is None and not self.sync_wanted
        return idle and len(self.done) >= self.batch_size

    def drop_stale(self) -> bool:
        """The consumption bound: drop finished episodes staler than it -> whether any were dropped."""
        if self.consume_max_staleness is None:
            return False
        dropped = self.done.drop_older(self.version - self.consume_max_staleness)
        self.discarded += dropped
        self.lost += dropped
        return dropped > 0

    def train(self) -> None:
        """Rule 2: train on the oldest batch_size finished episodes."""
        versions, durations = self.done.take(self.batch_size)
        counts = np.bincount(self.version - versions).tolist()  # trained episodes per staleness
        if len(counts) > len(self.hist):
            self.hist.extend([0] * (len(counts) - len(self.hist)))
        for age, c in enumerate(counts):
            self.hist[age] += c
        self.trained_sum = running_sum(self.trained_sum, durations)  # in batch order, as a running sum
        self.step_until = self.t + self.train_time
        self.log(("train", 0, self.t, self.step_until, self.version))

    def step(self) -> None:
        """Rule 3: advance to the earliest pending end and handle everything that ends then."""
        t = self.running.front()
        for end in (self.step_until, self.sync_until):
            if end is not None and end < t:
                t = end
        if t == math.inf:
            raise RuntimeError("the pipeline stalled: nothing is running, training or syncing")
        self.t = t
        if self.sync_until == t:
            self.sync_until = None
            self.version += 1
        if self.step_until == t:
            self.step_until = None
            self.sync_wanted = True
        for _, _, slot, start, v, d, fails in self.running.pop_at(t):
            self.busy += t - start
            heapq.heappush(self.free, slot)
            if fails:
                self.failed += 1
                self.lost += 1
                self.failed_sum += d
                self.log(("fail", slot, start, t, v))
            else:
                self.done.append(v, d)
                self.log(("gen", slot, start, t, v))
        if self.skip:
            self.skip -= 1
        if self.sync_wanted and (self.interrupt or len(self.free) == self.n_slots):
            self.sync_wanted = False
            self.sync_until = t + self.sync_time
            self.log(("sync", 0, t, self.sync_until, self.version))
            self.running.pause(self.sync_time)  # a sync pauses every episode in flight

    def bulk_step(self) -> bool:
        """Rule 3 for many episode ends at once, each followed by rule 1, up to the first moment where anything
        else could happen (a start ending, the step ending, a batch being ready, a drain completing).
        No sync runs and none of the episodes fails. -> whether any end was handled."""
        if self.skip:
            return False
        running = self.running
        n = running.count
        room = self.room() if self.interrupt or not self.sync_wanted else 0
        if room and self.free:  # the fill left free slots and room: it cannot, but then go one at a time
            return False
        need = min(room, n)  # the most episodes this can start: one per end handled
        limit = n
        if self.step_until is None and not self.sync_wanted:
            limit = self.batch_size - 1 - len(self.done)  # the trainer waits: stop short of a full batch
        if self.sync_wanted:
            limit = n - 1  # the last end of a drain starts the sync: leave it to step()
        if limit < 1 or need > self.feed.left():
            self.skip = BULK_BACKOFF
            return False
        x = self.t + self.feed.min_busy(need, self.started) if need else math.inf
        if self.step_until is not None and self.step_until < x:
            x = self.step_until
        ended = running.pop_before(x, limit)  # by end time, then start order
        k = len(ended)
        if k < BULK_WORTH:
            self.skip = self.backoff
            self.backoff = min(2 * self.backoff, BULK_BACKOFF_MAX)
        else:
            self.backoff = BULK_BACKOFF
        if not k:
            return False
        end = ended.end
        slot = ended.slot
        self.busy = running_sum(self.busy, end - ended.start)
        self.done.extend(ended.version, ended.d)
        self.n_events += k
        if self.events is not None:
            cols = (slot.tolist(), ended.start.tolist(), end.tolist(), ended.version.tolist())
            self.events.extend(zip(repeat("gen"), *cols))
        self.t = float(end[-1])
        rest = slot
        if room:
            new = min(room, k)
            if k > 1 and (end[1:] == end[:-1]).any():  # ends at one time: their slots refill lowest first
                group = np.concatenate(([0], np.cumsum(end[1:] != end[:-1])))
                slot = slot[np.lexsort((slot, group))]
            busy, dur, cut, _ = self.feed.take(new, self.started)
            begin = end[:new]  # each new episode starts when the slot it takes frees
            order = np.arange(self.started, self.started + new)
            running.add(begin + busy, order, slot[:new], begin, self.version, dur)
            self.started += new
            self.truncated += int(cut.sum())
            rest = slot[new:]
        if len(rest):
            self.free += rest.tolist()
            heapq.heapify(self.free)
        return True


def simulate_pipeline(
    durations: torch.Tensor,
    n_slots: int,
    batch_size: int,
    train_time: float,
    sync_time: float,
    max_staleness: int = 0,
    interrupt: bool = True,
    steps: int = 10,
    *,
    consume_max_staleness: int | None = None,
    timeout: float | None = None,
    failure_mtbf: float | None = None,
    failure_generator: torch.Generator | None = None,
    keep_events: bool = True,
    chunk: int | None = None,
) -> dict[str, Any]:
    """Simulate `steps` training steps of a rollout pipeline on episode durations [N] seconds -> dict.

    Keys: `events` (list of (kind, slot, start, end, version) or None if not `keep_events`), `time` (s),
    `throughput` (trained episodes per hour), `gen_util` (busy share of slot time), `staleness_mean`,
    `staleness_max`, `staleness_hist` (count per staleness), `trained_duration` (mean s), plus `n_events`,
    `started`, `trained`, `discarded`, `failed`, `failed_duration`, `truncated`, `in_flight`.

    Extensions beyond the reference rules (all off by default):
    - `consume_max_staleness`: the trainer drops finished episodes staler than this when it forms a batch
      (`discarded` counts them); dropped episodes no longer count against the generation throttle.
    - `timeout`: durations are truncated to it (`truncated` counts the started episodes it cut); failures,
      if any, are drawn on the truncated durations.
    - `failure_mtbf`: a worker fails at the constant hazard 1/failure_mtbf per second; a failed episode
      frees its slot when it fails, is logged as a `fail` event and never trained (`failed`, and
      `failed_duration`, the mean full length of the failed episodes); uniforms come from
      `failure_generator` (default seed 1), one per duration in order.
    """
    durations = check_durations(durations)
    check_args(
        n_slots,
        batch_size,
        train_time,
        sync_time,
        max_staleness,
        steps,
        consume_max_staleness,
        timeout,
        failure_mtbf,
    )
    lossless = consume_max_staleness is None and failure_mtbf is None
    bound = (steps + max_staleness) * batch_size if lossless else 0  # most episodes a lossless run can start
    if failure_mtbf is not None and failure_generator is None:
        failure_generator = torch.Generator().manual_seed(1)
    size = chunk or min(bound or math.inf, max(4 * n_slots, 16_384))  # memory O(slots), not O(run)
    feed = Feed(durations, size, bound, timeout, failure_mtbf, failure_generator)
    sim = _Pipeline(
        feed,
        n_slots,
        batch_size,
        train_time,
        sync_time,
        max_staleness,
        interrupt,
        consume_max_staleness=consume_max_staleness,
        bulk=failure_mtbf is None,
        keep_events=keep_events,
    )
    collecting = gc.isenabled()
    gc.disable()  # millions of small records and no cycles: the collector would only rescan them
    try:
        sim.run(steps)
    finally:
        if collecting:
            gc.enable()

    t = sim.t
    if t == 0:
        raise ValueError("durations, train_time and sync_time are all 0: the run takes no time")
    n_trained = sum(sim.hist)
    trained_per_s = steps * batch_size / t
    return dict(
        events=sim.events,
        time=t,
        throughput=trained_per_s * 3600,
        gen_util=sim.busy / (n_slots * t),
        staleness_mean=float32_mean(sim.hist),
        staleness_max=len(sim.hist) - 1,
        staleness_hist=sim.hist,
        trained_duration=sim.trained_sum / n_trained,
        n_events=sim.n_events,
        started=sim.started,
        trained=n_trained,
        discarded=sim.discarded,
        failed=sim.failed,
        failed_duration=sim.failed_sum / sim.failed if sim.failed else math.nan,
        truncated=sim.truncated,
        in_flight=sorted(sim.running.listing()) if keep_events else None,  # (slot, start s, version) running
    )
