"""The pieces of the windowed load model (:class:`lrl_lab.sim.windowed.WindowedModel`), each on numpy arrays: the
workload's turns, the episodes in flight as rows (:class:`Rows`), the groups issued as places on a ring
(:class:`Ring`), a worker (:class:`Worker`) and its pending events in sorted chunks (:class:`Chunks`)."""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

INF = math.inf
EMPTY_F = np.zeros(0)
EMPTY_I = np.zeros(0, dtype=np.int64)


class Chunks:
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
            return EMPTY_F, EMPTY_I
        if len(keys) == 1:
            return keys[0], rows[0]
        return np.concatenate(keys), np.concatenate(rows)


class Worker:
    __slots__ = ("version", "paused_until", "steps", "sec", "t0", "dec", "tool", "ndec", "ntool", "held",
                 "queue", "free")  # fmt: skip

    def __init__(self, slots: int):
        self.version = 0
        self.paused_until = -INF
        self.steps = 0.0  # engine steps so far (fluid)
        self.sec = 0.0  # seconds of an engine step in the window going on (0: not decoding, or paused)
        self.t0 = 0.0  # the window's start
        self.dec = Chunks()  # decoding rows, by the step count at which their action is complete
        self.tool = Chunks()  # rows waiting for a tool, by the time it answers
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

    def wait_tool(self, r: np.ndarray, answers: np.ndarray) -> None:
        """Rows `r` wait for their tools, which answer at `answers`."""
        self.tool.push(answers, r)
        self.ntool += r.size

    def match(self, opens: float, limit: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Match queued episodes to free slots, each starting at the latest of its slot's time, its issue's and
        `opens`, up to `limit` -> (start times, group ids), the slots and the queue's places taken; or None."""
        if opens > limit or not self.queue or not self.free.size:
            return None
        starts, groups = [], []
        k = 0
        while self.queue and k < self.free.size:
            issued_at, gids, pos = self.queue[0]
            n = min(gids.size - pos, self.free.size - k)
            at = np.maximum(np.maximum(self.free[k : k + n], issued_at), opens)
            within = at <= limit
            m = int(within.sum()) if not within.all() else n
            if m == 0:
                break
            starts.append(at[:m])
            groups.append(gids[pos : pos + m])
            k += m
            if pos + m == gids.size:
                self.queue.popleft()
            else:
                self.queue[0][2] = pos + m
            if m < n:
                break
        if not k:
            return None
        self.free = self.free[k:]
        return np.concatenate(starts), np.concatenate(groups)

    def decoding_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows decoding here and the step count at which each one's action is complete."""
        if not self.dec.heap:
            return EMPTY_I, EMPTY_F
        return np.concatenate([c[3] for c in self.dec.heap]), np.concatenate([c[2] for c in self.dec.heap])


class Workload:
    """The episodes' turns as flat arrays (an episode: its turns, in a row of the flat ones)."""

    def __init__(self, episodes: list):
        self.n_turns = np.array([len(ep) for ep in episodes], dtype=np.int64)
        self.first_turn = np.concatenate([[0], np.cumsum(self.n_turns)[:-1]])
        self.turn_tokens = np.array([tok for ep in episodes for tok, _ in ep], dtype=np.float64)
        self.turn_tool = np.array([tool for ep in episodes for _, tool in ep], dtype=np.float64)
        self.n_pool = len(episodes)
        self.is_last = np.zeros(
            self.turn_tokens.size, dtype=bool
        )  # of each turn of the workload: its episode's last?
        self.is_last[self.first_turn + self.n_turns - 1] = True


class Rows:
    """One row per episode started and not yet taken by the trainer (a free list recycles them), its columns as
    arrays; ``tok``: its tokens per version, from the version it started on (``span`` columns, grown when
    needed)."""

    COLUMNS = {
        "group": np.int64,
        "start_v": np.int64,
        "cur_v": np.int64,
        "turn": np.int64,  # the turn it is at, as a place in the workload's flat turns
        # tokens of its current version not yet in `tok`: an action's whole count from its start (what a switch
        # finds undecoded moves to the new version)
        "cur_tok": np.float64,
        "start": np.float64,
        "dur": np.float64,  # from its start to its end
    }

    def __init__(self, rows: int):
        self.rows = rows
        for name, dtype in self.COLUMNS.items():
            setattr(self, name, np.zeros(rows, dtype=dtype))
        self.span = 2
        self.tok = np.zeros((rows, self.span))
        self.free_rows = np.arange(rows - 1, -1, -1, dtype=np.int64)
        self.free_top = rows  # free_rows[:free_top] are free (a stack)

    def take(self, k: int) -> np.ndarray:
        """`k` free rows (more episodes alive than planned: every array grows)."""
        if k > self.free_top:
            grow = max(k - self.free_top, self.rows)
            for name in self.COLUMNS:
                arr = getattr(self, name)
                setattr(self, name, np.concatenate([arr, np.zeros(grow, dtype=arr.dtype)]))
            self.tok = np.concatenate([self.tok, np.zeros((grow, self.tok.shape[1]))])
            self.free_rows = np.concatenate(
                [np.arange(self.rows + grow - 1, self.rows - 1, -1), self.free_rows[: self.free_top]]
            )
            self.free_top += grow
            self.rows += grow
        out = self.free_rows[self.free_top - k : self.free_top].copy()
        self.free_top -= k
        return out

    def give(self, r: np.ndarray) -> None:
        """Rows `r` are free again."""
        if self.free_top + r.size > self.free_rows.size:
            self.free_rows = np.concatenate([self.free_rows, np.zeros(r.size, dtype=np.int64)])
        self.free_rows[self.free_top : self.free_top + r.size] = r
        self.free_top += r.size

    def grow_span(self, columns: int) -> None:
        self.tok = np.concatenate([self.tok, np.zeros((self.tok.shape[0], columns - self.span))], axis=1)
        self.span = columns

    def flush(self, r: np.ndarray) -> None:
        """Rows `r` (distinct) put the tokens of their current version in its column of ``tok``."""
        amount = self.cur_tok[r]
        on = amount > 0
        r, amount = r[on], amount[on]
        self.cur_tok[r] = 0.0
        col = self.cur_v[r] - self.start_v[r]
        if col.size and col.max() >= self.span:
            self.grow_span(int(col.max()) + 1)
        self.tok[r, col] += amount  # the rows of one call are distinct


class Ring:
    """The groups issued and not taken, each at place ``group % size``: its episodes not finished (-1: the place
    is free), those started, their rows, and its worker."""

    def __init__(self, size: int, group_size: int):
        self.size = size
        self.left = np.full(size, -1, dtype=np.int64)
        self.started = np.zeros(size, dtype=np.int64)
        self.rows = np.zeros((size, group_size), dtype=np.int64)
        self.worker = np.zeros(size, dtype=np.int64)

    def open(self, places: np.ndarray, group_size: int, worker: int, per_batch: int) -> None:
        """Groups issued to `worker` take their `places` (each group's ``group % size``)."""
        if (self.left[places] != -1).any():
            raise RuntimeError(
                f"the windowed load model keeps groups of the last {self.size // per_batch} batches: a group "
                "issued that long ago is still in flight; use the event model (simulate_board)"
            )
        self.left[places] = group_size
        self.started[places] = 0
        self.worker[places] = worker

    def seat(self, places: np.ndarray, r: np.ndarray) -> None:
        """Episodes started as rows `r`, each of the group at its place in `places` (a group's episodes come one
        after another): each takes the next seat of its group."""
        k = places.size
        newrun = np.r_[True, places[1:] != places[:-1]]
        j = np.arange(k) - np.maximum.accumulate(np.where(newrun, np.arange(k), 0))  # started before it, here
        j += self.started[places]
        np.add.at(self.started, places, 1)
        self.rows[places, j] = r

    def close(self, places: np.ndarray) -> np.ndarray:
        """The groups at `places` are taken -> their rows (group by group); their places are free."""
        r = self.rows[places].ravel()
        self.left[places] = -1
        return r


def add_counts(acc: np.ndarray, more: np.ndarray) -> np.ndarray:
    if more.size > acc.size:
        acc = np.concatenate([acc, np.zeros(more.size - acc.size, dtype=acc.dtype)])
    acc[: more.size] += more.astype(acc.dtype)
    return acc
