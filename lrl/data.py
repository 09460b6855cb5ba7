"""The DataModule: one collated batch per training step from a rollout source, and the held-out evaluation cue.

Where a batch comes from is the rollout source's business (``lrl.sources``: sampled inside the step, or taken
from asynchronous rollout workers); this module only forwards the source's lifecycle: bind it to this rank at
setup, close it at teardown or on an exception, and carry its state in checkpoints.

Lightning's data fetcher reads one item ahead, so the dataloader does not yield batches: it yields one
:class:`Deferred` per step, and the module asks for the batch (``Deferred.get()``) inside ``training_step``,
after the previous update and its weight sync. The source's own counter, saved in checkpoints, says which
batch comes next.

Under data parallelism every rank has its own source over its share of the tasks, with its own seed streams
(rank 0 keeps the single-process seeds). ``state_dict`` holds every rank's state, so a checkpoint written by
rank 0 resumes all of them exactly.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from lrl.batch import Batch
from lrl.sources import RolloutSource


class Deferred:
    """A training batch not sampled yet; ``get(version)`` asks the source for it now."""

    def __init__(self, source: RolloutSource):
        self.source = source

    def get(self, version: int = 0) -> Batch:
        return self.source.next_batch(version)


class _StepCues(Dataset):
    """One Deferred batch per training step (map-style: Lightning knows the length; reading ahead is free)."""

    def __init__(self, source: RolloutSource, n_steps: int):
        self.source = source
        self.n_steps = n_steps

    def __len__(self) -> int:
        return self.n_steps

    def __getitem__(self, i: int) -> Deferred:
        return Deferred(self.source)


class _StepLoader(DataLoader):
    """The training dataloader. It yields stateless cues, so resuming it is only a matter of position: the
    source's full state (generators, carried tasks, every rank's) comes back with the datamodule's state."""

    def __init__(self, source: RolloutSource, n_steps: int):
        super().__init__(_StepCues(source, n_steps), batch_size=None, num_workers=0)
        self.source = source

    def state_dict(self) -> dict:
        return {"produced": self.source.produced}

    def load_state_dict(self, state: dict) -> None:
        if state["produced"] != self.source.produced:
            raise ValueError(
                f"the checkpoint's dataloader is at batch {state['produced']} but its source at "
                f"{self.source.produced}: the checkpoint is inconsistent"
            )


class _EvalTick(torch.utils.data.Dataset):
    """One item: the validation loop's cue to run a held-out evaluation."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return i


class RolloutDataModule(L.LightningDataModule):
    """Train batches come from the rollout source; validation is a held-out evaluation run by the module."""

    def __init__(self, source: RolloutSource, max_steps: int):
        super().__init__()
        self.source = source
        self.max_steps = max_steps
        self.rank = 0
        self.world_size = 1

    def setup(self, stage: str) -> None:
        """Under data parallelism: bind the source to this rank (its share of the tasks, its seeds), once."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.world_size == 1 or self.world_size > 1:
            return
        self.rank = trainer.global_rank
        self.world_size = trainer.world_size
        self.source.bind(self.rank, self.world_size)

    def teardown(self, stage: str) -> None:
        self.source.close()

    def on_exception(self, exception: BaseException) -> None:
        self.source.close()

    def train_dataloader(self):
        return _StepLoader(self.source, self.max_steps)

    def val_dataloader(self):
        return DataLoader(_EvalTick(), batch_size=None)

    def state_dict(self):
        """Every rank's source state (gathered when distributed: Lightning saves rank 0's copy of this)."""
        own = self.source.state_dict()
        if self.world_size == 1 or not dist.is_initialized():
            return {"ranks": [own]}
        ranks: list = [None] * self.world_size
        dist.all_gather_object(ranks, own)
        return {"ranks": ranks}

    def load_state_dict(self, state):
        ranks = state["ranks"]
        if len(ranks) != self.world_size:
            raise ValueError(
                f"the checkpoint holds the streams of {len(ranks)} process(es); this run has "
                f"{self.world_size}: resume with the same --devices and --num-nodes"
            )
        self.source.load_state_dict(ranks[self.rank])
