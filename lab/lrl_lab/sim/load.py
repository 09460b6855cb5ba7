"""The load model of :func:`lrl_lab.sim.board.simulate_board`: episodes as turns, engines that batch their decoding.

An episode is its turns in order, each ``(tokens decoded, tool seconds)``: the engine decodes the action, one token
per engine step, then the tool answers after its seconds (tools run in parallel, off the engine; or, given a pool
of tool servers, each call waits for a free one, first come first served, then takes its seconds), then the next
turn; the episode ends with its last tool answer. A worker's engine batches every episode that is decoding
(continuous batching): a step decodes one token of each and costs ``EngineCurve.seconds(b)`` for ``b`` episodes
decoding, times the co-run slowdown while the trainer is training beside it. A weight load pauses the engine (tools
go on); tokens decoded after it carry the new version.

Between two events the number decoding is constant, so the engine's steps advance at a constant rate and each
episode's action ends at a known step count (a fluid approximation of whole steps: an action of ``n`` tokens alone
takes ``n`` steps, one joining mid-step starts at once). Each event costs a heap operation, whatever the slots.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

INF = math.inf
EPS = 1e-9


@dataclass(frozen=True)
class EngineCurve:
    """An engine step's seconds against the episodes decoding in it: measured points, interpolated linearly
    between them; past the last point, the least-squares line through all of them (weights: steps measured)."""

    points: tuple[tuple[float, float], ...]
    slope: float
    intercept: float

    @classmethod
    def of(cls, points: Sequence[Sequence[float]], counts: Sequence[float] | None = None) -> EngineCurve:
        pts = sorted((float(b), float(s)) for b, s in points)
        if not pts or any(b <= 0 or not math.isfinite(s) or s < 0 for b, s in pts):
            raise ValueError("engine curve: need points [episodes decoding > 0, seconds >= 0]")
        if len({b for b, _ in pts}) != len(pts):
            raise ValueError("engine curve: one point per number of episodes decoding")
        w = [float(c) for c in counts] if counts is not None else [1.0] * len(pts)
        if len(w) != len(pts):
            raise ValueError("engine curve: one count per point")
        if len(pts) == 1:
            return cls(tuple(pts), 0.0, pts[0][1])
        sw = sum(w)
        mb = sum(wi * b for wi, (b, _) in zip(w, pts)) / sw
        ms = sum(wi * s for wi, (_, s) in zip(w, pts)) / sw
        var = sum(wi * (b - mb) ** 2 for wi, (b, _) in zip(w, pts))
        slope = max(sum(wi * (b - mb) * (s - ms) for wi, (b, s) in zip(w, pts)) / var, 0.0) if var else 0.0
        return cls(tuple(pts), slope, ms - slope * mb)

    @classmethod
    def linear(cls, base: float, per_episode: float) -> EngineCurve:
        """A step of ``base + per_episode * b`` seconds (the numbers a user gives instead of a benchmark)."""
        if base < 0 or per_episode < 0:
            raise ValueError("engine curve: base and per-episode seconds must be >= 0")
        return cls(((1.0, base + per_episode),), per_episode, base)

    def seconds(self, b: int) -> float:
        if b <= 0:
            return 0.0
        pts = self.points
        if len(pts) == 1 and self.slope:
            return self.intercept + self.slope * b
        if b <= pts[0][0]:
            return pts[0][1]
        if b >= pts[-1][0]:
            last_b, last_s = pts[-1]
            return max(last_s, self.intercept + self.slope * b) if b > last_b else last_s
        lo, hi = 0, len(pts) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if pts[mid][0] <= b:
                lo = mid
            else:
                hi = mid
        (b0, s0), (b1, s1) = pts[lo], pts[hi]
        return s0 + (s1 - s0) * (b - b0) / (b1 - b0)


def parse_turns(episodes) -> list[list[tuple[int, float]]]:
    """Episodes as lists of ``(tokens, tool seconds)``. Accepted per episode: ``[[tokens, tool s, ...], ...]``,
    or ``{"turns": [...]}`` (:meth:`lrl.episode.Episode.turns`; a turn's third number, observation tokens, is
    not used)."""
    out = []
    for i, ep in enumerate(episodes):
        turns = ep["turns"] if isinstance(ep, dict) else ep
        parsed = []
        for turn in turns:
            tokens, tool = int(turn[0]), float(turn[1])
            if tokens < 0 or not math.isfinite(tool) or tool < 0:
                raise ValueError(
                    f"episode {i}: a turn needs tokens >= 0 and finite tool seconds >= 0: {turn}"
                )
            parsed.append((tokens, tool))
        if not parsed:
            raise ValueError(f"episode {i}: no turns")
        out.append(parsed)
    if not out:
        raise ValueError("turns: need at least one episode")
    return out


class LoadEngine:
    """One worker's engine and tools under the load model; the board's loop drives it (lrl_lab.sim.board)."""

    __slots__ = (
        "curve",
        "factor",
        "steps",
        "decoding",
        "dheap",
        "theap",
        "tools",
        "paused",
        "block_from",
        "pool",
        "_cost",
    )

    def __init__(self, curve: EngineCurve, tool_servers: int | None = None):
        self.curve = curve
        # tools served by a pool of that many servers, first come first served (a sandbox pool: a call waits for a
        # free server, then takes its seconds); None: every call runs at once, in parallel
        self.pool: list[float] | None = [0.0] * tool_servers if tool_servers else None
        self.factor = 1.0  # the co-run slowdown while the trainer trains, else 1
        self.steps = 0.0  # engine steps so far (fluid)
        self.decoding: dict[int, object] = {}
        self.dheap: list[tuple[float, int]] = []  # (step count at which the action is complete, episode)
        self.theap: list[tuple[float, int, object]] = []  # (time the tool answers, episode, episode)
        self.tools = 0  # episodes waiting for a tool
        self.paused = False
        self.block_from = 0.0  # when the worker's current wait for tool answers began (see asleep)
        self._cost = (-1, 0.0, 0.0)  # (episodes decoding, factor) -> seconds, of the last call

    def step_seconds(self) -> float:
        b, factor, sec = self._cost
        if b != len(self.decoding) or factor != self.factor:
            b, factor = len(self.decoding), self.factor
            sec = self.curve.seconds(b) * factor
            self._cost = (b, factor, sec)
        return sec

    def next_time(self, now: float) -> float:
        t = self.theap[0][0] if self.theap else INF
        if self.decoding and not self.paused:
            dt = (self.dheap[0][0] - self.steps) * self.step_seconds()
            t = min(t, now + max(dt, 0.0))
        return t

    def advance(self, now: float, t: float) -> None:
        if self.decoding and not self.paused and t > now:
            sec = self.step_seconds()
            self.steps = self.steps + (t - now) / sec if sec > 0 else INF

    def begin_turn(self, ep, now: float, version: int) -> bool:
        """`ep` starts its next turn (or ends: True)."""
        if ep.turn >= len(ep.turns):
            return True
        tokens, _ = ep.turns[ep.turn]
        ep.cur_version = version
        if tokens == 0:
            return self._to_tool(ep, now, version)
        ep.began = self.steps
        self.decoding[ep.index] = ep
        heapq.heappush(self.dheap, (self.steps + tokens, ep.index))
        return False

    def _to_tool(self, ep, now: float, version: int) -> bool:  # noqa: ARG002 (one signature for both phases)
        tool = ep.turns[ep.turn][1]
        self.tools += 1
        if self.pool is not None:  # the earliest free server takes it (calls arrive in time order: FIFO)
            start = max(now, heapq.heappop(self.pool))
            heapq.heappush(self.pool, start + tool)
            heapq.heappush(self.theap, (start + tool, ep.index, ep))
            return False
        heapq.heappush(self.theap, (now + tool, ep.index, ep))
        return False

    def pop(self, now: float, version: int) -> list:
        """Actions and tools complete at `now` move on; -> the episodes that ended."""
        done = []
        while True:
            if self.dheap and self.dheap[0][0] <= self.steps + EPS * max(1.0, self.steps) and not self.paused:
                target, index = heapq.heappop(self.dheap)
                ep = self.decoding.pop(index)
                ep.tokens.append((ep.cur_version, target - ep.began))  # since its start or the last switch
                self._to_tool(ep, now, version)
                if not self.decoding:
                    self.block_from = now  # nothing left to decode: the worker waits for answers from now
            elif self.theap and self.theap[0][0] <= now:
                _, _, ep = heapq.heappop(self.theap)
                self.tools -= 1
                self.block_from = now  # an answer ends the wait; the next one starts afresh
                ep.turn += 1
                if self.begin_turn(ep, now, version):
                    ep.end = now
                    done.append(ep)
            else:
                return done

    def switch(self, now: float, version: int) -> None:
        """New weights: tokens decoded so far belong to the old version, the rest of each action to `version`."""
        for ep in self.decoding.values():
            done = self.steps - ep.began
            if done > 0:
                ep.tokens.append((ep.cur_version, done))
            ep.began = self.steps
            ep.cur_version = version
            ep.switches.append((now, version))

    def abort(self, indices: set, now: float) -> float:
        """Stop the episodes `indices` (decoding or waiting for a tool) -> the tokens of the actions they were
        decoding (those of their finished actions are in their ``tokens``)."""
        cut = 0.0
        was_decoding = bool(self.decoding)
        for index in indices:
            ep = self.decoding.pop(index, None)
            if ep is not None:
                cut += self.steps - ep.began
        before = len(self.theap)
        self.theap = [e for e in self.theap if e[1] not in indices]
        self.tools -= before - len(self.theap)
        self.dheap = [e for e in self.dheap if e[1] not in indices]
        heapq.heapify(self.theap)
        heapq.heapify(self.dheap)
        if was_decoding and not self.decoding:
            self.block_from = now  # nothing left to decode: the worker waits for answers from now
        return cut

    # A worker whose episodes all wait on tools blocks on their answers, a slice at a time (lrl.envs.workers
    # WAIT_SLICE); it sees new work and new weights only when an answer comes or a slice ends.
    def blocked(self) -> bool:
        return not self.decoding and self.tools > 0

    def asleep(self, now: float, wait_slice: float) -> bool:
        if not wait_slice or not self.blocked():
            return False
        elapsed = now - self.block_from
        k = round(elapsed / wait_slice)
        return abs(elapsed - k * wait_slice) > 1e-9 * max(1.0, now)

    def wake(self, now: float, wait_slice: float) -> float:
        """When a worker asleep at `now` next looks at its messages: the next answer or the end of a slice."""
        elapsed = now - self.block_from
        boundary = self.block_from + wait_slice * math.ceil(elapsed / wait_slice - 1e-12)
        return min(boundary, self.theap[0][0]) if self.theap else boundary

    def wake_after(self, now: float, wait_slice: float) -> float:
        """When a worker blocked at `now` first looks at a message that reaches it just after `now`."""
        elapsed = now - self.block_from
        boundary = self.block_from + wait_slice * (math.floor(elapsed / wait_slice + 1e-12) + 1)
        return min(boundary, self.theap[0][0]) if self.theap else boundary

    def counts(self) -> tuple[int, int]:
        return len(self.decoding), self.tools
