"""The controller: a DataModule that streams one collated batch per training step from a behavior sampler.

Rollouts run in the training process (no worker processes: a forked sampler would never see new weights)
and lazily. Lightning's data fetcher reads one item ahead, so the dataloader does not yield batches: it yields
one :class:`Deferred` per step, and the module samples it (``Deferred.get()``) inside ``training_step``, after
the previous update and its weight sync. The version tags prove it: with the on-policy sampler every trained
token has staleness 0. The stream's own counter, saved in checkpoints, says which batch comes next.

Environment failures: the stream wraps every env in :class:`lrl.envs.FailureInjection` (``env_failure_rate``
per turn, ``env_failure_hazard`` per token), drawn from its own generator. A failed episode gets no gradient
(its ``action_mask`` row is zero, see ``lrl.batch.collate``), takes no part in its group's advantage
statistics, and its task is drawn first into the next batch, so failures do not thin out the tasks that fail
most (docs/robustness.md).

Under data parallelism every rank runs its own stream over ``tasks_per_step / world_size`` tasks, with its own
seed streams (rank 0 keeps the single-process seeds). ``state_dict`` holds every rank's state, so a checkpoint
written by rank 0 resumes all of them exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from lrl.batch import Batch, collate
from lrl.envs import EnvSpec, FailureInjection
from lrl.losses import group_advantages


def rank_seed(seed: int, rank: int) -> int:
    """The seed of a rank's stream: `seed` itself on rank 0 (single-process runs are unchanged), else a hash."""
    if rank == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"lrl:{seed}:{rank}".encode()).digest()[:7], "little")


class RolloutStream:
    """Samples the run's batches one by one: each is `tasks_per_step` train tasks x `episodes_per_task` episodes."""

    def __init__(
        self,
        sampler,
        spec: EnvSpec,
        cfg,
        generator: torch.Generator,
        env_generator: torch.Generator | None = None,
    ):
        self.sampler = sampler
        self.spec = spec
        self.tasks = list(spec.train_tasks)
        self.cfg = cfg
        self.generator = generator
        self.env_generator = (
            env_generator if env_generator is not None else torch.Generator().manual_seed(cfg.seed + 2)
        )
        self.tasks_per_step = cfg.tasks_per_step  # this process's share; RolloutDataModule.setup divides it
        self.produced = 0
        self.carry: list[int] = []  # indices into `tasks` of failed episodes, drawn first into the next batch
        self.position = {t.task_id: i for i, t in enumerate(self.tasks)}
        self.pipeline = None  # lrl.pipeline.AsyncRollouts when the rollouts run in worker processes

    def choose_tasks(self) -> list:
        """Draw the step's tasks without replacement, each repeated episodes_per_task times.

        Tasks whose episodes failed in the environment last step come first; the permutation is drawn every
        step all the same, so the stream's randomness does not depend on when failures happen.
        """
        perm = torch.randperm(len(self.tasks), generator=self.generator).tolist()
        carried = self.carry[: self.tasks_per_step]
        self.carry = self.carry[self.tasks_per_step :]
        picks = carried + [i for i in perm if i not in carried][: self.tasks_per_step - len(carried)]
        return [self.tasks[i] for i in picks for _ in range(self.cfg.episodes_per_task)]

    def failing_spec(self, made: list[FailureInjection]) -> EnvSpec:
        """The env spec whose envs inject this run's worker failures; it records the envs it makes."""
        rate = self.cfg.env_failure_rate
        hazard = self.cfg.env_failure_hazard
        generator = self.env_generator if rate or hazard else None

        def make() -> FailureInjection:
            env = FailureInjection(self.spec.make(), rate, hazard, generator)
            made.append(env)
            return env

        return dataclasses.replace(self.spec, make=make)

    def next_batch(self, version: int = 0) -> Batch:
        """Sample, collate and score one batch with the sampler's current behavior weights (or take it from the
        rollout workers, for the trainer at `version`)."""
        if self.pipeline is not None:
            return self._from_workers(version)
        start = time.perf_counter()
        tasks = self.choose_tasks()
        envs = []
        episodes = self.sampler.sample(tasks, self.generator, self.failing_spec(envs))
        if len(envs) != len(episodes):
            raise RuntimeError(
                f"sampler {getattr(self.sampler, 'name', '?')!r} did not build one env per episode "
                "with spec.make(), so environment failures cannot be injected"
            )
        batch = collate(episodes, self.spec.tok.pad_id, self.spec.metrics)
        shaped = (
            batch["reward"] - self.cfg.invalid_penalty * batch["invalid"]
        )  # what the advantages are made of
        batch["advantage"] = group_advantages(shaped, batch["task_id"], 1.0 - batch["env_failure"])
        batch["env_turns"] = torch.tensor([env.turns for env in envs], dtype=torch.float32)  # [B]
        failed = [self.position[ep.task.task_id] for ep in episodes if ep.env_failure]
        self.carry += [i for i in dict.fromkeys(failed) if i not in self.carry]
        batch["index"] = torch.tensor(self.produced)
        batch["sample_time"] = torch.tensor(time.perf_counter() - start)
        self.produced += 1
        return batch

    def _from_workers(self, version: int) -> Batch:
        start = time.perf_counter()
        batch, info = self.pipeline.next_batch(version)
        batch["pipeline"] = {k: v for k, v in info.items() if k.startswith("pipeline/")}
        keys = ("trained_ids", "dropped_ids", "unfinished_ids", "time/group_seconds", "staleness_counts")
        batch["ledger"] = {k: info[k] for k in keys if k in info}
        batch["index"] = torch.tensor(self.produced)
        batch["sample_time"] = torch.tensor(time.perf_counter() - start)
        self.produced += 1
        return batch

    def state_dict(self) -> dict:
        """Everything the stream needs to continue exactly: generator states, batches produced, carried tasks,
        and, in async mode, the rollout workers' queue, in-flight episodes and ledger."""
        state = {
            "generator": self.generator.get_state(),
            "env_generator": self.env_generator.get_state(),
            "produced": self.produced,
            "carry": list(self.carry),
        }
        if self.pipeline is not None:
            state["pipeline"] = self.pipeline.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.env_generator.set_state(state["env_generator"])
        self.produced = state["produced"]
        self.carry = list(state["carry"])
        if self.pipeline is not None and "pipeline" in state:
            self.pipeline.load_state_dict(state["pipeline"])


class Deferred:
    """A training batch not sampled yet; ``get()`` samples it now, with the sampler's current weights."""

    def __init__(self, stream: RolloutStream):
        self.stream = stream

    def get(self, version: int = 0) -> Batch:
        return self.stream.next_batch(version)


class _StepCues(Dataset):
    """One Deferred batch per training step (map-style: Lightning knows the length; reading ahead is free)."""

    def __init__(self, stream: RolloutStream, n_steps: int):
        self.stream = stream
        self.n_steps = n_steps

    def __len__(self) -> int:
        return self.n_steps

    def __getitem__(self, i: int) -> Deferred:
        return Deferred(self.stream)


class _StepLoader(DataLoader):
    """The training dataloader. It yields stateless cues, so resuming it is only a matter of position: the
    stream's full state (generators, carried tasks, every rank's) comes back with the datamodule's state."""

    def __init__(self, stream: RolloutStream, n_steps: int):
        super().__init__(_StepCues(stream, n_steps), batch_size=None, num_workers=0)
        self.stream = stream

    def state_dict(self) -> dict:
        return {"produced": self.stream.produced}

    def load_state_dict(self, state: dict) -> None:
        if state["produced"] != self.stream.produced:
            raise ValueError(
                f"the checkpoint's dataloader is at batch {state['produced']} but its stream at "
                f"{self.stream.produced}: the checkpoint is inconsistent"
            )


class _EvalTick(torch.utils.data.Dataset):
    """One item: the validation loop's cue to run a held-out evaluation."""

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return i


class RolloutDataModule(L.LightningDataModule):
    """Train batches stream from the sampler; validation is a held-out evaluation run by the module."""

    def __init__(self, sampler, spec: EnvSpec, cfg):
        super().__init__()
        self.sampler = sampler
        self.spec = spec
        self.cfg = cfg
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.stream = RolloutStream(sampler, spec, cfg, self.generator)
        self.rank = 0
        self.world_size = 1

    def setup(self, stage: str) -> None:
        """Under data parallelism: this rank's share of the tasks and its own seed streams (once per run)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None or trainer.world_size == 1 or self.world_size > 1:
            return
        self.rank = trainer.global_rank
        self.world_size = trainer.world_size
        self.stream.tasks_per_step = self.cfg.tasks_per_step // self.world_size  # Config checks it divides
        self.generator.manual_seed(rank_seed(self.cfg.seed, self.rank))
        self.stream.env_generator.manual_seed(rank_seed(self.cfg.seed + 2, self.rank))
        if self.stream.pipeline is not None:  # its own workers, ids and share of each batch's groups
            self.stream.pipeline.rank = self.rank
            self.stream.pipeline.G = self.stream.tasks_per_step

    def teardown(self, stage: str) -> None:
        if self.stream.pipeline is not None:
            self.stream.pipeline.close()

    def on_exception(self, exception: BaseException) -> None:
        if self.stream.pipeline is not None:
            self.stream.pipeline.close()

    def train_dataloader(self):
        return _StepLoader(self.stream, self.cfg.max_steps)

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
        ranks = state["ranks"]
        if len(ranks) != self.world_size:
            raise ValueError(
                f"the checkpoint holds the streams of {len(ranks)} process(es); this run has "
                f"{self.world_size}: resume with the same --devices and --num-nodes"
            )
        self.stream.load_state_dict(ranks[self.rank])
