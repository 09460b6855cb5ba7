"""The episodes in flight, keyed by their current end time (docs/simulate.md, "How it stays fast and exact").

Two stores hold them: a binary heap of the episodes started one or a few at a time (Python entries), and one
sorted array of the episodes started many at once (numpy: end times and slots, the rest of each episode in a
table indexed by slot, since a slot runs one episode at a time). A sync pushes every end back by adding the
sync time to it in place: one float addition per sync, as the rule says, and since adding the same number
never reorders two floats, the heap stays a heap and the array stays sorted. Ends that are equal are taken
in start order (`order`), whichever store they sit in.
"""

from __future__ import annotations

import heapq
import math

import numpy as np


class Ended:
    """Episodes taken out of flight, by end time then start order: end, order, slot, start, version, d [k]."""

    def __init__(self, end, order, slot, start, version, d):
        self.end = end
        self.order = order
        self.slot = slot
        self.start = start
        self.version = version
        self.d = d

    def __len__(self) -> int:
        return len(self.end)


class InFlight:
    """Running episodes: heap entries [end, order, slot, start, version, d, fails], and the array store."""

    def __init__(self, n_slots: int):
        self.heap: list[list] = []
        self.end = np.empty(0)  # [m] sorted end times of the array store
        self.slot = np.empty(0, dtype=np.int64)  # [m] their slots
        self.order = np.zeros(n_slots, dtype=np.int64)  # [n_slots] of the episode a slot runs: start order,
        self.start = np.zeros(n_slots)  # start s,
        self.version = np.zeros(n_slots, dtype=np.int64)  # version,
        self.d = np.zeros(n_slots)  # duration s (array store only; heap entries carry theirs)
        self.count = 0

    def front(self) -> float:
        """The earliest end in flight (inf if none)."""
        t = float(self.end[0]) if len(self.end) else math.inf
        if self.heap and self.heap[0][0] < t:
            return self.heap[0][0]
        return t

    def push(self, entry: list) -> None:
        """One episode: [end, order, slot, start, version, d, fails]."""
        heapq.heappush(self.heap, entry)
        self.count += 1

    def add(self, end, order, slot, start, version, d) -> None:
        """Episodes started together, none of which fails: end, order, slot, start, d [n]; version scalar."""
        self.order[slot] = order
        self.start[slot] = start
        self.version[slot] = version
        self.d[slot] = d
        perm = np.argsort(end, kind="stable")
        end = end[perm]
        at = np.searchsorted(self.end, end, side="right")
        # merge (np.insert's result, without its general-case overhead): the new ones land at at + 0, 1, ...
        m, n = len(self.end), len(end)
        pos = at + np.arange(n)
        old = np.ones(m + n, dtype=bool)
        old[pos] = False
        merged_end = np.empty(m + n)
        merged_end[pos] = end
        merged_end[old] = self.end
        merged_slot = np.empty(m + n, dtype=np.int64)
        merged_slot[pos] = slot[perm]
        merged_slot[old] = self.slot
        self.end, self.slot = merged_end, merged_slot
        self.count += n

    def pop_at(self, t: float) -> list[list]:
        """Remove the episodes ending at t -> their entries, in start order."""
        heap = self.heap
        out = []
        while heap and heap[0][0] == t:
            out.append(heapq.heappop(heap))
        if len(self.end) and self.end[0] == t:
            k = int(np.searchsorted(self.end, t, side="right"))
            s = self.slot[:k]
            cols = (self.order[s].tolist(), s.tolist(), self.start[s].tolist(), self.version[s].tolist())
            for o, slot, start, v, d in zip(*cols, self.d[s].tolist()):
                out.append([t, o, slot, start, v, d, False])
            self.end = self.end[k:]
            self.slot = self.slot[k:]
            out.sort(key=lambda entry: entry[1])
        self.count -= len(out)
        return out

    def pop_before(self, x: float, limit: int) -> Ended:
        """Remove the episodes ending before x, at most `limit` of them and never only some of those ending at
        one time -> them, by end time then start order."""
        heap = self.heap
        got = []
        while heap and heap[0][0] < x:
            got.append(heapq.heappop(heap))
        k = int(np.searchsorted(self.end, x))
        if len(got) + k > limit:
            ends = np.sort(np.concatenate(([e[0] for e in got], self.end[:k])))
            n = limit
            while n and ends[n] == ends[n - 1]:
                n -= 1
            cut = ends[n]  # take the ends before this one
            k = int(np.searchsorted(self.end[:k], cut))
            keep = [e for e in got if e[0] < cut]
            for e in got[len(keep) :]:
                heapq.heappush(heap, e)
            got = keep
        slot = self.slot[:k]
        end = self.end[:k]
        order = self.order[slot]
        start = self.start[slot]
        version = self.version[slot]
        d = self.d[slot]
        self.end = self.end[k:]
        self.slot = self.slot[k:]
        if got:
            cols = list(zip(*got))
            end = np.concatenate((end, cols[0]))
            order = np.concatenate((order, np.array(cols[1], dtype=np.int64)))
            slot = np.concatenate((slot, np.array(cols[2], dtype=np.int64)))
            start = np.concatenate((start, cols[3]))
            version = np.concatenate((version, np.array(cols[4], dtype=np.int64)))
            d = np.concatenate((d, cols[5]))
        if len(end) > 1 and (got or (end[1:] == end[:-1]).any()):
            perm = np.lexsort((order, end))
            end, order, slot, start, version, d = (a[perm] for a in (end, order, slot, start, version, d))
        self.count -= len(end)
        return Ended(end, order, slot, start, version, d)

    def pause(self, sync_time: float) -> None:
        """A sync: every episode in flight ends sync_time later."""
        for entry in self.heap:
            entry[0] += sync_time
        self.end = self.end + sync_time

    def listing(self) -> list[tuple[int, float, int]]:
        """(slot, start s, version) of every episode in flight."""
        out = [(e[2], e[3], e[4]) for e in self.heap]
        s = self.slot
        out += zip(s.tolist(), self.start[s].tolist(), self.version[s].tolist())
        return out
