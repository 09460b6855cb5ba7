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
  more than its slots plus one unit. A worker holds an episode from its issue until its *group* has finished
  (the controller hears of a group, not of an episode), so the finished episodes of a group with a straggler
  keep room that the slots could use; the controller issues while the trainer waits for data and when it
  publishes, not during a training step;
- **the consumer-side bound** (``drop``): an episode that started on a version more than ``max_staleness``
  behind the trainer is dropped when its group is taken; a batch with nothing left is taken again. The other
  staleness policies (``policy``, lrl's ``--stale-policy``): ``mask`` trains such an episode, its tokens older
  than the bound counted as masked; ``oldest-first`` takes the finished groups whose oldest episode started
  earliest, then drops; ``abort`` stops an episode in flight once the worker sees a version that puts it past
  the bound, and starts its task again first in the worker's queue; ``cut``, once a worker sees the last version
  a group can be trained on (``eta`` after the one its oldest episode started on), sends it without its
  unfinished episodes if at least half of it has finished; ``ordered`` takes the earliest issued finished groups
  once no group issued before them is unfinished; once it has waited ``patience`` seconds since a batch's worth
  had finished, it sends every earlier group with at least half finished without its unfinished episodes (as
  ``cut`` does) and takes without the others (then drops). ``pace`` is the simulator's alone: an
  admission in time, which starts an episode only when the median of the last 64 episodes' durations says it
  ends before the trainer takes its last batch within the bound (``eta`` trainer periods, the median gap of the
  last 64 steps, from when the worker switched to its version), or when the worker has nothing in flight, then
  drops. It is kept to show why lrl has no such policy: held work delays the very versions its window is
  counted in, and the pipeline starves (docs/pipeline.md, "Staleness policies"). An admission in the queue
  (start batch ``b`` only on version ``b - eta``) is what the throttle already does;
- **token staleness**: in the duration model, an episode's tokens are spread over its duration, so an episode
  interrupted by weight switches contributes to each version it ran on in proportion to the time it ran on it
  (an approximation: real tokens come in bursts between tool calls); the load model counts the tokens.

Two models of an episode: the **duration model** takes each episode's wall time (consumed in start order, as
the reference simulator does); the **load model** (:mod:`lrl.sim.load`) takes its turns and an engine's step
cost, so that decoding shares the engine and a weight load pauses decoding but not tools. One design at a
time.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from lrl.sim.load import EngineCurve, LoadEngine, parse_turns

POLICIES = ("drop", "mask", "oldest-first", "abort", "cut", "ordered", "pace")  # lrl.config.STALE_POLICIES
WAIT_SLICE = 0.1  # lrl.envs.workers.WAIT_SLICE: a rollout worker's longest blocking wait for tool answers


class Steps(float):
    """A patience in trainer steps (lrl's --take-patience-steps), where a plain float is one in seconds."""


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
    # the load model: its turns, the turn it is at, tokens decoded per version [(version, tokens)]
    turns: list | None = None
    turn: int = 0
    tokens: list = field(default_factory=list)
    began: float = 0.0  # engine steps when its current action (or what is left of it after a switch) began
    cur_version: int = 0  # the weights its current action decodes with


@dataclass
class _Worker:
    slots: int
    version: int = 0
    queue: deque = field(default_factory=deque)  # (episode index, group) issued, not started
    running: dict = field(default_factory=dict)  # episode index -> _Episode
    held: int = 0  # episodes issued to it whose group has not finished
    paused_until: float = -math.inf  # loading weights
    busy: float = 0.0  # slot-seconds with an episode in flight
    ends: list = field(default_factory=list)  # the duration model: heap of (end, episode index)
    engine: LoadEngine | None = None  # the load model
    gate: float = -math.inf  # the load model: work issued to it is seen from then (it was blocked on tools)
    since: float = 0.0  # when it switched to its version
    seen: int = 0  # the last trainer version it looked at (cut)


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
    turns=None,
    engine: EngineCurve | None = None,
    co_run: float = 1.0,
    trace: list | None = None,
    release: str = "group",
    wait_slice: float | None = None,
    policy: str = "drop",
    tool_servers: int | None = None,
    patience: float = math.inf,
    patience_steps: float | None = None,
) -> dict:
    """Simulate `steps` training steps of lrl's pipeline -> dict.

    The duration model: ``durations`` are episodes' wall times (seconds, in start order). The load model
    (:mod:`lrl.sim.load`): ``durations=None``, ``turns`` the episodes as turns (``[[tokens, tool s], ...]`` each,
    in start order, reused cyclically) and ``engine`` the engine's step cost; ``co_run`` multiplies the engine's
    step while the trainer trains (its share of the cores). ``train_time`` is the trainer's seconds a step.

    ``n_slots`` is the slots of each of ``workers`` workers. ``sync_before`` models the synchronous stream: the
    trainer publishes, then generates its next batch itself (a bound of 0, no overlap, no issuing lag).
    ``release``: when a worker's held episode stops counting against its capacity: ``"group"`` (when its group
    has finished, as lrl's controller counts) or ``"episode"`` (when it ends: this simulator before it modelled
    that, kept to measure what the rule is worth).
    ``wait_slice`` (the load model, asynchronous designs): a worker whose episodes all wait for tools sees new
    work and new weights only when an answer comes or a wait of this many seconds ends (default
    ``WAIT_SLICE``, lrl's own; 0: at once).
    ``policy``: what the bound does to work past it (``drop``, ``mask``, ``oldest-first``, ``abort``; with
    ``drop=True``, see the module's notes).
    ``patience``: with ``policy="ordered"``, the seconds the trainer waits for an earlier issued group (lrl's
    ``--take-patience``; ``inf``: until it is back); ``patience_steps``, instead, that many of the trainer's steps
    (lrl's ``--take-patience-steps``: ``patience_steps * train_time`` here, where every step takes that long).
    ``tool_servers`` (the load model): each worker's tool calls are served by that many servers, first come first
    served, a turn's tool seconds being its service time (a sandbox pool: lrl's ``--env-workers``); None: all at
    once.
    ``trace``: a list to append ``[time, decoding, tool, in flight, paused in flight]`` (all workers) at every
    event of the load model.
    Keys: ``time``, ``episodes_per_s`` (trained per second), ``step_ends`` (seconds), ``step_trained``
    (episodes each step trained), ``slot_util``,
    ``staleness_mean`` / ``staleness_max`` / ``staleness_hist`` (per token; the duration model spreads an
    episode's tokens evenly over its time; the max is over episodes' oldest tokens), ``episode_staleness_hist``
    (oldest token per trained episode), ``trained``, ``dropped``, ``aborted``, ``trained_duration``,
    ``launched_duration``, ``decoded_tokens``, ``wasted_tokens`` (decoded by dropped or aborted episodes, or
    masked) and ``masked_tokens``: the load model counts tokens; the duration model counts an episode as one
    unit of work spread evenly over its time.
    """
    load = durations is None
    if load:
        if turns is None or engine is None:
            raise ValueError("the load model needs turns and an engine curve (or give durations)")
        episodes = parse_turns(turns)
        durs: list[float] = []
    else:
        if turns is not None:
            raise ValueError("give durations or turns, not both")
        durs = [float(d) for d in durations]
        if not durs or any(not math.isfinite(d) or d < 0 for d in durs):
            raise ValueError("durations: need a non-empty list of finite seconds >= 0")
    if patience_steps is not None:
        if not (patience_steps >= 0 and math.isfinite(patience_steps)):
            raise ValueError("patience_steps: trainer steps >= 0")
        patience = patience_steps * train_time
    slice_s = WAIT_SLICE if wait_slice is None else float(wait_slice)
    if slice_s < 0 or not math.isfinite(slice_s):
        raise ValueError("wait_slice: seconds >= 0")
    if sync_before or not load:
        slice_s = 0.0  # the synchronous stream starts its episodes itself; durations have no tool waits
    if release not in ("group", "episode"):
        raise ValueError("release: 'group' or 'episode'")
    if co_run < 1.0 or not math.isfinite(co_run):
        raise ValueError("co_run: a slowdown >= 1")
    if policy not in POLICIES:
        raise ValueError(f"policy: one of {POLICIES}")
    if not drop:
        policy = "drop"  # the throttle alone: no policy applies
    if sync_before:
        policy = "drop"  # the synchronous stream: nothing is stale
    G, E, eta = groups_per_batch, group_size, max_staleness
    share = -(-G // workers) * E
    capacity = max(n_slots, share) + share
    pool = [_Worker(n_slots) for _ in range(workers)]
    if load:
        for wk in pool:
            wk.engine = LoadEngine(engine, tool_servers)
    t = 0.0
    version = 0  # the trainer's
    issued_batches = 0
    started = 0  # episodes handed a duration
    group_left: dict[int, int] = {}  # group -> episodes not finished
    group_worker: dict[int, int] = {}
    group_episodes: dict[int, list[_Episode]] = {}
    finished: deque[int] = deque()  # finished groups, oldest first
    training_until: float | None = None
    step_ends: list[float] = []
    step_trained: list[int] = []
    hist: list[float] = []  # token-time (duration model) or tokens (load model) per staleness
    ep_hist: list[int] = []
    trained = dropped = aborted = cut = 0
    tokens = {"decoded": 0.0, "wasted": 0.0, "masked": 0.0}  # the load model's action tokens
    trained_seconds = 0.0
    launched: list[float] = []
    deadline: float | None = None  # until when the trainer waits for an earlier issued group (ordered)

    units = [list(range(w, G, workers)) for w in range(workers)]  # each worker's groups of a batch

    def issue() -> None:
        nonlocal issued_batches
        while issued_batches < version + 1 + eta:
            if any(pool[w].held + len(u) * E > capacity for w, u in enumerate(units) if u):
                return
            for w, unit in enumerate(units):
                for g in unit:
                    group = issued_batches * G + g
                    group_left[group] = E
                    group_worker[group] = w
                    group_episodes[group] = []
                    for _ in range(E):
                        pool[w].queue.append(group)
                pool[w].held += len(unit) * E
                if unit and slice_s and pool[w].engine.blocked() and pool[w].gate <= t:
                    pool[w].gate = pool[w].engine.wake_after(t, slice_s)  # the message finds it waiting
            issued_batches += 1

    def admit(now: float) -> None:
        nonlocal started
        for worker in pool:
            if slice_s and worker.engine.asleep(now, slice_s):
                continue  # blocked on its tools' answers: it sees the board and its messages later
            if policy == "abort" and drop:
                abort_stale(worker, now)
            if policy == "cut" and drop and worker.seen < version:
                worker.seen = version
                cut_short(worker, now)
            newer = worker.version < version  # a newer version is on the board
            if newer and now >= worker.paused_until and (interrupt or not worker.running):
                switch(worker, now)
                newer = False
            if now < worker.paused_until or (newer and not interrupt):
                continue  # loading weights, or draining: start nothing until the episodes in flight are done
            while worker.queue and len(worker.running) < worker.slots and now >= worker.gate:
                if policy == "pace" and worker.running and not paces(worker, now):
                    break
                group = worker.queue.popleft()
                if load:
                    ep = _Episode(started, group, 0.0, now, math.inf, worker.version)
                    ep.turns = episodes[started % len(episodes)]
                    started += 1
                    worker.running[ep.index] = ep
                    if worker.engine.begin_turn(ep, now, worker.version):  # no turns to run: ends now
                        ep.end = now
                        heapq.heappush(worker.ends, (now, ep.index))
                    continue
                d = durs[started % len(durs)]
                ep = _Episode(started, group, d, now, now + d, worker.version)
                started += 1
                worker.running[ep.index] = ep
                heapq.heappush(worker.ends, (ep.end, ep.index))

    def stop(worker: _Worker, episodes: list[_Episode], now: float) -> None:
        """Take `episodes` out of `worker` in flight (abort, cut): what they had decoded is wasted work."""
        gone = {ep.index for ep in episodes}
        for ep in episodes:
            del worker.running[ep.index]
            launched.append(now - ep.start)
        if load:
            work = worker.engine.abort(gone, now) + sum(n for ep in episodes for _, n in ep.tokens)
        else:  # an episode's unit of work, spread evenly over its time
            worker.ends[:] = [e for e in worker.ends if e[1] not in gone]
            heapq.heapify(worker.ends)
            work = sum(min(1.0, (now - ep.start) / ep.duration) if ep.duration > 0 else 0.0 for ep in episodes)
        tokens["decoded"] += work
        tokens["wasted"] += work

    def abort_stale(worker: _Worker, now: float) -> None:
        """Stop the episodes in flight that started more than eta versions behind the trainer; their groups'
        tasks go first in the worker's queue, to start again."""
        nonlocal aborted
        stale = [ep for ep in worker.running.values() if version - ep.version > eta]
        if not stale:
            return
        stop(worker, stale, now)
        for ep in stale:
            worker.queue.appendleft(ep.group)
        aborted += len(stale)

    def cut_short(worker: _Worker, now: float) -> None:
        """Send every group at its last version with at least half finished without its unfinished episodes."""
        w = pool.index(worker)
        mine = [g for g, left in group_left.items() if group_worker[g] == w and 2 * (E - left) >= E]
        for g in mine:
            flying = [ep for ep in worker.running.values() if ep.group == g]
            oldest = min(ep.version for ep in (*group_episodes[g], *flying))
            if version - oldest != eta:
                continue
            cut_group(g, now)

    def cut_group(g: int, now: float) -> None:
        """Send group `g` without its unfinished episodes (``cut``, and ``ordered`` out of patience)."""
        nonlocal cut
        worker = pool[group_worker[g]]
        flying = [ep for ep in worker.running.values() if ep.group == g]
        stop(worker, flying, now)
        unstarted = sum(1 for q in worker.queue if q == g)
        if unstarted:
            worker.queue = deque(q for q in worker.queue if q != g)
        cut += len(flying) + unstarted
        del group_left[g]
        finished.append(g)
        pool[group_worker.pop(g)].held -= E if release == "group" else len(flying) + unstarted

    def paces(worker: _Worker, now: float) -> bool:
        """``pace``: whether an episode started now is expected to be trained within the bound."""
        gaps = [b - a for a, b in zip(step_ends[-65:], step_ends[-64:])]
        if not gaps or not launched:
            return True
        period, duration = statistics.median(gaps), statistics.median(launched[-64:])
        return now + duration <= worker.since + eta * period

    def switch(worker: _Worker, now: float) -> None:
        worker.version = version
        worker.since = now
        worker.paused_until = now + switch_time
        if load:
            worker.engine.switch(now, version)
            return
        for ep in worker.running.values():  # decoding pauses while the weights load
            ep.end += switch_time
            ep.switches.append((now, version))
        if worker.running and switch_time:
            worker.ends[:] = [(ep.end, ep.index) for ep in worker.running.values()]
            heapq.heapify(worker.ends)

    def take() -> list[_Episode] | None:
        """The trainer's next batch: G finished groups, stale episodes dropped (None: not enough yet)."""
        nonlocal dropped, deadline
        while len(finished) >= G:
            if policy == "ordered":  # the G earliest issued, waiting up to `patience` s for any issued before
                groups = sorted(finished)[:G]
                if group_left and min(group_left) < groups[-1]:  # an earlier group is still in flight
                    if deadline is None:
                        deadline = t + patience
                    if t < deadline:
                        return None
                    for g in sorted(x for x in group_left if x < groups[-1]):
                        if 2 * (E - group_left[g]) >= E:  # at least half finished: sent without the rest
                            cut_group(g, t)
                    groups = sorted(finished)[:G]
                deadline = None
                chosen = set(groups)
                finished_left = [g for g in finished if g not in chosen]
                finished.clear()
                finished.extend(finished_left)
            elif policy == "oldest-first":  # the groups whose oldest episode started earliest, stable
                ranked = sorted(finished, key=lambda g: min(ep.version for ep in group_episodes[g]))
                groups = ranked[:G]
                chosen = set(groups)
                finished_left = [g for g in finished if g not in chosen]
                finished.clear()
                finished.extend(finished_left)
            else:
                groups = [finished.popleft() for _ in range(G)]
            batch = []
            for g in groups:
                for ep in group_episodes.pop(g):
                    work = sum(n for _, n in ep.tokens) if load else 1.0  # the duration model: one unit
                    tokens["decoded"] += work
                    if drop and policy != "mask" and version - ep.version > eta:
                        dropped += 1
                        tokens["wasted"] += work
                    else:
                        batch.append(ep)
            if batch:
                return batch
        return None

    def add(age: int, amount: float) -> None:
        hist.extend([0.0] * (age + 1 - len(hist)))
        hist[age] += amount

    def train(batch: list[_Episode], now: float) -> None:
        nonlocal training_until, trained, trained_seconds
        step_trained.append(len(batch))
        for ep in batch:
            trained += 1
            trained_seconds += ep.end - ep.start
            oldest = version - ep.version
            if policy == "mask" and drop:
                oldest = min(oldest, eta)  # its older tokens are masked, not trained
            ep_hist.extend([0] * (oldest + 1 - len(ep_hist)))
            ep_hist[oldest] += 1
            masking = policy == "mask" and drop
            if load:
                for v, n in ep.tokens:
                    if masking and version - v > eta:
                        tokens["masked"] += n
                        tokens["wasted"] += n
                    else:
                        add(version - v, n)
                continue
            marks = [(ep.start, ep.version), *ep.switches, (ep.end, None)]
            total = max(ep.end - ep.start, 1e-12)
            for (a, v), (b, _) in zip(marks, marks[1:]):
                if masking and version - v > eta:
                    tokens["masked"] += (b - a) / total
                    tokens["wasted"] += (b - a) / total
                else:
                    add(version - v, (b - a) / total)
        training_until = now + train_time

    def ended(now: float) -> list[tuple[float, int, int]]:
        """Episodes that end at `now`, in the order (end, index) of all workers."""
        out = []
        for w, wk in enumerate(pool):
            if load:
                wk.engine.paused = now < wk.paused_until
                for ep in wk.engine.pop(now, wk.version):
                    out.append((ep.end, ep.index, w))
            while wk.ends and wk.ends[0][0] <= now:
                end, index = heapq.heappop(wk.ends)
                out.append((end, index, w))
        if len(out) > 1:
            out.sort()
        return out

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
        t_next = min([*step, *pauses], default=math.inf)
        if training_until is None and deadline is not None:
            t_next = min(t_next, max(deadline, t))
        for wk in pool:
            if wk.ends:
                t_next = min(t_next, wk.ends[0][0])
            if load:
                wk.engine.paused = t < wk.paused_until
                wk.engine.factor = co_run if training_until is not None else 1.0
                t_next = min(t_next, wk.engine.next_time(t))
                pending = (wk.queue and len(wk.running) < wk.slots) or wk.version < version
                if slice_s and pending and wk.engine.asleep(t, slice_s):
                    t_next = min(t_next, wk.engine.wake(t, slice_s))
                if wk.queue and wk.gate > t:
                    t_next = min(t_next, wk.gate)
        if t_next == math.inf:
            raise RuntimeError("the simulated pipeline stalled: nothing runs, trains or loads")
        for wk in pool:
            wk.busy += len(wk.running) * (t_next - t)
            if load:
                wk.engine.advance(t, t_next)
        if trace is not None and load:
            dec = sum(wk.engine.counts()[0] for wk in pool)
            tools = sum(wk.engine.counts()[1] for wk in pool)
            flight = sum(len(wk.running) for wk in pool)
            paused = sum(len(wk.running) for wk in pool if t < wk.paused_until)
            trace.append([t, dec, tools, flight, paused])
        t = t_next
        for _, index, w in ended(t):
            ep = pool[w].running.pop(index)
            if release == "episode":
                pool[w].held -= 1
            launched.append(ep.end - ep.start)
            group_episodes[ep.group].append(ep)
            group_left[ep.group] -= 1
            if not group_left[ep.group]:  # the controller hears of a group when its last episode ends
                del group_left[ep.group]
                finished.append(ep.group)
                held_by = pool[group_worker.pop(ep.group)]
                if release == "group":
                    held_by.held -= E
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
        "aborted": aborted,
        "cut": cut,
        "started": started,
        **{f"{k}_tokens": v for k, v in tokens.items()},
        "trained_duration": trained_seconds / trained if trained else math.nan,
        "launched_duration": sum(launched) / len(launched) if launched else math.nan,
    }
