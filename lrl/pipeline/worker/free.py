"""The free-running mode of a rollout worker: units as they come, episodes into free slots, the newest weights
at the moments ``--partial-rollouts`` allows (``interrupt``: at the next token boundary of every slot; ``drain``:
once the episodes in flight have finished on the old weights, starting none meanwhile). Each group goes back to
the controller as soon as its episodes are done. Each newer version it sees on the board goes to the run's
staleness policy first (:meth:`lrl.pipeline.policies.StalePolicy.published`: ``abort`` stops stale episodes,
``cut`` sends groups at their last version without their stragglers)."""

from __future__ import annotations

import dataclasses
from collections import deque

import torch

from lrl.pipeline.messages import Group, GroupDone, Work
from lrl.pipeline.policies import make_stale_policy
from lrl.pipeline.worker.mode import Mode, work_from_state
from lrl.streams import FREE_WORKER, SAMPLING, TOOL_LATENCY, batch_seed, stream_seed


class FreeRunning(Mode):
    """Units as they come; see the module docstring."""

    def __init__(self, worker):
        super().__init__(worker)
        self.units: deque[Work] = deque()  # not started
        self.stale = make_stale_policy(self.cfg)  # what it does with work past the bound (--stale-policy)
        self.seen = -1  # the newest version seen on the board, told to the policy
        seed = self.cfg.seed
        self.generator = torch.Generator().manual_seed(
            batch_seed(stream_seed(seed, SAMPLING), worker.rank, FREE_WORKER + worker.index)
        )
        self.tool_generator = torch.Generator().manual_seed(
            batch_seed(stream_seed(seed, TOOL_LATENCY), worker.rank, worker.index)
        )

    def begin(self) -> None:
        from lrl.envs.workers import make_tools

        self.worker.load(None)
        self.rollout = self.new_rollout(self.generator, make_tools(self.cfg.environment, self.tool_generator))

    def accept(self, work: Work) -> None:
        self.units.append(work)

    def idle(self) -> bool:
        return not self.units and not self.waiting and self.rollout.done

    def step(self) -> None:
        worker = self.worker
        newer = worker.board.version > worker.version
        drain = self.cfg.partial_rollouts == "drain"
        loaded = False
        if newer and (not drain or self.rollout.done):
            self.rollout.pausing(True)  # the slots in flight wait while the weights load
            loaded = worker.load(None)
            if loaded:
                self.rollout.switch(worker.version)
            self.rollout.pausing(False)
        published = worker.board.version
        if published > self.seen:
            self.seen = published
            self.stale.published(self, published)
        if not loaded and not (newer and drain):  # draining starts nothing new
            self._open_units()
            self.admit()
        if not self.rollout.done:
            self.finished(self.rollout.advance())

    def _open_units(self) -> None:
        """Open units until their waiting episodes fill the room the engine has (in lockstep: one unit, once
        the last one is done)."""
        room = self.rollout.room(self.cfg.slots)
        while room > len(self.waiting) and self.units and (self.cfg.slots or not self.waiting):
            self.open_groups(self.units.popleft().groups)

    def done_group(self, serial: int, episodes: list, seconds: float) -> None:
        self.worker.send(GroupDone(self.worker.index, serial, episodes, seconds))

    # -- its checkpoint format -------------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "units": [dataclasses.asdict(u) for u in self.units],
            "waiting": [list(x) for x in self.waiting],
            "groups": self.groups.state(),
            "rollout": self.rollout.state(),
            "tool_generator": self.tool_generator.get_state(),
            "env_generator": self.worker.env_generator.get_state(),
            "version": self.worker.version,
        }

    def restore(self, state: dict) -> None:
        from lrl.envs.workers import make_tools
        from lrl.rollout import Rollout

        worker = self.worker
        self.units = deque(work_from_state(u) for u in state["units"])
        self.waiting = deque(tuple(x) for x in state["waiting"])
        self.groups.restore(state["groups"], worker.task_ids.__getitem__)
        self.tool_generator.set_state(state["tool_generator"])
        worker.env_generator.set_state(state["env_generator"])
        worker.load(None)  # free-running: the newest weights; the episodes' earlier tokens keep their tags
        self.rollout = Rollout.restore(
            state["rollout"],
            worker.sampler.decoder(),
            worker.failing_spec,
            worker.task_ids.__getitem__,
            lockstep=not self.cfg.slots,
            tools=make_tools(self.cfg.environment, self.tool_generator),
        )
        self.rollout.trace = True
        self.generator = self.rollout.generator
        self.rollout.switch(worker.version)

    @staticmethod
    def held_work(state: dict, episodes_per_group: int) -> list[Work] | None:
        """The groups a saved state had started (as one Work, batch -1), then its units not started; None for a
        checkpoint from before groups recorded their tasks."""
        opened = state["groups"]
        if "tasks" not in opened and opened["elapsed"]:
            return None
        started = [Group(int(s), t, episodes_per_group) for s, t in sorted(opened.get("tasks", {}).items())]
        return ([Work(started, -1)] if started else []) + [work_from_state(u) for u in state["units"]]
