"""The asynchronous rollout source: the controller in the trainer's process, rollout workers beside it.

It starts ``rollout_workers`` processes (:mod:`lrl.pipeline.backends.local`) when the fit starts, after a checkpoint's state
is loaded, hands them groups of episodes (a group: one task, ``episodes_per_task`` episodes) as its scheduling
policy says (:mod:`lrl.pipeline.schedule`), and makes each step's batch from finished groups. Staleness is bounded
twice, as AReaL and prime-rl do (docs/pipeline.md):

- **throttle**: no more groups are started than can be trained within the bound (the schedule);
- **consumer**: an episode whose oldest action token is more than ``max_staleness`` versions behind the trainer
  is dropped, counted, its length logged and its id recorded, so the bound holds for every trained token.
  The run's staleness policy (:mod:`lrl.pipeline.policies`) judges each episode taken (keep, mask its over-stale
  tokens, drop) and chooses the groups taken; ``--staleness-drop false`` (the policy ``none``) keeps every
  episode: the throttle alone bounds the work, and the oldest data may be older.

Every episode has an id ``"<rank>:<serial>"`` (serials in the order episodes were started); each step reports the
ids it trained and dropped, and a checkpoint holds the finished groups not yet trained, every worker's in-flight
episodes and the ledger, all as plain data (it loads with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import time
from collections import deque

import torch

from lrl.batch import Batch
from lrl.pipeline.backends import make_workers
from lrl.pipeline.messages import BatchDone, Beat, Cut, Group, GroupDone, Pause, Paused, Resume, Setup
from lrl.pipeline.metrics import Carry, StepWindow, delta, pipeline_metrics
from lrl.pipeline.policies import Verdict, make_stale_policy
from lrl.pipeline.schedule import make_schedule
from lrl.sources.base import TaskPicker, rank_seed, score_batch

POLL = 0.05  # seconds between looks at the workers while the trainer waits
DRAIN = 10_000  # most messages read in one go before a take (workers that talk faster cannot stall it)


class AsyncSource:
    """Batches from rollout workers, one per training step (see the module docstring)."""

    def __init__(self, cfg, spec, policy: torch.nn.Module):
        self.cfg = cfg  # each worker is set up with the whole config: it builds its environment and sampler
        self.rollout = rollout = cfg.rollout
        self.batch_options = cfg.batch
        self.environment = cfg.environment
        self.seed = cfg.run.seed
        self.max_steps = cfg.run.max_steps
        self.spec = spec
        self.episodes_per_group = cfg.batch.episodes_per_task
        self.max_staleness = rollout.max_staleness
        self.rank = 0
        self.world = 1
        self.groups_per_batch = cfg.batch.tasks_per_step  # groups per batch, this rank's share
        self.generator = torch.Generator().manual_seed(self.seed)  # the tasks of each batch
        self.picker = TaskPicker(spec.train_tasks, self.groups_per_batch, self.generator)
        self.workers = make_workers(rollout)  # processes on this machine or Ray actors (--rollout-backend)
        # a deterministic schedule may ask for a version the trainer has passed: keep the last eta + 2
        self.board = self.workers.make_board(policy, 0, self.max_staleness + 2 if rollout.deterministic else 1)
        self.model_class = type(policy)
        self.model_config = policy.config
        self.stale = make_stale_policy(rollout)  # what happens to work past the bound (--stale-policy)
        self.schedule = make_schedule(rollout, self.episodes_per_group, self.groups_per_batch, self.stale)
        self.issued = 0  # groups handed out so far (serials 0 .. issued - 1)
        self.group_task: dict[int, int] = {}  # serial -> task position, for groups not consumed yet
        self.produced = 0
        self.version = 0
        self.restore: list | None = None  # the workers' states from a checkpoint, until they start
        self.restore_board: dict | None = None
        self.window = StepWindow()
        self.last_stats: dict = {}
        self._paused: dict[int, dict] = {}  # worker -> its state, while a checkpoint pauses them
        self._durations: list = []
        self._turns: list = []  # [serial, turns] of the episodes ended before the last step
        self._timeline: list = []  # the workers' occupancy samples up to the last step
        self._carry = Carry()  # what the groups taken since the last batch were, until a batch is made
        self.last_time = time.time()
        # the trainer's last steps, each from a batch handed out to the next request
        self.trainer_seconds: deque[float] = deque(maxlen=16)
        self._handed_at: float | None = None

    # -- lifecycle --------------------------------------------------------------------------------------
    def bind(self, rank: int, world_size: int) -> None:
        """This rank's workers, ids and share of each batch's groups, and its own task draws."""
        self.rank = rank
        self.world = world_size
        self.groups_per_batch = self.batch_options.tasks_per_step // world_size
        self.picker.per_step = self.groups_per_batch
        self.generator.manual_seed(rank_seed(self.seed, rank))
        self.schedule = make_schedule(self.rollout, self.episodes_per_group, self.groups_per_batch, self.stale)

    def setup(self, policy, version: int) -> None:
        """Publish the starting weights (and, resuming a deterministic run, the older ones it may still need),
        then start the workers."""
        for old, state in (self.restore_board or {}).items():
            if old < version:
                self.board.publish_state(state, old)
        self.restore_board = None
        self.publish(policy, version)
        if not self.workers.running:
            self.start()

    def start(self) -> None:
        setups = [
            Setup(
                self.cfg,
                self.rank,
                self.world,
                self.board,
                self.model_class,
                self.model_config,
                self.restore[i] if self.restore else None,
            )
            for i in range(self.rollout.rollout_workers)
        ]
        self.workers.start(setups)
        self.restore = None
        self.last_time = time.time()

    def publish(self, policy, version: int) -> None:
        self.board.publish(policy, version)
        self.version = version

    def close(self) -> None:
        self.workers.close()

    def sampler_traits(self):
        """The workers' sampler is declared by its registry entry (``lrl.samplers.sampler_traits``)."""
        from lrl.samplers import sampler_traits

        return sampler_traits(self.cfg, self.spec.tok)

    # -- handing out work -------------------------------------------------------------------------------
    def _new_groups(self) -> list[Group]:
        """A batch's worth of groups: the synchronous stream's draw of distinct tasks."""
        groups = []
        for position in self.picker.choose():
            groups.append(Group(self.issued, position, self.episodes_per_group))
            self.group_task[self.issued] = position
            self.issued += 1
        return groups

    def _receive(self, timeout: float = POLL) -> bool:
        """Read one worker message (waiting up to `timeout`); False when none came."""
        message = self.workers.receive(timeout)
        if message is None:
            return False
        if isinstance(message, Beat):
            self.window.stats[message.worker] = message.stats
            self.window.timeline.extend([message.worker, *x] for x in message.timeline)
            return True
        if isinstance(message, Paused):
            self._paused[message.worker] = message.state
            return True
        if isinstance(message, GroupDone):
            self._finished(message.serial, message.episodes)
        elif isinstance(message, BatchDone):
            for serial, episodes in message.groups.items():
                self._finished(serial, episodes)
        self.schedule.accept(message)
        return True

    def _drain(self) -> None:
        """Read every message already waiting (at most DRAIN), so that a take chooses among all the groups
        that finished while the trainer was busy, not only the first ones read."""
        for _ in range(DRAIN):
            if not self._receive(0.0):
                return

    def _finished(self, serial: int, episodes: list) -> None:
        """Record the wall time of each episode of a finished group (the simulator's durations come from it)."""
        for k, episode in enumerate(episodes):
            j = position(episode, k)
            self.window.finished_seconds.append(episode.seconds)
            self.window.finished_ids.append([serial * self.episodes_per_group + j, episode.seconds])
            self.window.turns.append([serial * self.episodes_per_group + j, episode.turns()])

    # -- taking a batch ---------------------------------------------------------------------------------
    def next_batch(self, version: int) -> Batch:
        """The next batch for the trainer at `version`. Groups whose every episode is past the bound are
        recorded as dropped and the next ones taken."""
        if not self.workers.running:
            self.start()
        start = time.perf_counter()
        if self._handed_at is not None:  # the trainer's step since the last batch: update, sync, logging
            self.trainer_seconds.append(start - self._handed_at)
        self.stale.measured(self.trainer_seconds)
        while True:
            self.schedule.issue(version, self._new_groups, self.workers.send)
            self._drain()
            at_take = self.schedule.queued  # episodes finished and waiting: what the take chooses among
            groups = self.schedule.take()
            if groups is None:
                for w, serials in self.schedule.outbox:  # the policy asks to cut what it waits for
                    self.workers.send(w, Cut(serials))
                self.schedule.outbox.clear()
                self._receive()
                continue
            batch, info = self._assemble(groups, version, time.perf_counter() - start)
            if batch is not None:
                break
        if (
            version + 1 >= self.max_steps
        ):  # the run's last batch: what was started but will not be trained
            info["unfinished_ids"] = [
                f"{self.rank}:{s * self.episodes_per_group + j}"
                for s in sorted(self.group_task)
                for j in range(self.episodes_per_group)
            ]
        batch["pipeline"] = info.pop("metrics")
        batch["pipeline"]["pipeline/queue_depth_at_take"] = float(at_take)
        batch["pipeline"].update(self.schedule.metrics())  # how long the workers took to answer asks to cut
        batch["pipeline"].update(self.stale.metrics())
        batch["ledger"] = info
        batch["index"] = torch.tensor(self.produced)
        batch["sample_time"] = torch.tensor(time.perf_counter() - start)
        self.produced += 1
        self._handed_at = time.perf_counter()
        return batch

    def _assemble(self, groups: list, version: int, waited: float) -> tuple[Batch | None, dict]:
        """Apply the staleness policy's verdict to each episode taken (keep it, mask its over-stale tokens, or
        drop it), collate the rest, score groups; the step's ledger and metrics. Groups whose every episode was
        dropped make no batch (None): what they were is carried into the next one's ledger."""
        oldest = version - self.max_staleness  # the oldest version a trained token may have
        carry = self._carry
        kept, trained_ids, masking = [], [], []  # masking: each kept episode's verdict is MASK
        for serial, episodes in groups:
            self.group_task.pop(serial, None)
            carry.seconds.append(self.schedule.seconds.pop(serial, float("nan")))
            present = {position(e, k) for k, e in enumerate(episodes)}
            for j in range(self.episodes_per_group):  # left out of a group cut short (--stale-policy cut)
                if j not in present:
                    carry.dropped_ids.append(f"{self.rank}:{serial * self.episodes_per_group + j}")
            for k, episode in enumerate(episodes):
                eid = f"{self.rank}:{serial * self.episodes_per_group + position(episode, k)}"
                tags = [v for v, g in zip(episode.version, episode.generated) if g]
                carry.decoded += len(tags)
                verdict = self.stale.verdict(tags, oldest)
                if verdict is Verdict.DROP:
                    carry.dropped_ids.append(eid)
                    carry.dropped_lengths.append(len(episode.ids))
                    carry.dropped_tokens += len(tags)
                    continue
                kept.append(episode)
                trained_ids.append(eid)
                masking.append(verdict is Verdict.MASK)
        if not kept:
            return None, {}
        self._carry = Carry()
        staleness = [  # masked tokens are not trained: not counted
            version - v
            for e, masks in zip(kept, masking)
            for v, g in zip(e.version, e.generated)
            if g and (v >= oldest or not masks)
        ]
        dropped_lengths = carry.dropped_lengths
        info = {
            "trained_ids": trained_ids,
            "dropped_ids": carry.dropped_ids,
            "time/group_seconds": carry.seconds,  # per group, for calibrating the simulator
            "time/episode_seconds": [e.seconds for e in kept],
            "staleness_counts": [staleness.count(k) for k in range(max(staleness, default=-1) + 1)],
            "metrics": self._metrics(waited, kept, dropped_lengths),
        }
        # [serial, seconds] of every episode that ended since the last step, trained or not
        info["time/finished_seconds"] = self._durations
        info["time/finished_turns"] = self._turns
        info["pipeline/occupancy"] = self._timeline
        batch = score_batch(kept, self.spec, self.batch_options, self.environment)
        masked = 0.0
        if any(masking):  # over-stale action tokens get no gradient; the advantage is the whole episode's
            rows = torch.tensor(masking).unsqueeze(1)  # [B, 1]: the episodes masked
            over = (batch["action_mask"] > 0) & (batch["version"] < oldest) & rows
            batch["action_mask"] = batch["action_mask"] * (~over).float()
            masked = float(over.sum())
        metrics = info["metrics"]
        aborted = metrics["pipeline/aborted_tokens"] + metrics["pipeline/cut_tokens"]  # stopped in the workers
        metrics["pipeline/decoded_tokens"] = float(carry.decoded + aborted)  # by the episodes taken, or aborted
        metrics["pipeline/masked_tokens"] = masked
        metrics["pipeline/wasted_tokens"] = carry.dropped_tokens + aborted + masked  # decoded, never trained
        self.picker.carry_failures(kept)
        if dropped_lengths:
            batch["sampled_length"] = torch.tensor([float(len(e.ids)) for e in kept] + dropped_lengths)
        return batch, info

    def _metrics(self, waited: float, kept: list, dropped_lengths: list) -> dict:
        now = time.time()
        elapsed = max(now - self.last_time, 1e-9)
        self.last_time = now
        grew = delta(self.window.stats, self.last_stats)
        self.last_stats = dict(self.window.stats)
        finished = self.window.finished_seconds
        self.window.finished_seconds = []
        self._durations = self.window.finished_ids
        self.window.finished_ids = []
        self._turns, self.window.turns = self.window.turns, []
        self._timeline, self.window.timeline = self.window.timeline, []
        queued = self.schedule.queued
        return pipeline_metrics(waited, kept, dropped_lengths, elapsed, grew, finished, queued)

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Pause every worker at a token boundary and keep everything in flight, as plain data: their episodes,
        the finished groups not trained yet, the ledger (the next serial, the tasks of unconsumed groups)."""
        workers = self.restore
        if self.workers.running:
            self._paused = {}
            for w in range(self.rollout.rollout_workers):
                self.workers.send(w, Pause())
            while len(self._paused) < self.rollout.rollout_workers:
                self._receive()
            workers = [self._paused[w] for w in range(self.rollout.rollout_workers)]
        state = {
            "schedule": self.schedule.state_dict(),
            "picker": self.picker.state_dict(),
            "generator": self.generator.get_state(),
            "issued": self.issued,
            "group_task": dict(self.group_task),
            "produced": self.produced,
            "workers": workers,
            "board": self.board.kept() if self.rollout.deterministic else None,
        }
        if self.workers.running:
            for w in range(self.rollout.rollout_workers):
                self.workers.send(w, Resume())
        return state

    def load_state_dict(self, state: dict) -> None:
        from lrl.rollout import Episode

        def episode(saved: dict):
            return Episode.from_state(saved, self.picker.by_id(saved["task_id"]))

        self.group_task = {int(k): v for k, v in state["group_task"].items()}
        self.schedule.load_state_dict(state["schedule"], episode, self.group_task)
        self.picker.load_state_dict(state["picker"])
        self.generator.set_state(state["generator"])
        self.issued = state["issued"]
        self.produced = state["produced"]
        self.restore = state["workers"]
        self.restore_board = state["board"]

    def weights_state(self) -> dict:
        return {"version": self.version}

    def load_weights_state(self, state: dict) -> None:
        self.version = state["version"]


def position(episode, k: int) -> int:
    """An episode's place in its group: its tag's (a group cut short lacks some), else its place in the list."""
    tag = getattr(episode, "tag", None)
    return int(tag[1]) if isinstance(tag, (tuple, list)) and len(tag) == 2 else k
