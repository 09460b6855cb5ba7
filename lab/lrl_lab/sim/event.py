"""The event model of lrl's pipeline, :func:`lrl_lab.sim.board.simulate_board`'s engine: one event at a time.

:class:`EventModel` holds the pipeline's state and has one method per thing that happens (the controller issues,
a worker admits, switches or stops work, an episode ends, the trainer takes and trains); its pieces
(:mod:`lrl_lab.sim.event_state`) are a :class:`Worker`, the :class:`Groups` issued and not yet taken and the
:class:`Tally` of what was trained and what was wasted. The rules are in :mod:`lrl_lab.sim.board`'s docstring; the
throttle and a worker's capacity come from :mod:`lrl.pipeline.policies`, as the pipeline has them, and the
staleness policy is the pipeline's own object, built from the registry (:mod:`lrl_lab.sim.policy`): the model calls
its hooks where the pipeline does (its take, its verdict on each episode taken, a worker seeing a newer version)
and never asks which policy it holds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from lrl.pipeline.policies import DEFAULT_POLICY, Verdict, issue_limit, unit_episodes, worker_capacity
from lrl_lab.sim.event_state import Episode, Groups, Tally, Worker
from lrl_lab.sim.load import LoadEngine
from lrl_lab.sim.policy import SimSchedule, SimWorker, make_policy


class EventModel:
    """lrl's pipeline, one event at a time (see :func:`lrl_lab.sim.board.simulate_board` for the arguments, which
    this takes checked, and :mod:`lrl_lab.sim.board` for the rules). ``run()`` -> the result's dict."""

    def __init__(self, durs, episodes, n_slots, group_size, groups_per_batch, train_time, switch_time,
                 max_staleness, interrupt, steps, *, workers, drop, sync_before, engine, co_run, trace, release,
                 slice_s, policy, tool_servers, patience):  # fmt: skip
        self.load = durs is None
        self.durs, self.episodes = durs, episodes
        self.G, self.E = groups_per_batch, group_size
        self.eta = 0 if sync_before else max_staleness
        self.train_time, self.switch_time, self.interrupt, self.steps = (
            train_time,
            switch_time,
            interrupt,
            steps,
        )
        self.co_run, self.trace, self.release, self.slice_s = co_run, trace, release, slice_s
        if sync_before:  # the synchronous stream: nothing is stale, the policy chosen does not apply
            policy = DEFAULT_POLICY
        self.policy = make_policy(policy, drop=drop, patience=patience)  # drop=False: the throttle alone
        self.schedule = SimSchedule(self, self.policy)  # what the policy's take sees
        self.capacity = worker_capacity(n_slots, unit_episodes(groups_per_batch, workers, group_size))
        self.n_slots = n_slots
        self.pool = [Worker(n_slots) for _ in range(workers)]
        if self.load:
            for wk in self.pool:
                wk.engine = LoadEngine(engine, tool_servers)
        self.units = [
            list(range(w, self.G, workers)) for w in range(workers)
        ]  # each worker's groups of a batch
        self.t = 0.0
        self.version = 0  # the trainer's
        self.issued_batches = 0
        self.started = 0  # episodes handed a duration
        self.groups = Groups()
        self.tally = Tally()
        self.training_until: float | None = None
        self.step_ends: list[float] = []
        self.step_trained: list[int] = []

    # -- the controller -----------------------------------------------------------------------------------
    def issue(self) -> None:
        """Hand out every batch the throttle allows, while every worker has room for its unit."""
        pool, E, t = self.pool, self.E, self.t
        while self.issued_batches < issue_limit(self.version, self.eta):
            if any(pool[w].held + len(u) * E > self.capacity for w, u in enumerate(self.units) if u):
                return
            for w, unit in enumerate(self.units):
                for g in unit:
                    group = self.issued_batches * self.G + g
                    self.groups.open(group, w, E)
                    for _ in range(E):
                        pool[w].queue.append(group)
                pool[w].held += len(unit) * E
                if unit and self.slice_s and pool[w].engine.blocked() and pool[w].gate <= t:
                    pool[w].gate = pool[w].engine.wake_after(t, self.slice_s)  # the message finds it waiting
            self.issued_batches += 1

    # -- the workers --------------------------------------------------------------------------------------
    def admit(self, now: float) -> None:
        """Each worker that is awake acts on the board (the policy, once a version, then a switch) and starts
        what its slots allow."""
        for worker in self.pool:
            if self.slice_s and worker.engine.asleep(now, self.slice_s):
                continue  # blocked on its tools' answers: it sees the board and its messages later
            if worker.seen < self.version:  # a version newer than any it saw: the policy acts on its work
                worker.seen = self.version
                self.policy.published(SimWorker(self, worker, now), self.version)
            newer = worker.version < self.version  # a newer version is on the board
            if newer and now >= worker.paused_until and (self.interrupt or not worker.running):
                self.switch(worker, now)
                newer = False
            if now < worker.paused_until or (newer and not self.interrupt):
                continue  # loading weights, or draining: start nothing until the episodes in flight are done
            while worker.queue and len(worker.running) < worker.slots and now >= worker.gate:
                self.start(worker, worker.queue.popleft(), now)

    def start(self, worker: Worker, group: int, now: float) -> None:
        """An episode of `group` starts on `worker` at `now`, on the worker's weights."""
        if self.load:
            ep = Episode(self.started, group, 0.0, now, math.inf, worker.version)
            ep.turns = self.episodes[self.started % len(self.episodes)]
            self.started += 1
            worker.running[ep.index] = ep
            if worker.engine.begin_turn(ep, now, worker.version):  # no turns to run: ends now
                ep.end = now
                heapq.heappush(worker.ends, (now, ep.index))
            return
        d = self.durs[self.started % len(self.durs)]
        ep = Episode(self.started, group, d, now, now + d, worker.version)
        self.started += 1
        worker.running[ep.index] = ep
        heapq.heappush(worker.ends, (ep.end, ep.index))

    def switch(self, worker: Worker, now: float) -> None:
        """`worker` loads the trainer's version; its decoding pauses meanwhile."""
        worker.version = self.version
        worker.paused_until = now + self.switch_time
        if self.load:
            worker.engine.switch(now, self.version)
            return
        for ep in worker.running.values():  # decoding pauses while the weights load
            ep.end += self.switch_time
            ep.switches.append((now, self.version))
        if worker.running and self.switch_time:
            worker.ends[:] = [(ep.end, ep.index) for ep in worker.running.values()]
            heapq.heapify(worker.ends)

    def stop(self, worker: Worker, episodes: list[Episode], now: float) -> None:
        """Take `episodes` out of `worker` in flight (abort, cut): what they had decoded is wasted work."""
        gone = {ep.index for ep in episodes}
        for ep in episodes:
            del worker.running[ep.index]
            self.tally.launched.append(now - ep.start)
        if self.load:
            work = worker.engine.abort(gone, now) + sum(n for ep in episodes for _, n in ep.tokens)
        else:  # an episode's unit of work, spread evenly over its time
            worker.ends[:] = [e for e in worker.ends if e[1] not in gone]
            heapq.heapify(worker.ends)
            work = sum(
                min(1.0, (now - ep.start) / ep.duration) if ep.duration > 0 else 0.0 for ep in episodes
            )
        self.tally.wasted(work)

    def abort_stale(self, worker: Worker, now: float, version: int) -> int:
        """Stop the episodes in flight that started more than eta versions behind `version`; their groups'
        tasks go first in the worker's queue, to start again -> how many (WorkerView.abort_stale)."""
        stale = [ep for ep in worker.running.values() if version - ep.version > self.eta]
        if not stale:
            return 0
        self.stop(worker, stale, now)
        for ep in stale:
            worker.queue.appendleft(ep.group)
        self.tally.aborted += len(stale)
        return len(stale)

    def cut_short(self, worker: Worker, now: float, version: int) -> int:
        """Send every group at its last trainable version at `version` with at least half finished without its
        unfinished episodes -> how many (WorkerView.cut_stragglers)."""
        w, E, groups = self.pool.index(worker), self.E, self.groups
        mine = [g for g, left in groups.left.items() if groups.worker[g] == w and 2 * (E - left) >= E]
        cut = 0
        for g in mine:
            oldest = min(ep.version for ep in (*groups.episodes[g], *worker.flying(g)))
            if version - oldest == self.eta:
                self.cut_group(g, now)
                cut += 1
        return cut

    def cut_group(self, g: int, now: float) -> None:
        """Send group `g` without its unfinished episodes (its worker cuts it, or answers an ask to)."""
        worker = self.pool[self.groups.worker[g]]
        flying = worker.flying(g)
        self.stop(worker, flying, now)
        unstarted = sum(1 for q in worker.queue if q == g)
        if unstarted:
            worker.queue = deque(q for q in worker.queue if q != g)
        self.tally.cut += len(flying) + unstarted
        held_by = self.pool[self.groups.close(g)]
        held_by.held -= self.E if self.release == "group" else len(flying) + unstarted

    # -- the trainer --------------------------------------------------------------------------------------
    def take(self) -> list[Episode] | None:
        """The trainer's next batch: G finished groups as the policy chooses them, its verdict applied (None:
        not enough yet, or the policy waits)."""
        while len(self.groups.finished) >= self.G:
            groups = self.schedule.take()
            if groups is None:
                return None
            batch = self.screen(groups)
            if batch:
                return batch
        return None

    def screen(self, groups: list[int]) -> list[Episode]:
        """The episodes of `groups` the policy's verdict lets the trainer train, masked or whole (the rest are
        dropped). An episode shows the policy the version it started on, its oldest token's."""
        batch, tokens, oldest = [], self.tally.tokens, self.version - self.eta
        for g in groups:
            for ep in self.groups.episodes.pop(g):
                work = ep.work(self.load)
                tokens["decoded"] += work
                verdict = self.policy.verdict((ep.version,), oldest)
                if verdict is Verdict.DROP:
                    self.tally.dropped += 1
                    tokens["wasted"] += work
                else:
                    ep.masked = verdict is Verdict.MASK
                    batch.append(ep)
        return batch

    def train(self, batch: list[Episode], now: float) -> None:
        """Train `batch`: count its episodes and the staleness of its tokens (masked ones wasted)."""
        tally, version, eta = self.tally, self.version, self.eta
        self.step_trained.append(len(batch))
        for ep in batch:
            tally.trained += 1
            tally.trained_seconds += ep.end - ep.start
            oldest = version - ep.version
            if ep.masked:
                oldest = min(oldest, eta)  # its older tokens are masked, not trained
            tally.episode(oldest)
            if self.load:
                for v, n in ep.tokens:
                    self.count(version - v, n, ep.masked)
                continue
            marks = [(ep.start, ep.version), *ep.switches, (ep.end, None)]
            total = max(ep.end - ep.start, 1e-12)
            for (a, v), (b, _) in zip(marks, marks[1:]):
                self.count(version - v, (b - a) / total, ep.masked)
        self.training_until = now + self.train_time

    def count(self, age: int, amount: float, masked: bool) -> None:
        """Trained tokens (or token-time) of staleness `age`; of an episode the verdict masks, those past the
        bound are masked."""
        if masked and age > self.eta:
            self.tally.tokens["masked"] += amount
            self.tally.tokens["wasted"] += amount
        else:
            self.tally.add(age, amount)

    # -- time ---------------------------------------------------------------------------------------------
    def ended(self, now: float) -> list[tuple[float, int, int]]:
        """Episodes that end at `now`, in the order (end, index) of all workers."""
        out = []
        for w, wk in enumerate(self.pool):
            if self.load:
                wk.engine.paused = now < wk.paused_until
                for ep in wk.engine.pop(now, wk.version):
                    out.append((ep.end, ep.index, w))
            while wk.ends and wk.ends[0][0] <= now:
                end, index = heapq.heappop(wk.ends)
                out.append((end, index, w))
        if len(out) > 1:
            out.sort()
        return out

    def finish(self, w: int, index: int) -> None:
        """Episode `index` of worker `w` ended; its group finishes with its last episode (the controller hears of
        a group, not of an episode)."""
        pool, groups = self.pool, self.groups
        ep = pool[w].running.pop(index)
        if self.release == "episode":
            pool[w].held -= 1
        self.tally.launched.append(ep.end - ep.start)
        groups.episodes[ep.group].append(ep)
        groups.left[ep.group] -= 1
        if not groups.left[ep.group]:
            held_by = pool[groups.close(ep.group)]
            if self.release == "group":
                held_by.held -= self.E

    def next_time(self) -> float:
        """When the next thing happens: a step ends, a load ends, an episode or action ends, a tool answers, a
        worker wakes, the time a waiting take asks to be asked again (the policy's wakes())."""
        t = self.t
        pauses = [wk.paused_until for wk in self.pool if wk.paused_until > t]
        step = [self.training_until] if self.training_until is not None else []
        t_next = min([*step, *pauses], default=math.inf)
        wake = self.policy.wakes() if self.training_until is None else None
        if wake is not None:
            t_next = min(t_next, max(wake, t))
        for wk in self.pool:
            if wk.ends:
                t_next = min(t_next, wk.ends[0][0])
            if self.load:
                wk.engine.paused = t < wk.paused_until
                wk.engine.factor = self.co_run if self.training_until is not None else 1.0
                t_next = min(t_next, wk.engine.next_time(t))
                pending = (wk.queue and len(wk.running) < wk.slots) or wk.version < self.version
                if self.slice_s and pending and wk.engine.asleep(t, self.slice_s):
                    t_next = min(t_next, wk.engine.wake(t, self.slice_s))
                if wk.queue and wk.gate > t:
                    t_next = min(t_next, wk.gate)
        if t_next == math.inf:
            raise RuntimeError("the simulated pipeline stalled: nothing runs, trains or loads")
        return t_next

    def advance(self, t_next: float) -> None:
        """Time goes on to `t_next`: slots in flight are busy, engines decode (and the trace records)."""
        t = self.t
        for wk in self.pool:
            wk.busy += len(wk.running) * (t_next - t)
            if self.load:
                wk.engine.advance(t, t_next)
        if self.trace is not None and self.load:
            dec = sum(wk.engine.counts()[0] for wk in self.pool)
            tools = sum(wk.engine.counts()[1] for wk in self.pool)
            flight = sum(len(wk.running) for wk in self.pool)
            paused = sum(len(wk.running) for wk in self.pool if t < wk.paused_until)
            self.trace.append([t, dec, tools, flight, paused])
        self.t = t_next

    def run(self) -> dict:
        """Simulate until the trainer has made its steps -> the result (:func:`lrl_lab.sim.board.simulate_board`)."""
        self.issue()
        self.admit(self.t)
        self.policy.measured([])
        while self.version < self.steps:
            if self.training_until is None:
                batch = self.take()
                if batch is not None:
                    self.train(batch, self.t)
            self.advance(self.next_time())
            for _, index, w in self.ended(self.t):
                self.finish(w, index)
            if self.training_until is not None and self.training_until <= self.t:
                self.training_until = None
                self.version += 1
                self.step_ends.append(self.t)
                self.policy.measured([self.train_time] * min(self.version, 16))  # the trainer's last steps
                self.issue()  # the controller issues when it publishes
            if self.training_until is None:
                self.issue()  # and while the trainer waits for data
            self.admit(self.t)
        return self.result()

    def result(self) -> dict:
        t, tally = self.t, self.tally
        capacity_time = len(self.pool) * self.n_slots * t
        hist, n_hist, trained, launched = tally.hist, sum(tally.hist), tally.trained, tally.launched
        return {
            "time": t,
            "step_ends": self.step_ends,
            "step_trained": self.step_trained,
            "episodes_per_s": trained / t if t else math.nan,
            "slot_util": sum(wk.busy for wk in self.pool) / capacity_time if capacity_time else math.nan,
            "staleness_mean": sum(k * c for k, c in enumerate(hist)) / n_hist if n_hist else math.nan,
            "staleness_max": len(tally.ep_hist) - 1,
            "staleness_hist": [c / n_hist for c in hist] if n_hist else [],
            "episode_staleness_hist": tally.ep_hist,
            "trained": trained,
            "dropped": tally.dropped,
            "aborted": tally.aborted,
            "cut": tally.cut,
            "started": self.started,
            **{f"{k}_tokens": v for k, v in tally.tokens.items()},
            "trained_duration": tally.trained_seconds / trained if trained else math.nan,
            "launched_duration": sum(launched) / len(launched) if launched else math.nan,
        }
