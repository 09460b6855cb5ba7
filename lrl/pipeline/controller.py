"""The asynchronous controller: rollout workers beside the trainer, a hard staleness bound, a lossless ledger.

``AsyncRollouts`` runs in the trainer's process, in place of the synchronous stream. It starts ``rollout_workers``
spawned processes when the fit starts (after a checkpoint's state is loaded), hands each its share of every batch's
groups (a group: one task, ``episodes_per_task`` episodes) and takes finished groups back. Staleness is bounded
twice, as AReaL and prime-rl do (docs/pipeline.md):

- **throttle**: no more groups are started than can be trained within the bound: at most
  ``(version + 1 + max_staleness) * tasks_per_step`` groups by the time the trainer is at ``version``;
- **consumer**: an episode whose oldest action token is more than ``max_staleness`` versions behind the trainer
  is dropped, counted, its length logged, and its id recorded (the bound holds for every trained token).

Every episode has an id ``"<rank>:<serial>"`` (serials in the order episodes were started); each step reports the
ids it trained and dropped, and a checkpoint holds the queue, the workers' in-flight episodes and the ledger.
"""

from __future__ import annotations

import queue
import time
from collections import deque

import torch
import torch.multiprocessing as mp

from lrl.batch import Batch, collate
from lrl.losses import group_advantages
from lrl.pipeline.board import WeightBoard
from lrl.pipeline.metrics import pipeline_metrics, turns
from lrl.pipeline.worker import worker_main

POLL = 0.05  # seconds between looks at the result queue while the trainer waits
FAULT_SECONDS = 1.0  # a dead worker is noticed within this


class WorkerError(RuntimeError):
    """A rollout worker failed; the message names the worker and its exception."""


class AsyncRollouts:
    """Groups of episodes from rollout workers, one batch per training step (see the module docstring)."""

    def __init__(self, stream, policy: torch.nn.Module, rank: int = 0):
        self.stream, self.cfg, self.spec, self.rank = stream, stream.cfg, stream.spec, rank
        self.G = self.cfg.tasks_per_step  # groups per batch
        self.E = self.cfg.episodes_per_task  # episodes per group
        self.eta = self.cfg.max_staleness
        slots = self.eta + 2 if self.cfg.deterministic else 1
        self.board = WeightBoard(policy, 0, slots)
        self.policy = policy
        self.procs: list = []
        self.tasks_qs: list = []
        self.results_q = None
        self.ready: deque = deque()  # finished groups (serial, episodes), oldest finished first
        self.batches: dict[int, dict] = {}  # deterministic: batch -> {serial: episodes}
        self.issued = 0  # groups handed out so far (serials 0 .. issued-1)
        self.issued_batches = 0
        self.taken_batches = 0  # deterministic: batches consumed (they are consumed in order)
        self.group_task: dict[int, object] = {}  # serial -> task, for groups not consumed yet
        self.restore: list | None = None
        self.worker_stats: dict[int, dict] = {}
        self.last_stats: dict[int, dict] = {}
        self.last_time = None
        self.consumed = 0  # episodes consumed (trained or dropped) so far
        self.seconds: dict[int, float] = {}  # group serial -> seconds its worker spent generating it

    # -- workers --------------------------------------------------------------------------------------
    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.results_q = ctx.Queue()
        cfg_dict = self.cfg.to_dict()
        with torch.random.fork_rng(
            devices=[]
        ):  # building the copy draws an initialisation: not from the run's RNG
            cpu = type(self.policy)(self.policy.config) if hasattr(self.policy, "config") else None
        cpu.load_state_dict({k: v.detach().cpu() for k, v in self.policy.state_dict().items()})
        for i in range(self.cfg.rollout_workers):
            tasks_q = ctx.Queue()
            restore = self.restore[i] if self.restore else None
            args = (i, self.rank, cfg_dict, cpu, self.board, tasks_q, self.results_q, restore)
            proc = ctx.Process(target=worker_main, args=args, daemon=True)
            proc.start()
            self.procs.append(proc)
            self.tasks_qs.append(tasks_q)
        self.restore = None
        self.last_time = time.time()

    def close(self, timeout: float = 3.0) -> None:
        """Stop every worker: a stop message, drain the result queue, join with a timeout, then terminate."""
        for q in self.tasks_qs:
            try:
                q.put(("stop",))
            except (ValueError, OSError):
                pass
        deadline = time.time() + timeout
        while any(p.is_alive() for p in self.procs) and time.time() < deadline:
            self._drain_quietly()
            time.sleep(0.02)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=1.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)
        self.procs, self.tasks_qs = [], []

    def _drain_quietly(self) -> None:
        try:
            while True:
                self.results_q.get_nowait()
        except (queue.Empty, ValueError, OSError):
            pass

    # -- handing out work -------------------------------------------------------------------------------
    def issue(self, version: int) -> None:
        """Hand out every batch the throttle allows at trainer `version`: free-running, each worker gets its
        share of the batch's groups (round robin) as one unit; deterministic, a whole batch goes to one worker."""
        limit = (version + 1 + self.eta) * self.G
        if self.cfg.deterministic:
            while self.issued_batches * self.G < limit:
                b = self.issued_batches
                groups = [self._new_group() for _ in range(self.G)]
                self.tasks_qs[b % len(self.tasks_qs)].put(("batch", b, max(0, b - self.eta), groups))
                self.issued_batches += 1
            return
        while self.issued < limit:
            groups = [self._new_group() for _ in range(self.G)]
            for w, q in enumerate(self.tasks_qs):
                unit = groups[w :: len(self.tasks_qs)]
                if unit:
                    q.put(("work", unit))

    def _new_group(self) -> tuple:
        if self.issued % self.G == 0:  # a new batch's worth: the sync stream's draw of distinct tasks
            self._tasks = [t for t in self.stream.choose_tasks()[:: self.E]]
        task = self._tasks[self.issued % self.G]
        serial = self.issued
        self.group_task[serial] = task
        self.issued += 1
        return (serial, task, self.E)

    # -- taking a batch ---------------------------------------------------------------------------------
    def next_batch(self, version: int) -> tuple[Batch, dict]:
        """The next batch for the trainer at `version` -> (batch, its pipeline metrics and ids). Groups whose
        every episode is past the bound are recorded as dropped and the next ones taken."""
        if not self.procs:
            self.start()
        start = time.perf_counter()
        dropped: list = []
        while True:
            self.issue(version)
            if self.cfg.deterministic:
                b = self.taken_batches
                while b not in self.batches:
                    self._poll()
                groups = sorted(self.batches.pop(b).items())
                self.taken_batches += 1
            else:
                while len(self.ready) < self.G:
                    self._poll()
                groups = [self.ready.popleft() for _ in range(self.G)]
            batch, info = self._assemble(groups, version, time.perf_counter() - start)
            info["dropped_ids"] = dropped + info["dropped_ids"]
            if batch is not None:
                break
            dropped = info["dropped_ids"]
        if (
            version + 1 >= self.cfg.max_steps
        ):  # the run's last batch: what was started but will not be trained
            info["unfinished_ids"] = [
                f"{self.rank}:{s * self.E + j}" for s in sorted(self.group_task) for j in range(self.E)
            ]
        return batch, info

    def _poll(self) -> None:
        try:
            msg = self.results_q.get(timeout=POLL)
        except queue.Empty:
            self._check_workers()
            return
        self._handle(msg)

    def _handle(self, msg) -> None:
        kind, worker = msg[0], msg[1]
        if kind == "group":
            self.ready.append((msg[2], msg[3]))
            self.seconds[msg[2]] = msg[4]
        elif kind == "batch":
            self.batches[msg[2]] = msg[3]
            self.seconds.update({serial: msg[4] for serial in msg[3]})
        elif kind == "beat":
            self.worker_stats[worker] = msg[2]
        elif kind == "error":
            self.close()
            raise WorkerError(f"rollout worker {worker} failed: {msg[2]} (at {msg[3]})")
        elif kind == "state":
            self._states[worker] = msg[2]

    def _check_workers(self) -> None:
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                self._drain_for_errors()
                code = p.exitcode
                self.close()
                raise WorkerError(f"rollout worker {i} died (exit code {code}) without reporting an error")

    def _drain_for_errors(self) -> None:
        try:
            while True:
                msg = self.results_q.get(timeout=0.1)
                if msg[0] == "error":
                    self._handle(msg)
        except queue.Empty:
            return

    def _assemble(self, groups: list, version: int, waited: float) -> tuple[Batch, dict]:
        """Drop episodes past the bound, collate the rest, score groups; the step's pipeline metrics."""
        kept, trained_ids, dropped_ids, dropped_lengths, seconds = [], [], [], [], []
        for serial, episodes in groups:
            self.group_task.pop(serial, None)
            seconds.append(self.seconds.pop(serial, float("nan")))
            for j, ep in enumerate(episodes):
                eid = f"{self.rank}:{serial * self.E + j}"
                tags = [v for v, g in zip(ep.version, ep.generated) if g]
                if tags and version - min(tags) > self.eta:
                    dropped_ids.append(eid)
                    dropped_lengths.append(len(ep.ids))
                    continue
                ep.episode_id = eid
                kept.append(ep)
                trained_ids.append(eid)
        self.consumed += len(trained_ids) + len(dropped_ids)
        metrics = self._metrics(version, waited, kept, dropped_lengths)
        metrics["time/group_seconds"] = seconds  # per group, for calibrating the simulator
        staleness = [version - v for e in kept for v, g in zip(e.version, e.generated) if g]
        metrics["staleness_counts"] = [staleness.count(k) for k in range(max(staleness, default=-1) + 1)]
        if not kept:
            return None, {**metrics, "trained_ids": trained_ids, "dropped_ids": dropped_ids}
        batch = collate(kept, self.spec.tok.pad_id, self.spec.metrics)
        shaped = batch["reward"] - self.cfg.invalid_penalty * batch["invalid"]
        batch["advantage"] = group_advantages(shaped, batch["task_id"], 1.0 - batch["env_failure"])
        batch["env_turns"] = torch.tensor([float(turns(e)) for e in kept])
        failed = [self.stream.position[e.task.task_id] for e in kept if e.env_failure]
        self.stream.carry += [i for i in dict.fromkeys(failed) if i not in self.stream.carry]
        if dropped_lengths:
            batch["sampled_length"] = torch.tensor([float(len(e.ids)) for e in kept] + dropped_lengths)
        return batch, {**metrics, "trained_ids": trained_ids, "dropped_ids": dropped_ids}

    def _metrics(self, version: int, waited: float, kept: list, dropped_lengths: list) -> dict:
        now = time.time()
        elapsed = max(now - self.last_time, 1e-9)
        self.last_time = now
        idle = busy = 0.0
        for w, stats in self.worker_stats.items():
            before = self.last_stats.get(w, {"idle": 0.0, "busy": 0.0})
            idle += stats["idle"] - before["idle"]
            busy += stats["busy"] - before["busy"]
        self.last_stats = dict(self.worker_stats)
        queued = sum(len(eps) for _, eps in self.ready)
        queued += sum(len(e) for b in self.batches.values() for e in b.values())
        return pipeline_metrics(waited, kept, dropped_lengths, elapsed, idle, busy, queued)

    # -- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Pause every worker at a token boundary and keep everything in flight: their rollouts, the finished
        groups not consumed yet, the ledger (the next serial, the tasks of unconsumed groups)."""
        states = None
        if self.procs:
            self._states = {}
            for q in self.tasks_qs:
                q.put(("pause",))
            while len(self._states) < len(self.procs):
                self._poll()
            states = [self._states[i] for i in range(len(self.procs))]
        state = {
            "ready": list(self.ready),
            "batches": dict(self.batches),
            "issued": self.issued,
            "issued_batches": self.issued_batches,
            "taken_batches": self.taken_batches,
            "group_task": dict(self.group_task),
            "tasks": getattr(self, "_tasks", None),
            "workers": states if states is not None else self.restore,
            "consumed": self.consumed,
        }
        for q in self.tasks_qs:
            q.put(("resume",))
        return state

    def load_state_dict(self, state: dict) -> None:
        self.ready = deque(state["ready"])
        self.batches = dict(state["batches"])
        self.issued, self.issued_batches = state["issued"], state["issued_batches"]
        self.taken_batches = state["taken_batches"]
        self.group_task = dict(state["group_task"])
        if state["tasks"] is not None:
            self._tasks = state["tasks"]
        self.restore = state["workers"]
        self.consumed = state["consumed"]
