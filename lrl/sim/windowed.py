"""The load model in windows, on arrays: :func:`lrl.sim.board.simulate_board`'s load model for large pipelines.

The event model (:mod:`lrl.sim.load`) takes every action's end and every tool answer one at a time, a heap
operation and a few Python objects each: about 85 us an episode at 16,384 slots on one core, so 20 steps of a
million slots (some 23 million episodes) would take half an hour. This model runs the same pipeline (the throttle, groups, a worker's
capacity, weight switches with partial rollouts or drain, the hard bound's drop, the co-run slowdown) with
episodes as rows of numpy arrays, and advances time in **windows**: a window holds each worker's engine rate
fixed at the rate for the sequences decoding at its start, and ends after ``window_steps`` engine steps of the
fastest engine (or at the next event, when that is later: the rate is then exact), at a trainer's publish or the
end of a weight load. Within a window every event is placed at its exact time given that rate: an action ends
at its step count, its tool answers ``tool seconds`` later, the next action starts then, a freed slot takes the
next queued episode at once, a group finishes with its last episode, the trainer takes a batch at the moment the
last of its groups finished. What a window leaves out:

- the rate's change within a window: a sequence that joins or leaves the engine changes the step cost from the
  next window on (with a million sequences decoding, one more moves the cost by a millionth);
- the order of events within a window, where one event causes another in the same window (an action ending,
  then its short tool, then the group finishing): they are resolved in passes, and groups finishing in a later
  pass are counted after those of an earlier one;
- the co-run slowdown from a take in mid-window to the window's end (applied from the next window);
- a worker's wait slice (``wait_slice``): a worker sees new work and weights at once (the event model's
  ``wait_slice=0``; a worker with many slots always has a sequence decoding, and so never blocks on tools).

Supported: the ``drop`` policy and the throttle alone (``drop=False``), any number of workers, interrupt and
drain, the synchronous stream; not the other staleness policies, tool pools or an occupancy trace (the event
model has them). :func:`simulate_windowed` checks that and says so. Against the event model at 256-4,096 slots
it agrees within the tolerances its tests assert (tests/sim/test_windowed.py); bench/bench_simulate.py times
both.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from lrl.sim.load import EngineCurve, parse_turns

INF = math.inf
# of the sequences decoding, about this share end their action within a window (by default)
WINDOW_SHARE = 0.025


class _Chunks:
    """Pending (key, row) pairs, as sorted chunks in a heap: push a batch, pop every pair with key <= a limit."""

    __slots__ = ("heap", "seq")

    def __init__(self):
        self.heap: list = []
        self.seq = 0

    def push(self, keys: np.ndarray, rows: np.ndarray) -> None:
        if keys.size == 0:
            return
        order = np.argsort(keys)
        keys, rows = keys[order], rows[order]
        self.seq += 1
        heapq.heappush(self.heap, (float(keys[0]), self.seq, keys, rows))

    def first(self) -> float:
        return self.heap[0][0] if self.heap else INF

    def pop(self, limit: float) -> tuple[np.ndarray, np.ndarray]:
        keys, rows = [], []
        heap = self.heap
        while heap and heap[0][0] <= limit:
            _, seq, k, r = heapq.heappop(heap)
            n = int(np.searchsorted(k, limit, side="right"))
            keys.append(k[:n])
            rows.append(r[:n])
            if n < k.size:
                heapq.heappush(heap, (float(k[n]), seq, k[n:], r[n:]))
        if not keys:
            return _EMPTY_F, _EMPTY_I
        if len(keys) == 1:
            return keys[0], rows[0]
        return np.concatenate(keys), np.concatenate(rows)


_EMPTY_F = np.zeros(0)
_EMPTY_I = np.zeros(0, dtype=np.int64)


class _Worker:
    __slots__ = ("version", "paused_until", "steps", "sec", "t0", "dec", "tool", "ndec", "ntool", "held",
                 "queue", "free")  # fmt: skip

    def __init__(self, slots: int):
        self.version = 0
        self.paused_until = -INF
        self.steps = 0.0  # engine steps so far (fluid)
        self.sec = 0.0  # seconds of an engine step in the window going on (0: not decoding, or paused)
        self.t0 = 0.0  # the window's start
        self.dec = _Chunks()  # decoding rows, by the step count at which their action is complete
        self.tool = _Chunks()  # rows waiting for a tool, by the time it answers
        self.ndec = 0
        self.ntool = 0
        self.held = 0  # episodes issued whose group has not finished
        self.queue: deque = deque()  # [time issued, group ids (one per episode), next position]
        self.free = np.zeros(slots)  # times from which each free slot is free, ascending

    def at(self, times: np.ndarray) -> np.ndarray:
        """Engine steps at `times` within the window (paused or not decoding: the steps at its start)."""
        if self.sec > 0:
            return self.steps + (times - self.t0) / self.sec
        return np.full(times.shape, self.steps)

    def running(self) -> int:
        return self.ndec + self.ntool


def simulate_windowed(
    n_slots: int,
    group_size: int,
    groups_per_batch: int,
    train_time: float,
    switch_time: float,
    max_staleness: int = 1,
    interrupt: bool = True,
    steps: int = 10,
    *,
    turns,
    engine: EngineCurve,
    workers: int = 1,
    drop: bool = True,
    sync_before: bool = False,
    co_run: float = 1.0,
    window_steps: float | None = None,
) -> dict:
    """Simulate `steps` training steps of lrl's pipeline under the load model, in windows -> dict.

    The arguments and keys are :func:`lrl.sim.board.simulate_board`'s (its load model, ``policy="drop"``,
    ``wait_slice=0``, ``release="group"``); ``window_steps`` is a window's length in engine steps of the fastest
    engine decoding at its start (smaller: closer to the event model, slower). None: sized so that about
    WINDOW_SHARE of the sequences decoding end their action within one, ``WINDOW_SHARE x`` the mean action's
    tokens, at most one step (and at least 0.02): the rate a window holds fixed then changes by about that share
    within it, whether actions are 3 tokens or 300."""
    episodes = parse_turns(turns)
    if window_steps is None:
        decoded = [tok for ep in episodes for tok, _ in ep if tok > 0]
        mean = sum(decoded) / len(decoded) if decoded else 1.0
        window_steps = min(1.0, max(0.02, WINDOW_SHARE * mean))
    if not (window_steps > 0 and math.isfinite(window_steps)):
        raise ValueError("window_steps: a number of engine steps > 0")
    if co_run < 1.0 or not math.isfinite(co_run):
        raise ValueError("co_run: a slowdown >= 1")
    if n_slots < 1 or group_size < 1 or groups_per_batch < 1 or workers < 1:
        raise ValueError("slots, group size, groups per batch and workers must be >= 1")
    n_turns = np.array([len(ep) for ep in episodes], dtype=np.int64)
    first_turn = np.concatenate([[0], np.cumsum(n_turns)[:-1]])
    turn_tokens = np.array([tok for ep in episodes for tok, _ in ep], dtype=np.float64)
    turn_tool = np.array([tool for ep in episodes for _, tool in ep], dtype=np.float64)
    n_pool = len(episodes)
    is_last = np.zeros(turn_tokens.size, dtype=bool)  # of each turn of the workload: its episode's last?
    is_last[first_turn + n_turns - 1] = True

    G, E = groups_per_batch, group_size
    eta = 0 if sync_before else max_staleness
    share = -(-G // workers) * E
    capacity = max(n_slots, share) + share
    units = [np.arange(w, G, workers, dtype=np.int64) for w in range(workers)]
    pool = [_Worker(n_slots) for _ in range(workers)]

    # rows: one per episode started and not yet taken by the trainer (a free list recycles them)
    rows = 1 << max(10, int(math.ceil(math.log2((eta + 3) * G * E + workers * n_slots))))
    span = 2  # columns of tokens per version, from the version an episode started on; grows when needed
    R = {
        "group": np.zeros(rows, dtype=np.int64),
        "start_v": np.zeros(rows, dtype=np.int64),
        "cur_v": np.zeros(rows, dtype=np.int64),
        "turn": np.zeros(rows, dtype=np.int64),  # the turn it is at, as a place in the pool's flat turns
        # tokens of its current version not yet in `tok`: an action's whole count from its start (what a switch
        # finds undecoded moves to the new version)
        "cur_tok": np.zeros(rows),
        "start": np.zeros(rows),
        "dur": np.zeros(rows),  # from its start to its end
    }
    tok = np.zeros((rows, span))
    free_rows_arr = np.arange(rows - 1, -1, -1, dtype=np.int64)
    free_top = rows  # free_rows_arr[:free_top] are free (a stack)

    # groups: a ring over group ids (a group is live from its issue to its take)
    ring = (min(steps + eta + 2, 64)) * G
    g_left = np.full(ring, -1, dtype=np.int64)  # episodes not finished (-1: the ring place is free)
    g_started = np.zeros(ring, dtype=np.int64)
    g_rows = np.zeros((ring, E), dtype=np.int64)
    g_worker = np.zeros(ring, dtype=np.int64)

    st = {
        "version": 0, "issued": 0, "started": 0, "training_until": None, "trained": 0, "dropped": 0,
        "trained_seconds": 0.0, "launched": 0.0, "n_launched": 0,
    }  # fmt: skip
    tokens = {"decoded": 0.0, "wasted": 0.0, "masked": 0.0}
    finished: deque[int] = deque()  # finished groups, in the order they finished
    step_ends: list[float] = []
    step_trained: list[int] = []
    hist = np.zeros(0)
    ep_hist = np.zeros(0, dtype=np.int64)

    def take_rows(k: int) -> np.ndarray:
        nonlocal free_top, rows, tok, free_rows_arr
        if k > free_top:  # more episodes alive than planned: grow every row array
            grow = max(k - free_top, rows)
            for key, arr in R.items():
                R[key] = np.concatenate([arr, np.zeros(grow, dtype=arr.dtype)])
            tok = np.concatenate([tok, np.zeros((grow, tok.shape[1]))])
            free_rows_arr = np.concatenate(
                [np.arange(rows + grow - 1, rows - 1, -1), free_rows_arr[:free_top]]
            )
            free_top += grow
            rows += grow
        out = free_rows_arr[free_top - k : free_top].copy()
        free_top -= k
        return out

    def give_rows(r: np.ndarray) -> None:
        nonlocal free_top, free_rows_arr
        if free_top + r.size > free_rows_arr.size:
            free_rows_arr = np.concatenate([free_rows_arr, np.zeros(r.size, dtype=np.int64)])
        free_rows_arr[free_top : free_top + r.size] = r
        free_top += r.size

    def grow_span(columns: int) -> None:
        nonlocal tok, span
        tok = np.concatenate([tok, np.zeros((tok.shape[0], columns - span))], axis=1)
        span = columns

    def flush(r: np.ndarray) -> None:
        """Rows `r` (distinct) put the tokens of their current version in its column of `tok`."""
        amount = R["cur_tok"][r]
        on = amount > 0
        r, amount = r[on], amount[on]
        R["cur_tok"][r] = 0.0
        col = R["cur_v"][r] - R["start_v"][r]
        if col.size and col.max() >= span:
            grow_span(int(col.max()) + 1)
        tok[r, col] += amount  # the rows of one call are distinct

    def begin(wk: _Worker, r: np.ndarray, at: np.ndarray) -> None:
        """Rows `r` begin their current turn at times `at`: decode its action, or (no tokens) call its tool."""
        idx = R["turn"][r]
        n = turn_tokens[idx]
        zero = n == 0
        if zero.any():
            to_tool(wk, r[zero], at[zero] + turn_tool[idx[zero]])
            r, at, n = r[~zero], at[~zero], n[~zero]
        if r.size:
            moved = R["cur_v"][r] != wk.version
            if moved.any():  # a switch came while it waited for a tool: its next action has the new weights
                flush(r[moved])
                R["cur_v"][r] = wk.version
            began = wk.at(at)
            R["cur_tok"][r] += n
            wk.dec.push(began + n, r)
            wk.ndec += r.size

    def to_tool(wk: _Worker, r: np.ndarray, answers: np.ndarray) -> None:
        wk.tool.push(answers, r)
        wk.ntool += r.size

    def issue(now: float) -> None:
        while st["issued"] < st["version"] + 1 + eta:
            if any(pool[w].held + u.size * E > capacity for w, u in enumerate(units) if u.size):
                return
            base = st["issued"] * G
            for w, unit in enumerate(units):
                if not unit.size:
                    continue
                groups = base + unit
                places = groups % ring
                if (g_left[places] != -1).any():
                    raise RuntimeError(
                        f"the windowed load model keeps groups of the last {ring // G} batches: a group issued "
                        "that long ago is still in flight; use the event model (simulate_board)"
                    )
                g_left[places] = E
                g_started[places] = 0
                g_worker[places] = w
                pool[w].queue.append([now, np.repeat(groups, E), 0])
                pool[w].held += unit.size * E
            st["issued"] += 1

    def take(now: float) -> None:
        nonlocal hist, ep_hist
        while st["training_until"] is None and len(finished) >= G and st["version"] < steps:
            groups = np.array([finished.popleft() for _ in range(G)], dtype=np.int64)
            places = groups % ring
            r = g_rows[places].ravel()
            g_left[places] = -1
            version = st["version"]
            col = R["cur_v"][r] - R["start_v"][r]
            if col.max() >= span:
                grow_span(int(col.max()) + 1)
            amounts = tok[r]  # tokens per version from the one each started on, the current version's added
            amounts[np.arange(r.size), col] += R["cur_tok"][r]
            work = amounts.sum(axis=1)
            tokens["decoded"] += float(work.sum())
            start_v = R["start_v"][r]
            keep = None
            if drop:
                keep = version - start_v <= eta
                st["dropped"] += int(r.size - np.count_nonzero(keep))
                tokens["wasted"] += float(work.sum() - work[keep].sum())
                if keep.all():
                    keep = None
            n_kept = r.size if keep is None else int(np.count_nonzero(keep))
            if n_kept:
                st["trained"] += n_kept
                dur = R["dur"][r]
                st["trained_seconds"] += float(dur.sum() if keep is None else dur[keep].sum())
                ages = version - start_v
                ep_hist = _add_counts(ep_hist, np.bincount(ages if keep is None else ages[keep]))
                for c in range(amounts.shape[1]):  # tokens of the version `c` after the one started on
                    w = amounts[:, c]
                    on = np.flatnonzero(w if keep is None else w * keep)
                    if on.size:
                        hist = _add_counts(hist, np.bincount(ages[on] - c, weights=w[on]))
                step_trained.append(n_kept)
                st["training_until"] = now + train_time
            tok[r] = 0.0
            give_rows(r)

    def switch(wk: _Worker, now: float) -> None:
        """New weights: what each decoding row decoded so far is its old version's; the rest the new one's."""
        live, target = _decoding_rows(wk)
        if live.size:
            rest = np.maximum(target - wk.steps, 0.0)  # of each action, what is not decoded yet
            R["cur_tok"][live] -= rest
            flush(live)
            R["cur_tok"][live] = rest
            R["cur_v"][live] = st["version"]
        wk.version = st["version"]
        wk.paused_until = now + switch_time

    def _decoding_rows(wk: _Worker) -> tuple[np.ndarray, np.ndarray]:
        """The rows decoding on `wk` and the step count at which each one's action is complete."""
        if not wk.dec.heap:
            return _EMPTY_I, _EMPTY_F
        return np.concatenate([c[3] for c in wk.dec.heap]), np.concatenate([c[2] for c in wk.dec.heap])

    def admit(wk: _Worker, limit: float, now: float):
        """Match queued episodes to free slots, each starting at the later of its slot's and its issue's time,
        from `now` and up to `limit` -> (start times, group ids) or None."""
        if wk.version < st["version"]:
            if not interrupt and wk.running() == 0 and wk.paused_until <= now:
                switch(wk, max(now, float(wk.free[-1])))  # when its last episode ended
            elif not interrupt:
                return None  # draining: nothing starts until the episodes in flight are done
        opens = max(now, wk.paused_until)
        if opens > limit or not wk.queue or not wk.free.size:
            return None
        starts, groups = [], []
        k = 0
        while wk.queue and k < wk.free.size:
            issued_at, gids, pos = wk.queue[0]
            n = min(gids.size - pos, wk.free.size - k)
            at = np.maximum(np.maximum(wk.free[k : k + n], issued_at), opens)
            within = at <= limit
            m = int(within.sum()) if not within.all() else n
            if m == 0:
                break
            starts.append(at[:m])
            groups.append(gids[pos : pos + m])
            k += m
            if pos + m == gids.size:
                wk.queue.popleft()
            else:
                wk.queue[0][2] = pos + m
            if m < n:
                break
        if not k:
            return None
        wk.free = wk.free[k:]
        return np.concatenate(starts), np.concatenate(groups)

    def start(matches: list) -> bool:
        """Start the episodes each worker matched (admit); they take the workload's episodes in the order they
        start, over all workers (cyclically), as the event model hands them out -> whether any started."""
        present = [(w, m) for w, m in enumerate(matches) if m is not None]
        if not present:
            return False
        if len(present) == 1:
            ranks = [np.arange(present[0][1][0].size)]
        else:
            times = np.concatenate([m[0] for _, m in present])
            order = np.argsort(times, kind="stable")  # equal times: in worker order
            rank = np.empty(times.size, dtype=np.int64)
            rank[order] = np.arange(times.size)
            ranks = np.split(rank, np.cumsum([m[0].size for _, m in present])[:-1])
        total = 0
        for (w, (at, gids)), rank in zip(present, ranks):
            wk, k = pool[w], at.size
            r = take_rows(k)
            R["group"][r] = gids
            R["start_v"][r] = wk.version
            R["cur_v"][r] = wk.version
            drawn = (st["started"] + rank) % n_pool
            R["turn"][r] = first_turn[drawn]
            R["start"][r] = at
            R["cur_tok"][r] = 0.0
            places = gids % ring
            # each started episode's place in its group: how many of its group started before it (the queue holds
            # a group's episodes one after another)
            newrun = np.r_[True, places[1:] != places[:-1]]
            j = np.arange(k) - np.maximum.accumulate(np.where(newrun, np.arange(k), 0))
            j += g_started[places]
            np.add.at(g_started, places, 1)
            g_rows[places, j] = r
            begin(wk, r, at)
            total += k
        st["started"] += total
        return True

    def finish_groups(ended_rows: np.ndarray, ended_at: np.ndarray) -> bool:
        """Episodes ended: their groups count down; groups done, in the order they finished, go to the trainer
        (which takes at that time when it waits, as the controller issues then) -> whether any finished."""
        places = R["group"][ended_rows] % ring
        np.subtract.at(g_left, places, 1)
        done = np.unique(places[g_left[places] == 0])
        if not done.size:
            return False
        at = np.searchsorted(done, places)
        hit = at < done.size
        hit[hit] = done[at[hit]] == places[hit]
        last = np.full(done.size, -INF)
        np.maximum.at(last, at[hit], ended_at[hit])  # when each group's last episode ended
        order = np.argsort(last, kind="stable")
        places_o = done[order]
        gids = R["group"][g_rows[places_o, 0]]
        owner = g_worker[places_o]
        when = last[order]
        g_left[places_o] = 0
        i, n = 0, places_o.size
        while i < n:  # in bulk up to the next group at which the waiting trainer's controller issues or takes
            j = n - 1 if st["training_until"] is not None else min(n - 1, acts_at(i, owner))
            for w, wk in enumerate(pool):
                wk.held -= E * int(np.count_nonzero(owner[i : j + 1] == w))
            finished.extend(gids[i : j + 1].tolist())
            if st["training_until"] is None:
                issue(float(when[j]))
                take(float(when[j]))
            i = j + 1
        return True

    def acts_at(i: int, owner: np.ndarray) -> int:
        """The first position k >= i in the groups finishing (in order) after which the waiting trainer can take
        a batch, or the controller issue one (every worker has room for its unit), counting groups i..k."""
        k = i + max(G - len(finished), 1) - 1  # the take
        if st["issued"] < st["version"] + 1 + eta:
            need = []
            for w, unit in enumerate(units):
                short = pool[w].held + unit.size * E - capacity if unit.size else 0
                if short > 0:
                    mine = np.flatnonzero(owner[i:] == w)
                    count = -(-short // E)
                    need.append(i + int(mine[count - 1]) if mine.size >= count else owner.size)
            k = min(k, max(need, default=i))
        return k

    def boundary(now: float) -> None:
        if st["training_until"] is not None and st["training_until"] <= now:
            st["training_until"] = None
            st["version"] += 1
            step_ends.append(now)
            issue(now)
        if st["training_until"] is None:
            issue(now)
        for wk in pool:
            if wk.version < st["version"] and now >= wk.paused_until and (interrupt or wk.running() == 0):
                switch(wk, now)
            wk.sec = 0.0
            wk.t0 = now
        start([admit(wk, now, now) for wk in pool])
        take(now)

    def window(t: float, t1: float) -> None:
        for wk in pool:
            wk.t0 = t
        changed = True
        while changed:
            changed = False
            ends_r, ends_t = [], []
            for wk in pool:
                limit = wk.steps + (t1 - t) / wk.sec if wk.sec > 0 else wk.steps
                target, r = wk.dec.pop(limit + 1e-9 * max(1.0, limit))
                if r.size:
                    changed = True
                    wk.ndec -= r.size
                    when = t + (target - wk.steps) * wk.sec  # (paused or not decoding: sec 0, at t)
                    to_tool(wk, r, when + turn_tool[R["turn"][r]])
                answer, r = wk.tool.pop(t1)
                if r.size:
                    changed = True
                    wk.ntool -= r.size
                    over = is_last[R["turn"][r]]
                    R["turn"][r] += 1
                    if over.any():
                        gone, at = r[over], answer[over]
                        R["dur"][gone] = at - R["start"][gone]
                        ends_r.append(gone)
                        ends_t.append(at)
                        wk.free = np.sort(np.concatenate([wk.free, at]), kind="stable")  # runs: near linear
                    if (~over).any():
                        begin(wk, r[~over], answer[~over])
            if ends_r:
                r, at = np.concatenate(ends_r), np.concatenate(ends_t)
                st["launched"] += float(R["dur"][r].sum())
                st["n_launched"] += r.size
                finish_groups(r, at)
                changed = True
            if start([admit(wk, t1, t) for wk in pool]):
                changed = True
        for wk in pool:
            if wk.sec > 0:
                wk.steps += (t1 - t) / wk.sec

    t = 0.0
    issue(t)
    boundary(t)
    while st["version"] < steps:
        training = st["training_until"] is not None
        t1 = st["training_until"] if training else INF
        for wk in pool:
            if wk.paused_until > t:
                t1 = min(t1, wk.paused_until)
                wk.sec = 0.0
            elif wk.ndec:
                wk.sec = engine.seconds(wk.ndec) * (co_run if training else 1.0)
            else:
                wk.sec = 0.0
        for wk in pool:
            nxt = wk.tool.first()
            if wk.sec > 0:
                decode_next = t + (wk.dec.first() - wk.steps) * wk.sec
                nxt = min(nxt, decode_next)
                t1 = min(t1, max(t + window_steps * wk.sec, nxt))
            else:
                t1 = min(t1, nxt)
        if t1 == INF:
            raise RuntimeError("the simulated pipeline stalled: nothing runs, trains or loads")
        t1 = max(t1, t)
        window(t, t1)
        t = t1
        boundary(t)

    busy = st["launched"]  # slot-seconds: the episodes that ended, and those still in flight until now
    for wk in pool:
        for _, _, _, r in (*wk.dec.heap, *wk.tool.heap):
            busy += float((t - R["start"][r]).sum())
    capacity_time = workers * n_slots * t
    n_hist = float(hist.sum())
    trained = st["trained"]
    return {
        "time": t,
        "step_ends": step_ends,
        "step_trained": step_trained,
        "episodes_per_s": trained / t if t else math.nan,
        "slot_util": busy / capacity_time if capacity_time else math.nan,
        "staleness_mean": float((np.arange(hist.size) * hist).sum() / n_hist) if n_hist else math.nan,
        "staleness_max": int(ep_hist.size - 1),
        "staleness_hist": [float(c / n_hist) for c in hist] if n_hist else [],
        "episode_staleness_hist": [int(c) for c in ep_hist],
        "trained": trained,
        "dropped": st["dropped"],
        "aborted": 0,
        "cut": 0,
        "started": st["started"],
        **{f"{k}_tokens": v for k, v in tokens.items()},
        "trained_duration": st["trained_seconds"] / trained if trained else math.nan,
        "launched_duration": st["launched"] / st["n_launched"] if st["n_launched"] else math.nan,
    }


def _add_counts(acc: np.ndarray, more: np.ndarray) -> np.ndarray:
    if more.size > acc.size:
        acc = np.concatenate([acc, np.zeros(more.size - acc.size, dtype=acc.dtype)])
    acc[: more.size] += more.astype(acc.dtype)
    return acc
