"""The seam between the trainer and where its batches come from, and what every rollout source shares.

A rollout source gives the trainer one scored batch per step and takes the trainer's new weights after every
update. The trainer (``lrl.module``) calls only the weight side (:meth:`RolloutSource.setup`,
:meth:`~RolloutSource.publish`, the weights' checkpoint state); the DataModule (``lrl.data``) forwards the rest of
the lifecycle (bind to a rank, next batch, close, the stream's checkpoint state). Two sources: the synchronous
one samples inside the step (:mod:`lrl.sources.sync`); the asynchronous one takes batches from rollout workers
(:mod:`lrl.pipeline`). A new way of producing episodes (another engine, another runtime) is one new source.

Shared by both: :class:`TaskPicker` (which tasks a batch trains on, failed tasks first) and :func:`score_batch`
(finished episodes to a batch: collate, reward shaping, group advantages, turns).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lrl.batch import Batch, collate
from lrl.losses import group_advantages

if TYPE_CHECKING:
    from lrl.samplers.base import Traits


class RolloutSource(Protocol):
    """What the trainer and the DataModule need of a source of batches (see the module docstring)."""

    def bind(self, rank: int, world_size: int) -> None:
        """Serve rank `rank` of `world_size`: its share of every batch, its own seed streams."""

    def setup(self, policy: torch.nn.Module, version: int) -> None:
        """Attach to the trainer's policy at `version`, before the first batch (start workers, if any)."""

    def next_batch(self, version: int) -> Batch:
        """The batch the trainer at `version` trains on next."""

    def publish(self, policy: torch.nn.Module, version: int) -> None:
        """The weight sync: the trainer's weights after an update, as `version`."""

    def close(self) -> None:
        """Stop whatever the source started; safe to call more than once."""

    def sampler_traits(self) -> Traits:
        """What the behavior sampler of its batches does to the trainer's weights and keeps (its ``traits``, see
        ``lrl.samplers.Traits``), for the mismatch split."""

    def state_dict(self) -> dict:
        """This rank's stream state: everything needed to continue exactly (plain data and tensors)."""

    def load_state_dict(self, state: dict) -> None: ...

    def weights_state(self) -> dict:
        """The weight side's state (kept versions of a lagged sampler), saved once with the trainer."""

    def load_weights_state(self, state: dict) -> None:
        """Restore :meth:`weights_state` (called before :meth:`setup`, which applies it)."""


def rank_seed(seed: int, rank: int) -> int:
    """The seed of a rank's stream: `seed` itself on rank 0 (single-process runs are unchanged), else a hash."""
    if rank == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"lrl:{seed}:{rank}".encode()).digest()[:7], "little")


class TaskPicker:
    """The tasks of each batch: `per_step` distinct train tasks, failed tasks first, drawn without replacement.

    Tasks whose episodes failed in the environment (``carry``) are drawn first into the next batch, so failures
    do not thin out the tasks that fail most; a permutation is drawn every batch all the same, so the stream's
    randomness does not depend on when failures happen.
    """

    def __init__(self, tasks: Sequence[Any], per_step: int, generator: torch.Generator):
        self.tasks = list(tasks)
        self.per_step = per_step
        self.generator = generator
        self.carry: list[int] = []  # positions in `tasks` of failed tasks, drawn first into the next batch
        self.position = {t.task_id: i for i, t in enumerate(self.tasks)}

    def choose(self, generator: torch.Generator | None = None) -> list[int]:
        """The next batch's tasks -> their positions in ``tasks`` (the permutation drawn from `generator`, else
        the picker's own stream)."""
        perm = torch.randperm(len(self.tasks), generator=generator or self.generator).tolist()
        carried = self.carry[: self.per_step]
        self.carry = self.carry[self.per_step :]
        return carried + [i for i in perm if i not in carried][: self.per_step - len(carried)]

    def carry_failures(self, episodes) -> None:
        """Remember the tasks of the episodes whose environment failed, for the next batch."""
        failed = [self.position[e.task.task_id] for e in episodes if e.env_failure]
        self.carry += [i for i in dict.fromkeys(failed) if i not in self.carry]

    def task(self, position: int):
        return self.tasks[position]

    def by_id(self, task_id: int):
        return self.tasks[self.position[task_id]]

    def state_dict(self) -> dict:
        return {"carry": list(self.carry)}

    def load_state_dict(self, state: dict) -> None:
        self.carry = list(state["carry"])


def score_batch(episodes, spec, cfg) -> Batch:
    """Finished episodes -> the scored batch: collate, the shaped reward's group advantages, each one's turns.

    A malformed episode's advantage is computed from ``reward - invalid_penalty`` (its score is unchanged); an
    environment failure takes no part in its group's statistics (advantage 0, no gradient).
    """
    batch = collate(episodes, spec.tok.pad_id, spec.metrics)
    shaped = batch["reward"] - cfg.invalid_penalty * batch["invalid"]  # what the advantages are made of
    batch["advantage"] = group_advantages(
        shaped, batch["task_id"], 1.0 - batch["env_failure"], scale=cfg.advantage_norm == "std"
    )
    batch["env_turns"] = torch.tensor([float(len(e.actions)) for e in episodes])  # [B] steps of its env
    if spec.counters:  # the environment's own counts (sandbox runs, verdicts), summed per step as env/<m>
        batch["env_counts"] = {
            m: torch.tensor([float(e.metrics.get(m, 0.0)) for e in episodes]) for m in spec.counters
        }
        batch["tool_times"] = [t for e in episodes for t in e.tool_times]
    if cfg.tool_timeout is not None or cfg.tool_latency != "none" or spec.counters:  # why workers failed
        batch["env_timeout"] = torch.tensor([float(e.timed_out) for e in episodes])  # [B]
        batch["env_error"] = torch.tensor([float(bool(e.tool_error)) for e in episodes])  # [B]
    return batch
