"""The controller: a DataModule that streams one collated batch per training step from a behavior sampler.

Rollouts run in the training process (no worker processes: a forked sampler would never see new weights)
and lazily: the module pulls the next batch inside ``training_step`` through Lightning's
``dataloader_iter``, so each batch is sampled after the previous update and its weight sync. The version
tags prove it: with the on-policy sampler every trained token has staleness 0.

Environment failures (seed 13.7, option (c)): the stream builds every env itself, so it can inject worker
failures (``cfg.env_failure_rate`` per turn, ``cfg.env_failure_hazard`` per token) from its own generator. A
failed episode gets no gradient (its ``action_mask`` row is zero, see ``collate``), takes no part in its group's
advantage statistics, and its task is drawn first into the next batch, so failures do not thin out the tasks
that fail most.

Under data parallelism every rank runs its own stream over ``tasks_per_step / world_size`` tasks, with its own
seed streams (rank 0 keeps the single-process seeds). ``state_dict`` holds every rank's state, so a checkpoint
written by rank 0 resumes all of them exactly.
"""

from __future__ import annotations

import hashlib
import time

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from lrl.gym import BugFixEnv, Task, WordTokenizer
from lrl.losses import group_advantages
from lrl.rollout import collate


def rank_seed(seed: int, rank: int) -> int:
    """The seed of a rank's stream: `seed` itself on rank 0 (single-process runs are unchanged), else a hash."""
    if rank == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"lrl:{seed}:{rank}".encode()).digest()[:7], "little")


class RolloutStream(IterableDataset):
    """Yields `n_steps` batches; each is `tasks_per_step` train tasks x `episodes_per_task` episodes."""

    def __init__(self, sampler, tasks: list[Task], tok: WordTokenizer, cfg, generator: torch.Generator, n_steps: int,
                 env_generator: torch.Generator | None = None):  # fmt: skip
        self.sampler, self.tasks, self.tok, self.cfg = sampler, tasks, tok, cfg
        self.generator, self.n_steps = generator, n_steps
        self.env_generator = env_generator if env_generator is not None else torch.Generator().manual_seed(cfg.seed + 2)
        self.tasks_per_step = cfg.tasks_per_step  # this process's share; RolloutDataModule.setup divides it
        self.produced = 0
        self.carry: list[int] = []  # indices into `tasks` of failed episodes, drawn first into the next batch
        self.position = {t.task_id: i for i, t in enumerate(tasks)}

    def choose_tasks(self) -> list[Task]:
        """Draw the step's tasks without replacement, each repeated episodes_per_task times.

        Tasks whose episodes failed in the environment last step come first; the permutation is drawn every
        step all the same, so the stream's randomness does not depend on when failures happen.
        """
        perm = torch.randperm(len(self.tasks), generator=self.generator).tolist()
        carried, self.carry = self.carry[: self.tasks_per_step], self.carry[self.tasks_per_step :]
        picks = carried + [i for i in perm if i not in carried][: self.tasks_per_step - len(carried)]
        return [self.tasks[i] for i in picks for _ in range(self.cfg.episodes_per_task)]

    def make_env_factory(self, made: list[BugFixEnv]):
        """A factory of the gym's env with this run's failure injection; it records the envs it makes."""
        cfg = self.cfg
        rate, hazard = cfg.env_failure_rate, cfg.env_failure_hazard

        def factory() -> BugFixEnv:
            env = BugFixEnv(self.tok, cfg.max_turns, rate, hazard, self.env_generator if rate or hazard else None)
            made.append(env)
            return env

        return factory

    def next_batch(self) -> dict[str, torch.Tensor]:
        """Sample, collate and score one batch with the sampler's current behavior weights."""
        start = time.perf_counter()
        tasks, envs = self.choose_tasks(), []
        self.sampler.env_factory = self.make_env_factory(envs)
        try:
            episodes = self.sampler.sample(tasks, self.generator)
        finally:
            self.sampler.env_factory = None
        injecting = bool(self.cfg.env_failure_rate or self.cfg.env_failure_hazard)
        if len(envs) != len(episodes):
            if injecting:
                raise RuntimeError(f"sampler {getattr(self.sampler, 'name', '?')!r} does not build its envs with "
                                   "sampler.env_factory, so environment failures cannot be injected")  # fmt: skip
            envs = []
        batch = collate(episodes, self.tok.pad_id)
        valid = 1.0 - batch["env_failure"]  # [B]
        batch["advantage"] = group_advantages(batch["reward"], batch["task_id"], valid)
        if envs:
            batch["env_turns"] = torch.tensor([env.turns for env in envs], dtype=torch.float32)  # [B]
        failed = [self.position[ep.task.task_id] for ep in episodes if ep.env_failure]
        self.carry += [i for i in dict.fromkeys(failed) if i not in self.carry]
        batch["index"] = torch.tensor(self.produced)
        batch["sample_time"] = torch.tensor(time.perf_counter() - start)
        self.produced += 1
        return batch

    def state_dict(self) -> dict:
        """Everything the stream needs to continue exactly: generator states, batches produced, carried tasks."""
        return {"generator": self.generator.get_state(), "env_generator": self.env_generator.get_state(),
                "produced": self.produced, "carry": list(self.carry)}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        if "env_generator" in state:
            self.env_generator.set_state(state["env_generator"])
        self.produced = state["produced"]
        self.carry = list(state.get("carry", []))

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
        self.rank, self.world_size = 0, 1

    def setup(self, stage: str) -> None:
        """Under data parallelism: this rank's share of the tasks and its own seed streams (once per run)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.world_size == 1 or self.world_size > 1:
            return
        self.rank, self.world_size = trainer.global_rank, trainer.world_size
        if self.cfg.tasks_per_step % self.world_size:
            raise ValueError(f"tasks_per_step {self.cfg.tasks_per_step} does not split over {self.world_size} ranks")
        self.stream.tasks_per_step = self.cfg.tasks_per_step // self.world_size
        self.generator.manual_seed(rank_seed(self.cfg.seed, self.rank))
        self.stream.env_generator.manual_seed(rank_seed(self.cfg.seed + 2, self.rank))

    def train_dataloader(self):
        return DataLoader(self.stream, batch_size=None, num_workers=0)

    def val_dataloader(self):
        return DataLoader(_EvalTick(), batch_size=None)

    def state_dict(self):
        """Every rank's stream state (gathered when distributed: Lightning saves rank 0's copy of this)."""
        own = self.stream.state_dict()
        if self.world_size == 1 or not dist.is_initialized():
            return {"ranks": [own]}
        ranks: list = [None] * self.world_size
        dist.all_gather_object(ranks, own)
        return {"ranks": ranks}

    def load_state_dict(self, state):
        ranks = state.get("ranks", [state])  # a bare state: written before per-rank states existed
        if len(ranks) != self.world_size:
            raise ValueError(f"the checkpoint holds the streams of {len(ranks)} process(es); this run has "
                             f"{self.world_size}: resume with the same --devices and --num-nodes")  # fmt: skip
        self.stream.load_state_dict(ranks[self.rank])
