"""The asynchronous rollout pipeline: workers beside the trainer (``--pipeline async``), see docs/pipeline.md.

- :mod:`lrl.pipeline.board`: the weights the trainer publishes, in shared memory, with their version;
- :mod:`lrl.pipeline.worker`: a rollout worker process;
- :mod:`lrl.pipeline.controller`: the controller in the trainer's process (throttle, bound, ledger, resume).
"""

from __future__ import annotations

from lrl.pipeline.board import WeightBoard
from lrl.pipeline.controller import AsyncRollouts, WorkerError


class Publisher:
    """The trainer's side of the weight sync in async mode: each new version goes onto the board."""

    name = "async"

    def __init__(self, board: WeightBoard):
        self.board = board
        self.version = 0

    def setup(self, policy, version: int = 0) -> None:
        self.sync(policy, version)

    def sync(self, policy, version: int) -> None:
        self.board.publish(policy, version)
        self.version = version

    @property
    def behavior_version(self) -> int:
        return self.version

    @property
    def kept_versions(self) -> list[int]:
        return [self.version]

    def state_dict(self) -> dict:
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]


__all__ = ["AsyncRollouts", "Publisher", "WeightBoard", "WorkerError"]
