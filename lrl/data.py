"""The controller: a DataModule that streams one collated batch per training step from a behavior sampler.

Rollouts run in the training process (no worker processes: a forked sampler would never see new weights)
and lazily: the module pulls the next batch inside ``training_step`` through Lightning's
``dataloader_iter``, so each batch is sampled after the previous update and its weight sync. The version
tags prove it: with the on-policy sampler every trained token has staleness 0.
"""

from __future__ import annotations

import time

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lrl.gym import Task, WordTokenizer
from lrl.losses import group_advantages
from lrl.rollout import collate


class RolloutStream(IterableDataset):
    """Yields `n_steps` batches; each is `tasks_per_step` train tasks x `episodes_per_task` episodes."""

    def __init__(self, sampler, tasks: list[Task], tok: WordTokenizer, cfg, generator: torch.Generator, n_steps: int):
        self.sampler, self.tasks, self.tok, self.cfg = sampler, tasks, tok, cfg
        self.generator, self.n_steps = generator, n_steps
        self.produced = 0

    def choose_tasks(self) -> list[Task]:
        """Draw the step's tasks without replacement, each repeated episodes_per_task times."""
        picks = torch.randperm(len(self.tasks), generator=self.generator)[: self.cfg.tasks_per_step].tolist()
        return [self.tasks[i] for i in picks for _ in range(self.cfg.episodes_per_task)]

    def next_batch(self) -> dict[str, torch.Tensor]:
        """Sample, collate and score one batch with the sampler's current behavior weights."""
        start = time.perf_counter()
        episodes = self.sampler.sample(self.choose_tasks(), self.generator)
        batch = collate(episodes, self.tok.pad_id)
        batch["advantage"] = group_advantages(batch["reward"], batch["task_id"])
        batch["sample_time"] = torch.tensor(time.perf_counter() - start)
        self.produced += 1
        return batch

    def __iter__(self):
        while self.produced < self.n_steps:
            yield self.next_batch()

    def __len__(self) -> int:
        return self.n_steps


class _EvalTick(torch.utils.data.Dataset):
    """One item: the validation loop's cue to run a held-out evaluation."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return i


class RolloutDataModule(L.LightningDataModule):
    """Train batches stream from the sampler; validation is a held-out evaluation run by the module."""

    def __init__(self, sampler, tasks: list[Task], tok: WordTokenizer, cfg):
        super().__init__()
        self.sampler, self.tasks, self.tok, self.cfg = sampler, tasks, tok, cfg
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.stream = RolloutStream(sampler, tasks, tok, cfg, self.generator, cfg.max_steps)

    def train_dataloader(self):
        return DataLoader(self.stream, batch_size=None, num_workers=0)

    def val_dataloader(self):
        return DataLoader(_EvalTick(), batch_size=None)

    def state_dict(self):
        return {"generator": self.generator.get_state(), "produced": self.stream.produced}

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])
        self.stream.produced = state["produced"]
