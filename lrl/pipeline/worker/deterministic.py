"""The deterministic mode of a rollout worker: whole batches in order, each on the version the logical clock
gives it and from generators of its own; with ``interrupt``, weight switches at scheduled decode steps (waiting
for a version that is not published yet); tool latency on a logical clock. What it generates does not depend on
timing, nor on the number of workers, nor on the backend they run on."""

from __future__ import annotations

import dataclasses
import time
from collections import deque

import torch

from lrl.pipeline.messages import BatchDone, Work
from lrl.pipeline.worker.mode import Mode, work_from_state
from lrl.streams import ENV_FAILURES, SAMPLING, TOOL_LATENCY, batch_seed, stream_seed


class Deterministic(Mode):
    """Whole batches in order; see the module docstring."""

    def __init__(self, worker):
        super().__init__(worker)
        self.batches: deque[Work] = deque()
        self.current: Work | None = None
        self.tool_generator: torch.Generator | None = None
        self.batch_done: dict[int, list] = {}  # serial -> episodes of the current batch's finished groups
        self.batch_started = 0.0

    def accept(self, work: Work) -> None:
        self.batches.append(work)

    def idle(self) -> bool:
        return self.current is None and not self.batches

    def step(self) -> None:
        if self.current is None:
            if not self.batches:
                return
            # its version first, waiting if need be: a checkpoint meanwhile finds the batch still queued
            self.worker.load(self.batches[0].start_version)
            self._begin_batch(self.batches.popleft())
        self._switch_on_schedule()
        self.admit()
        self.finished(self.rollout.advance())
        if self.rollout.done and not self.waiting:
            self._end_batch()

    def _begin_batch(self, work: Work) -> None:
        from lrl.envs.workers import LogicalClock, make_tools

        worker = self.worker
        seed = self.cfg.seed
        b = work.batch
        self.current = work
        generator = torch.Generator().manual_seed(batch_seed(stream_seed(seed, SAMPLING), worker.rank, b))
        worker.env_generator.manual_seed(batch_seed(stream_seed(seed, ENV_FAILURES), worker.rank, b))
        self.tool_generator = torch.Generator().manual_seed(
            batch_seed(stream_seed(seed, TOOL_LATENCY), worker.rank, b)
        )
        clock = LogicalClock()
        tools = make_tools(self.cfg.environment, self.tool_generator, clock)
        self.rollout = self.new_rollout(generator, tools, clock)
        self.batch_done = {}
        self.batch_started = time.time()
        self.open_groups(work.groups)

    def _switch_on_schedule(self) -> None:
        """With interrupt: every switch_tokens decode steps, the next scheduled version (waited for)."""
        every = self.cfg.switch_tokens
        steps = self.rollout.decode_steps
        if self.cfg.partial_rollouts != "interrupt" or not steps or steps % every:
            return
        b = self.current.batch
        v0 = self.current.start_version
        scheduled = min(v0 + steps // every, max(b - 1, v0))
        if scheduled > self.worker.version:
            self.worker.load(scheduled)
            self.rollout.switch(self.worker.version)

    def done_group(self, serial: int, episodes: list, seconds: float) -> None:
        self.batch_done[serial] = episodes

    def _end_batch(self) -> None:
        seconds = time.time() - self.batch_started
        self.worker.send(BatchDone(self.worker.index, self.current.batch, self.batch_done, seconds))
        self.end_rollout()
        self.current = None
        self.rollout = None

    # -- its checkpoint format -------------------------------------------------------------------------
    def state(self) -> dict:
        current = None
        if self.current is not None:
            current = {
                "work": dataclasses.asdict(self.current),
                "waiting": [list(x) for x in self.waiting],
                "batch_done": {s: [e.state() for e in eps] for s, eps in self.batch_done.items()},
                "elapsed": time.time() - self.batch_started,
                "rollout": self.rollout.state(),
                "tool_generator": self.tool_generator.get_state(),
                "env_generator": self.worker.env_generator.get_state(),
                "version": self.worker.version,
            }
        return {
            "batches": [dataclasses.asdict(b) for b in self.batches],
            "groups": self.groups.state(),
            "current": current,
        }

    def restore(self, state: dict) -> None:
        from lrl.envs.workers import LogicalClock, make_tools
        from lrl.rollout import Episode, Rollout

        worker = self.worker
        self.batches = deque(work_from_state(b) for b in state["batches"])
        self.groups.restore(state["groups"], worker.task_ids.__getitem__)
        current = state["current"]
        if current is None:
            return
        self.current = work_from_state(current["work"])
        self.waiting = deque(tuple(x) for x in current["waiting"])
        task_of = worker.task_ids.__getitem__
        self.batch_done = {
            int(s): [Episode.from_state(e, task_of(e["task_id"])) for e in eps]
            for s, eps in current["batch_done"].items()
        }
        self.batch_started = time.time() - current["elapsed"]
        self.tool_generator = torch.Generator()
        self.tool_generator.set_state(current["tool_generator"])
        worker.env_generator.set_state(current["env_generator"])
        worker.load(current["version"])
        clock = LogicalClock()
        self.rollout = Rollout.restore(
            current["rollout"],
            worker.sampler.decoder(),
            worker.failing_spec,
            task_of,
            lockstep=not self.cfg.slots,
            tools=make_tools(self.cfg.environment, self.tool_generator, clock),
            clock=clock,
        )
        self.rollout.trace = True

    @staticmethod
    def held_work(state: dict, episodes_per_group: int) -> list[Work]:
        """The batch a saved state had in progress, then those it had waiting."""
        current = [work_from_state(state["current"]["work"])] if state["current"] is not None else []
        return current + [work_from_state(b) for b in state["batches"]]
