"""Finished episodes waiting for the trainer, oldest first: (version that started it, duration s) each.

Episodes arrive one at a time or as arrays; the trainer takes the oldest `batch_size` as arrays.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Finished:
    """A FIFO of (version, duration) held as numpy chunks, with single arrivals gathered in lists."""

    def __init__(self):
        self.chunks: deque[tuple[np.ndarray, np.ndarray]] = deque()  # (versions [c], durations [c])
        self.head = 0  # of the first chunk, the entries already taken
        self.versions: list[int] = []  # single arrivals not yet in a chunk
        self.durations: list[float] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def append(self, version: int, duration: float) -> None:
        self.versions.append(version)
        self.durations.append(duration)
        self.size += 1

    def extend(self, versions: np.ndarray, durations: np.ndarray) -> None:
        self._flush()
        self.chunks.append((versions, durations))
        self.size += len(versions)

    def _flush(self) -> None:
        if self.versions:
            self.chunks.append((np.array(self.versions, dtype=np.int64), np.array(self.durations)))
            self.versions = []
            self.durations = []

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove the oldest n (n <= len) -> versions [n], durations [n], oldest first."""
        self._flush()
        vs, ds = [], []
        need = n
        while need:
            v, d = self.chunks[0]
            got = min(need, len(v) - self.head)
            vs.append(v[self.head : self.head + got])
            ds.append(d[self.head : self.head + got])
            self.head += got
            need -= got
            if self.head == len(v):
                self.chunks.popleft()
                self.head = 0
        self.size -= n
        return np.concatenate(vs), np.concatenate(ds)

    def drop_older(self, oldest_ok: int) -> int:
        """Drop the episodes started by a version < oldest_ok, keeping the order of the rest -> how many."""
        self._flush()
        v, d = self.take(self.size) if self.size else (np.empty(0, dtype=np.int64), np.empty(0))
        keep = v >= oldest_ok
        self.chunks.clear()
        self.head = 0
        self.size = 0
        if keep.any():
            self.extend(v[keep], d[keep])
        return int(len(v) - keep.sum())
