"""The load model in windows, on arrays: :func:`lrl_lab.sim.board.simulate_board`'s load model for large pipelines.

The event model (:mod:`lrl_lab.sim.load`) takes every action's end and every tool answer one at a time, a heap
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
model has them). :func:`simulate_windowed` checks that and says so, and runs :class:`WindowedModel` (its pieces,
on arrays: :mod:`lrl_lab.sim.windowed_state`). Against the event model at 256-4,096 slots it agrees within the
tolerances its tests assert (tests/sim/test_windowed.py); bench/bench_simulate.py times both.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from lrl.pipeline.policies import issue_limit, unit_episodes, worker_capacity
from lrl_lab.sim.load import EngineCurve, parse_turns
from lrl_lab.sim.windowed_state import INF, Ring, Rows, Worker, Workload, add_counts

# of the sequences decoding, about this share end their action within a window (by default)
WINDOW_SHARE = 0.025


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

    The arguments and keys are :func:`lrl_lab.sim.board.simulate_board`'s (its load model, ``policy="drop"``,
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
    return WindowedModel(
        Workload(episodes), n_slots, group_size, groups_per_batch, train_time, switch_time, max_staleness,
        interrupt, steps, engine=engine, workers=workers, drop=drop, sync_before=sync_before, co_run=co_run,
        window_steps=window_steps,
    ).run()  # fmt: skip


class WindowedModel:
    """lrl's pipeline under the load model, in windows (see the module docstring; the arguments are
    :func:`simulate_windowed`'s, checked, the turns as a :class:`~lrl_lab.sim.windowed_state.Workload`).
    ``run()`` -> the result's dict."""

    def __init__(self, work: Workload, n_slots, group_size, groups_per_batch, train_time, switch_time,
                 max_staleness, interrupt, steps, *, engine, workers, drop, sync_before, co_run,
                 window_steps):  # fmt: skip
        self.work = work
        self.n_slots, self.G, self.E = n_slots, groups_per_batch, group_size
        self.eta = 0 if sync_before else max_staleness
        self.train_time, self.switch_time, self.interrupt, self.steps = (
            train_time,
            switch_time,
            interrupt,
            steps,
        )
        self.engine, self.drop, self.co_run, self.window_steps = engine, drop, co_run, window_steps
        self.capacity = worker_capacity(n_slots, unit_episodes(groups_per_batch, workers, group_size))
        self.units = [np.arange(w, self.G, workers, dtype=np.int64) for w in range(workers)]
        self.pool = [Worker(n_slots) for _ in range(workers)]
        # rows: one per episode started and not yet taken by the trainer
        self.rows = Rows(
            1 << max(10, int(math.ceil(math.log2((self.eta + 3) * self.G * self.E + workers * n_slots))))
        )
        # groups: a ring over group ids (a group is live from its issue to its take)
        self.ring = Ring((min(steps + self.eta + 2, 64)) * self.G, self.E)
        self.version = 0
        self.issued = 0
        self.started = 0
        self.training_until: float | None = None
        self.trained = self.dropped = 0
        self.trained_seconds = self.launched = 0.0
        self.n_launched = 0
        self.tokens = {"decoded": 0.0, "wasted": 0.0, "masked": 0.0}
        self.finished: deque[int] = deque()  # finished groups, in the order they finished
        self.step_ends: list[float] = []
        self.step_trained: list[int] = []
        self.hist = np.zeros(0)
        self.ep_hist = np.zeros(0, dtype=np.int64)

    # -- the episodes' turns ------------------------------------------------------------------------------
    def begin(self, wk: Worker, r: np.ndarray, at: np.ndarray) -> None:
        """Rows `r` begin their current turn at times `at`: decode its action, or (no tokens) call its tool."""
        rows, work = self.rows, self.work
        idx = rows.turn[r]
        n = work.turn_tokens[idx]
        zero = n == 0
        if zero.any():
            wk.wait_tool(r[zero], at[zero] + work.turn_tool[idx[zero]])
            r, at, n = r[~zero], at[~zero], n[~zero]
        if r.size:
            moved = rows.cur_v[r] != wk.version
            if moved.any():  # a switch came while it waited for a tool: its next action has the new weights
                rows.flush(r[moved])
                rows.cur_v[r] = wk.version
            began = wk.at(at)
            rows.cur_tok[r] += n
            wk.dec.push(began + n, r)
            wk.ndec += r.size

    # -- the controller -----------------------------------------------------------------------------------
    def issue(self, now: float) -> None:
        """Hand out every batch the throttle allows, while every worker has room for its unit."""
        pool, ring, G, E = self.pool, self.ring, self.G, self.E
        while self.issued < issue_limit(self.version, self.eta):
            if any(pool[w].held + u.size * E > self.capacity for w, u in enumerate(self.units) if u.size):
                return
            base = self.issued * G
            for w, unit in enumerate(self.units):
                if not unit.size:
                    continue
                groups = base + unit
                ring.open(groups % ring.size, E, w, G)
                pool[w].queue.append([now, np.repeat(groups, E), 0])
                pool[w].held += unit.size * E
            self.issued += 1

    # -- the trainer --------------------------------------------------------------------------------------
    def take(self, now: float) -> None:
        """The waiting trainer takes batches of the oldest finished groups while it can, training from `now`."""
        while self.training_until is None and len(self.finished) >= self.G and self.version < self.steps:
            groups = np.array([self.finished.popleft() for _ in range(self.G)], dtype=np.int64)
            self.train(self.ring.close(groups % self.ring.size), now)

    def train(self, r: np.ndarray, now: float) -> None:
        """The episodes of rows `r` are taken: the bound drops the stale ones, the rest train; the rows free."""
        rows, tokens, version = self.rows, self.tokens, self.version
        col = rows.cur_v[r] - rows.start_v[r]
        if col.max() >= rows.span:
            rows.grow_span(int(col.max()) + 1)
        amounts = rows.tok[r]  # tokens per version from the one each started on, the current version's added
        amounts[np.arange(r.size), col] += rows.cur_tok[r]
        work = amounts.sum(axis=1)
        tokens["decoded"] += float(work.sum())
        start_v = rows.start_v[r]
        keep = None
        if self.drop:
            keep = version - start_v <= self.eta
            self.dropped += int(r.size - np.count_nonzero(keep))
            tokens["wasted"] += float(work.sum() - work[keep].sum())
            if keep.all():
                keep = None
        n_kept = r.size if keep is None else int(np.count_nonzero(keep))
        if n_kept:
            self.trained += n_kept
            dur = rows.dur[r]
            self.trained_seconds += float(dur.sum() if keep is None else dur[keep].sum())
            ages = version - start_v
            self.ep_hist = add_counts(self.ep_hist, np.bincount(ages if keep is None else ages[keep]))
            for c in range(amounts.shape[1]):  # tokens of the version `c` after the one started on
                w = amounts[:, c]
                on = np.flatnonzero(w if keep is None else w * keep)
                if on.size:
                    self.hist = add_counts(self.hist, np.bincount(ages[on] - c, weights=w[on]))
            self.step_trained.append(n_kept)
            self.training_until = now + self.train_time
        rows.tok[r] = 0.0
        rows.give(r)

    # -- the workers --------------------------------------------------------------------------------------
    def switch(self, wk: Worker, now: float) -> None:
        """New weights: what each decoding row decoded so far is its old version's; the rest the new one's."""
        rows = self.rows
        live, target = wk.decoding_rows()
        if live.size:
            rest = np.maximum(target - wk.steps, 0.0)  # of each action, what is not decoded yet
            rows.cur_tok[live] -= rest
            rows.flush(live)
            rows.cur_tok[live] = rest
            rows.cur_v[live] = self.version
        wk.version = self.version
        wk.paused_until = now + self.switch_time

    def admit(self, wk: Worker, limit: float, now: float):
        """Match queued episodes to free slots, each starting at the later of its slot's and its issue's time,
        from `now` and up to `limit` -> (start times, group ids) or None."""
        if wk.version < self.version:
            if not self.interrupt and wk.running() == 0 and wk.paused_until <= now:
                self.switch(wk, max(now, float(wk.free[-1])))  # when its last episode ended
            elif not self.interrupt:
                return None  # draining: nothing starts until the episodes in flight are done
        return wk.match(max(now, wk.paused_until), limit)

    def start(self, matches: list) -> bool:
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
        rows, ring = self.rows, self.ring
        for (w, (at, gids)), rank in zip(present, ranks):
            wk, k = self.pool[w], at.size
            r = rows.take(k)
            rows.group[r] = gids
            rows.start_v[r] = wk.version
            rows.cur_v[r] = wk.version
            drawn = (self.started + rank) % self.work.n_pool
            rows.turn[r] = self.work.first_turn[drawn]
            rows.start[r] = at
            rows.cur_tok[r] = 0.0
            ring.seat(gids % ring.size, r)
            self.begin(wk, r, at)
            total += k
        self.started += total
        return True

    def finish_groups(self, ended_rows: np.ndarray, ended_at: np.ndarray) -> bool:
        """Episodes ended: their groups count down; groups done, in the order they finished, go to the trainer
        (which takes at that time when it waits, as the controller issues then) -> whether any finished."""
        ring = self.ring
        places = self.rows.group[ended_rows] % ring.size
        np.subtract.at(ring.left, places, 1)
        done = np.unique(places[ring.left[places] == 0])
        if not done.size:
            return False
        at = np.searchsorted(done, places)
        hit = at < done.size
        hit[hit] = done[at[hit]] == places[hit]
        last = np.full(done.size, -INF)
        np.maximum.at(last, at[hit], ended_at[hit])  # when each group's last episode ended
        order = np.argsort(last, kind="stable")
        places_o = done[order]
        gids = self.rows.group[ring.rows[places_o, 0]]
        owner = ring.worker[places_o]
        when = last[order]
        ring.left[places_o] = 0
        i, n = 0, places_o.size
        while i < n:  # in bulk up to the next group at which the waiting trainer's controller issues or takes
            j = n - 1 if self.training_until is not None else min(n - 1, self.acts_at(i, owner))
            for w, wk in enumerate(self.pool):
                wk.held -= self.E * int(np.count_nonzero(owner[i : j + 1] == w))
            self.finished.extend(gids[i : j + 1].tolist())
            if self.training_until is None:
                self.issue(float(when[j]))
                self.take(float(when[j]))
            i = j + 1
        return True

    def acts_at(self, i: int, owner: np.ndarray) -> int:
        """The first position k >= i in the groups finishing (in order) after which the waiting trainer can take
        a batch, or the controller issue one (every worker has room for its unit), counting groups i..k."""
        E = self.E
        k = i + max(self.G - len(self.finished), 1) - 1  # the take
        if self.issued < issue_limit(self.version, self.eta):
            need = []
            for w, unit in enumerate(self.units):
                short = self.pool[w].held + unit.size * E - self.capacity if unit.size else 0
                if short > 0:
                    mine = np.flatnonzero(owner[i:] == w)
                    count = -(-short // E)
                    need.append(i + int(mine[count - 1]) if mine.size >= count else owner.size)
            k = min(k, max(need, default=i))
        return k

    # -- time ---------------------------------------------------------------------------------------------
    def boundary(self, now: float) -> None:
        """Between windows: a step that ends publishes, the controller issues, workers switch and start work, the
        trainer takes."""
        if self.training_until is not None and self.training_until <= now:
            self.training_until = None
            self.version += 1
            self.step_ends.append(now)
            self.issue(now)
        if self.training_until is None:
            self.issue(now)
        for wk in self.pool:
            if wk.version < self.version and now >= wk.paused_until and (self.interrupt or wk.running() == 0):
                self.switch(wk, now)
            wk.sec = 0.0
            wk.t0 = now
        self.start([self.admit(wk, now, now) for wk in self.pool])
        self.take(now)

    def window(self, t: float, t1: float) -> None:
        """Every event from `t` to `t1` at each engine's rate at `t`: actions end, tools answer, episodes end and
        their slots take queued ones, groups finish; in passes, until one finds nothing more."""
        rows, work = self.rows, self.work
        for wk in self.pool:
            wk.t0 = t
        changed = True
        while changed:
            changed = False
            ends_r, ends_t = [], []
            for wk in self.pool:
                limit = wk.steps + (t1 - t) / wk.sec if wk.sec > 0 else wk.steps
                target, r = wk.dec.pop(limit + 1e-9 * max(1.0, limit))
                if r.size:
                    changed = True
                    wk.ndec -= r.size
                    when = t + (target - wk.steps) * wk.sec  # (paused or not decoding: sec 0, at t)
                    wk.wait_tool(r, when + work.turn_tool[rows.turn[r]])
                answer, r = wk.tool.pop(t1)
                if r.size:
                    changed = True
                    wk.ntool -= r.size
                    over = work.is_last[rows.turn[r]]
                    rows.turn[r] += 1
                    if over.any():
                        gone, at = r[over], answer[over]
                        rows.dur[gone] = at - rows.start[gone]
                        ends_r.append(gone)
                        ends_t.append(at)
                        wk.free = np.sort(np.concatenate([wk.free, at]), kind="stable")  # runs: near linear
                    if (~over).any():
                        self.begin(wk, r[~over], answer[~over])
            if ends_r:
                r, at = np.concatenate(ends_r), np.concatenate(ends_t)
                self.launched += float(rows.dur[r].sum())
                self.n_launched += r.size
                self.finish_groups(r, at)
                changed = True
            if self.start([self.admit(wk, t1, t) for wk in self.pool]):
                changed = True
        for wk in self.pool:
            if wk.sec > 0:
                wk.steps += (t1 - t) / wk.sec

    def window_end(self, t: float) -> float:
        """Where the window from `t` ends: ``window_steps`` engine steps of the fastest engine decoding (or its
        next event, when later), a step's end, a weight load's end; each engine's step cost set for it."""
        training = self.training_until is not None
        t1 = self.training_until if training else INF
        for wk in self.pool:
            if wk.paused_until > t:
                t1 = min(t1, wk.paused_until)
                wk.sec = 0.0
            elif wk.ndec:
                wk.sec = self.engine.seconds(wk.ndec) * (self.co_run if training else 1.0)
            else:
                wk.sec = 0.0
        for wk in self.pool:
            nxt = wk.tool.first()
            if wk.sec > 0:
                decode_next = t + (wk.dec.first() - wk.steps) * wk.sec
                nxt = min(nxt, decode_next)
                t1 = min(t1, max(t + self.window_steps * wk.sec, nxt))
            else:
                t1 = min(t1, nxt)
        if t1 == INF:
            raise RuntimeError("the simulated pipeline stalled: nothing runs, trains or loads")
        return max(t1, t)

    def run(self) -> dict:
        """Simulate until the trainer has made its steps -> the result (:func:`simulate_windowed`)."""
        t = 0.0
        self.issue(t)
        self.boundary(t)
        while self.version < self.steps:
            t1 = self.window_end(t)
            self.window(t, t1)
            t = t1
            self.boundary(t)
        return self.result(t)

    def result(self, t: float) -> dict:
        busy = self.launched  # slot-seconds: the episodes that ended, and those still in flight until now
        for wk in self.pool:
            for _, _, _, r in (*wk.dec.heap, *wk.tool.heap):
                busy += float((t - self.rows.start[r]).sum())
        capacity_time = len(self.pool) * self.n_slots * t
        hist, ep_hist = self.hist, self.ep_hist
        n_hist = float(hist.sum())
        trained = self.trained
        return {
            "time": t,
            "step_ends": self.step_ends,
            "step_trained": self.step_trained,
            "episodes_per_s": trained / t if t else math.nan,
            "slot_util": busy / capacity_time if capacity_time else math.nan,
            "staleness_mean": float((np.arange(hist.size) * hist).sum() / n_hist) if n_hist else math.nan,
            "staleness_max": int(ep_hist.size - 1),
            "staleness_hist": [float(c / n_hist) for c in hist] if n_hist else [],
            "episode_staleness_hist": [int(c) for c in ep_hist],
            "trained": trained,
            "dropped": self.dropped,
            "aborted": 0,
            "cut": 0,
            "started": self.started,
            **{f"{k}_tokens": v for k, v in self.tokens.items()},
            "trained_duration": self.trained_seconds / trained if trained else math.nan,
            "launched_duration": self.launched / self.n_launched if self.n_launched else math.nan,
        }
