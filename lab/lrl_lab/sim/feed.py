"""The episode durations of a simulation, handed out in start order and converted from the tensor a chunk at a time.

Each item is (seconds the slot is busy, the episode's duration, truncated by the timeout?, failed?). One
episode at a time (`next`, as Python values) or many at once (`take`, as numpy arrays); both read the same
cursor, so mixing them hands out every duration once, in order.
"""

from __future__ import annotations

import numpy as np
import torch

from lrl_lab.sim.durations import failure_draws

ITEMS_AHEAD = 4096  # durations made Python values at a time for `next`


class Feed:
    """The durations [N], truncated by `timeout` and hit by failures at 1/`mtbf` per second when those are set."""

    def __init__(self, durations, chunk: int, bound: int, timeout, mtbf, generator):
        self.src = durations.detach().cpu()  # [N]
        self.chunk = max(int(chunk), 1)
        # most episodes these settings can start (0: no bound known), for the error message
        self.bound = bound
        self.timeout = timeout
        self.mtbf = mtbf
        self.gen = generator
        self.pos = 0  # durations converted so far
        self.busy = np.empty(0)  # [c] the converted chunk, from the start of the last conversion
        self.dur = np.empty(0)
        self.cut = np.empty(0, dtype=bool)
        self.fails = np.empty(0, dtype=bool)
        self.i = 0  # cursor into the chunk
        self.items: list | None = None  # up to ITEMS_AHEAD durations from items_at on, as Python tuples
        self.items_at = 0

    def left(self) -> int:
        """Durations not handed out yet."""
        return len(self.busy) - self.i + len(self.src) - self.pos

    def _too_few(self, started: int) -> ValueError:
        most = f"; these settings start at most {self.bound:,} episodes" if self.bound else ""
        return ValueError(
            f"durations: the run needs more than the {len(self.src):,} given ({started:,} started so far{most})"
        )

    def _convert(self) -> None:
        """Convert the next chunk of the tensor and append it to what is left of the current one."""
        raw = self.src[self.pos : self.pos + self.chunk]  # [c]
        self.pos += len(raw)
        d = raw if self.timeout is None else raw.clamp(max=self.timeout)
        cut = np.zeros(len(raw), dtype=bool) if self.timeout is None else (raw > self.timeout).numpy()
        dur = d.double().numpy()
        if self.mtbf is None:
            busy = dur
            fails = np.zeros(len(raw), dtype=bool)
        else:
            hit, stop_s = failure_draws(d, self.mtbf, self.gen)
            busy = torch.where(hit, stop_s, d.double()).numpy()
            fails = hit.numpy()
        i = self.i
        self.busy = np.concatenate((self.busy[i:], busy))
        self.dur = np.concatenate((self.dur[i:], dur))
        self.cut = np.concatenate((self.cut[i:], cut))
        self.fails = np.concatenate((self.fails[i:], fails))
        self.i = 0
        self.items = None

    def _ensure(self, k: int, started: int) -> None:
        """Make k durations ready past the cursor; too few left is the run's error."""
        while len(self.busy) - self.i < k:
            if self.pos >= len(self.src):
                raise self._too_few(started + len(self.busy) - self.i)
            self._convert()

    def next(self, started: int) -> tuple[float, float, bool, bool]:
        """The next episode's (busy s, duration s, truncated, fails); `started` is for the error message."""
        if self.i == len(self.busy):
            self._ensure(1, started)
        at = self.i - self.items_at
        if self.items is None or at >= len(self.items):
            i = self.i
            j = i + ITEMS_AHEAD
            cols = (self.busy[i:j], self.dur[i:j], self.cut[i:j], self.fails[i:j])
            self.items = list(zip(*(c.tolist() for c in cols)))
            self.items_at = i
            at = 0
        item = self.items[at]
        self.i += 1
        return item

    def min_busy(self, k: int, started: int) -> float:
        """The shortest busy time among the next k episodes (k >= 1), without handing them out."""
        self._ensure(k, started)
        return float(self.busy[self.i : self.i + k].min())

    def take(self, k: int, started: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The next k episodes as arrays: busy s [k], duration s [k], truncated [k], fails [k]."""
        self._ensure(k, started)
        i = self.i
        self.i += k
        return self.busy[i : i + k], self.dur[i : i + k], self.cut[i : i + k], self.fails[i : i + k]
