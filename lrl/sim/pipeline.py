"""A discrete-event simulator of a rollout pipeline, heap-based (docs/simulate.md).

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

Cost: running episodes sit in binary heaps keyed by end time, free slots in a heap of slot ids, so an
event costs O(log n_slots). A sync does not touch the episodes it pauses. Each heap ("lane") holds the
episodes started between two syncs, keyed by their end time as of their start; a lane's current end times
are its keys pushed back once per sync since, so only the front of each lane is updated. That addition is
done one sync at a time, the same float operations as pushing every episode back, so results agree with
the eager rule to the last bit. The number of live lanes is bounded by how many syncs an episode spans.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

import torch

from lrl.sim.checks import check_args, check_durations
from lrl.sim.durations import failure_draws

Event = tuple[str, int, float, float, int]  # (kind, slot, start s, end s, version); kind gen|fail|train|sync


class _Feed:
    """The durations, handed out in order and converted from the tensor one chunk at a time.

    Each item is (seconds the slot is busy, the episode's duration, truncated by the timeout?, failed?).
    """

    def __init__(self, durations, chunk, bound, timeout, failure_mtbf, failure_generator):
        self.src = durations
        self.chunk = max(int(chunk), 1)
        self.bound = bound
        self.timeout = timeout
        self.mtbf = failure_mtbf
        self.gen = failure_generator
        self.pos = 0
        self.items = []
        self.i = 0

    def _refill(self, started: int) -> None:
        if self.pos >= len(self.src):
            most = f"; these settings start at most {self.bound:,} episodes" if self.bound else ""
            raise ValueError(
                f"durations: the run needs more than the {len(self.src):,} given ({started:,} started so far{most})"
            )
        raw = self.src[self.pos : self.pos + self.chunk]  # [c]
        self.pos += len(raw)
        d = raw if self.timeout is None else raw.clamp(max=self.timeout)
        cut = [False] * len(raw) if self.timeout is None else (raw > self.timeout).tolist()
        if self.mtbf is None:
            busy = d.tolist()
            failed = [False] * len(raw)
        else:
            hit, stop_s = failure_draws(d, self.mtbf, self.gen)
            busy = torch.where(hit, stop_s, d.double()).tolist()
            failed = hit.tolist()
        self.items = list(zip(busy, d.tolist(), cut, failed))
        self.i = 0

    def next(self, started: int) -> tuple[float, float, bool, bool]:
        if self.i == len(self.items):
            self._refill(started)
        self.i += 1
        return self.items[self.i - 1]


def _pushed_back(end: float, syncs: int, sync_time: float) -> float:
    """An end time pushed back by `syncs` syncs, one addition per sync (the eager rule's float ops)."""
    for _ in range(syncs):
        end += sync_time
    return end


def _pop_due(lane: list, syncs: int, sync_time: float, t: float, out: list) -> float:
    """Move the episodes of one lane that end at t into `out`; return the lane's next end (inf if empty)."""
    while lane:
        now = _pushed_back(lane[0][0], syncs, sync_time)
        if now != t:
            return now
        out.append(heapq.heappop(lane))
    return math.inf


def _due(lanes: dict[int, list], fronts: dict[int, float], syncs: int, sync_time: float, t: float) -> list:
    """Pop every running episode that ends at t from all lanes, in the order they started -> entries."""
    done: list = []
    for lane_syncs in [s for s, end in fronts.items() if end == t]:
        nxt = _pop_due(lanes[lane_syncs], syncs - lane_syncs, sync_time, t, done)
        if nxt == math.inf:
            del lanes[lane_syncs], fronts[lane_syncs]
        else:
            fronts[lane_syncs] = nxt
    if len(done) > 1:  # simultaneous ends: by start order, as the reference loop's dict iterates
        done.sort(key=lambda entry: entry[1])
    return done


def _next_time(fronts: dict[int, float], step_until: float | None, sync_until: float | None) -> float:
    """The earliest pending end: of an episode, the training step or the sync (inf if none)."""
    t = min(fronts.values(), default=math.inf)
    for end in (step_until, sync_until):
        if end is not None and end < t:
            t = end
    return t


def _drop_stale(buffer: deque, oldest_ok: int) -> tuple[deque, int]:
    """Finished episodes started by a version >= oldest_ok, in order, and how many were dropped."""
    fresh = deque(item for item in buffer if item[0] >= oldest_ok)
    return fresh, len(buffer) - len(fresh)


def _take_batch(buffer: deque, batch_size: int, version: int, hist: list[int], total: float) -> float:
    """Pop the oldest batch_size finished episodes, count their staleness in hist -> total + their seconds."""
    for _ in range(batch_size):
        v, d = buffer.popleft()
        age = version - v
        if age >= len(hist):
            hist.extend([0] * (age + 1 - len(hist)))
        hist[age] += 1
        total += d  # one addition per episode, in batch order, as a running sum
    return total


def float32_mean(hist: list[int]) -> float:
    """Mean of a histogram of integers, rounded as a float32 mean of the raw values is: counts [K] -> float."""
    n = sum(hist)
    total = sum(k * c for k, c in enumerate(hist))
    return (torch.tensor(float(total)) / torch.tensor(float(n))).item()


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
    feed = _Feed(durations, size, bound, timeout, failure_mtbf, failure_generator)

    t = 0.0
    version = 0
    syncs = 0
    started = 0
    lost = 0
    free = list(range(n_slots))  # heap of free slot ids (sorted, so already a heap)
    # lanes: syncs started before the episodes started -> heap of
    # (end as of start, start order, slot, start, version, duration, fails)
    lanes: dict[int, list] = {}
    fronts: dict[int, float] = {}  # the same keys -> current end time of that lane's first episode
    buffer: deque[tuple[int, float]] = deque()  # finished (version, duration), in finishing order
    events: list[Event] | None = [] if keep_events else None
    hist: list[int] = []  # trained episodes per staleness
    step_until: float | None = None
    sync_until: float | None = None
    sync_wanted = False  # a step has finished; its sync has not started
    n_events = trained_sum = busy = failed_sum = 0
    discarded = failed = truncated = 0

    def log(event: Event) -> None:
        nonlocal n_events
        n_events += 1
        if events is not None:
            events.append(event)

    while version < steps:
        if sync_until is None and (interrupt or not sync_wanted):
            room = min(len(free), (version + 1 + max_staleness) * batch_size + lost - started)  # throttle
            if room > 0:
                lane = lanes.setdefault(syncs, [])
                for _ in range(room):
                    busy_s, d, cut, fails = feed.next(started)
                    heapq.heappush(lane, (t + busy_s, started, heapq.heappop(free), t, version, d, fails))
                    started += 1
                    truncated += cut
                fronts[syncs] = lane[0][0]
        trainer_free = step_until is None and sync_until is None and not sync_wanted
        if trainer_free and len(buffer) >= batch_size:
            if consume_max_staleness is not None:
                buffer, dropped = _drop_stale(buffer, version - consume_max_staleness)
                if dropped:
                    discarded = discarded + dropped
                    lost = lost + dropped
                    continue  # the dropped episodes' throttle budget is free again: refill at this t
            trained_sum = _take_batch(buffer, batch_size, version, hist, trained_sum)
            step_until = t + train_time
            log(("train", 0, t, step_until, version))

        t = _next_time(fronts, step_until, sync_until)
        if t == math.inf:
            raise RuntimeError("the pipeline stalled: nothing is running, training or syncing")
        if sync_until == t:
            sync_until = None
            version = version + 1
        if step_until == t:
            step_until = None
            sync_wanted = True
        for _, _, slot, start, v, d, fails in _due(lanes, fronts, syncs, sync_time, t):
            busy += t - start
            heapq.heappush(free, slot)
            if fails:
                failed = failed + 1
                lost = lost + 1
                failed_sum = failed_sum + d
                log(("fail", slot, start, t, v))
            else:
                buffer.append((v, d))
                log(("gen", slot, start, t, v))
        if sync_wanted and (interrupt or len(free) == n_slots):
            sync_wanted = False
            sync_until = t + sync_time
            log(("sync", 0, t, sync_until, version))
            syncs += 1
            for lane_syncs in fronts:
                fronts[lane_syncs] += sync_time  # a sync pauses every episode in flight

    if t == 0:
        raise ValueError("durations, train_time and sync_time are all 0: the run takes no time")
    n_trained = sum(hist)
    trained_per_s = steps * batch_size / t
    in_flight = sorted((e[2], e[3], e[4]) for lane in lanes.values() for e in lane) if keep_events else None
    return dict(
        events=events,
        time=t,
        throughput=trained_per_s * 3600,
        gen_util=busy / (n_slots * t),
        staleness_mean=float32_mean(hist),
        staleness_max=len(hist) - 1,
        staleness_hist=hist,
        trained_duration=trained_sum / n_trained,
        n_events=n_events,
        started=started,
        trained=n_trained,
        discarded=discarded,
        failed=failed,
        failed_duration=failed_sum / failed if failed else math.nan,
        truncated=truncated,
        in_flight=in_flight,  # (slot, start s, version) of episodes still running at the end
    )
