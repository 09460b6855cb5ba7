"""The weight board: the trainer publishes each version of its weights into shared memory; workers read them.

``copies`` of the weights live in shared memory (allocated once); version v is written into copy
``v % copies``, next to a sequence counter: the trainer makes the counter odd, copies the weights in, then sets
it to ``2 * v``. A reader copies one out and keeps it only if its counter was the same even number before and
after the copy, so it never keeps a mix of two versions (a seqlock: the trainer never waits for a reader).
Free-running workers only want the newest version (one copy); a deterministic run keeps the last
``max_staleness + 2`` versions, because its schedule can ask for a version the trainer has already passed.
"""

from __future__ import annotations

import time

import torch


class WeightBoard:
    """Shared-memory copies of a model's weights and the versions they hold.

    Everything lives in torch shared-memory tensors (the weights and one int64 counter per copy), so the board
    travels to a worker in a queue message, after the worker has started, not in its process arguments.
    """

    def __init__(self, model: torch.nn.Module, version: int = 0, copies: int = 1):
        state = model.state_dict()
        self.names = list(state)
        self.copies = [
            [t.detach().to("cpu", copy=True).share_memory_() for t in state.values()] for _ in range(copies)
        ]
        self.counters = torch.full((copies,), -2, dtype=torch.int64).share_memory_()  # -2: empty
        self.counters[version % copies] = 2 * version
        self.publish_seconds = 0.0

    @property
    def version(self) -> int:
        """The newest fully published version; -1 while the only copy is being written."""
        counts = self.counters.tolist()
        return max((c // 2 for c in counts if c % 2 == 0 and c >= 0), default=-1)

    def publish(self, model: torch.nn.Module, version: int) -> float:
        """Copy the model's weights in as `version` -> seconds it took."""
        return self.publish_state(model.state_dict(), version)

    def publish_state(self, state: dict[str, torch.Tensor], version: int) -> float:
        """Copy a state dict in as `version` -> seconds it took."""
        start = time.perf_counter()
        index = version % len(self.copies)
        self.counters[index] = 2 * version - 1  # odd: being written
        with torch.no_grad():
            for shared, value in zip(self.copies[index], state.values()):
                shared.copy_(value.detach())
        self.counters[index] = 2 * version
        self.publish_seconds = time.perf_counter() - start
        return self.publish_seconds

    def kept(self) -> dict[int, dict[str, torch.Tensor]]:
        """Every complete version on the board -> a copy of its weights (a deterministic run's checkpoint)."""
        out = {}
        for index, count in enumerate(self.counters.tolist()):
            if count >= 0 and count % 2 == 0:
                out[count // 2] = {n: t.clone() for n, t in zip(self.names, self.copies[index])}
        return dict(sorted(out.items()))

    def read(self, model: torch.nn.Module, version: int) -> bool:
        """Load exactly `version` into `model` if a copy holds it, complete -> whether it did."""
        index = version % len(self.copies)
        before = int(self.counters[index])
        if before != 2 * version:
            return False
        state = {name: t.clone() for name, t in zip(self.names, self.copies[index])}
        if int(self.counters[index]) != before:
            return False
        model.load_state_dict(state, strict=True)
        return True

    def read_newest(self, model: torch.nn.Module, known: int) -> int | None:
        """Load the newest complete version when it is newer than `known` -> it, or None (nothing newer yet, or
        a write in progress: try again at the next boundary)."""
        newest = self.version
        if newest <= known:
            return None
        return newest if self.read(model, newest) else None

    def wait_for(self, model: torch.nn.Module, version: int, alive=lambda: True, poll: float = 0.002) -> None:
        """Block until exactly `version` can be loaded, and load it; `alive()` is called while waiting (a
        heartbeat) and returns False when waiting should stop."""
        while not self.read(model, version):
            if self.version > version + len(self.copies) - 1:
                raise RuntimeError(f"version {version} is gone from the board (newest {self.version})")
            if not alive():
                raise RuntimeError("the trainer went away while a worker waited for weights")
            time.sleep(poll)
