"""A rollout worker: its own copy of the weights on one thread, generating groups of episodes into a queue.

Started with ``spawn`` by :class:`lrl.pipeline.controller.AsyncRollouts`. Free-running, it works through the
units it is sent in order, one at a time: a unit is the worker's share of one batch (its groups), run as one
:class:`lrl.rollout.Rollout`; each group is sent back as soon as all its episodes are done, and the next unit
starts when the last group of this one is done. One unit at a time keeps the worker a server of fixed-size jobs,
which is what the pipeline simulator models (docs/pipeline_results.md). New weights come from the
:class:`lrl.pipeline.board.WeightBoard`:

- ``interrupt``: at the next token boundary, also in the middle of an episode (its later tokens carry the new
  version; a KV cache is rebuilt from the sequences);
- ``drain``: the unit in flight finishes on the weights it began with; the worker switches before the next.

Deterministic, it runs one batch at a time from a generator of that batch's own, starting on the version the
logical clock gives the batch and, with ``interrupt``, switching at scheduled token counts (waiting for a version
that is not published yet), so that what it generates does not depend on timing. A pause (a checkpoint) is
answered at a token boundary with the worker's whole state.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback

import torch

BEAT = 0.2  # seconds between heartbeats


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (no orphan even when the trainer gets SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def batch_seed(seed: int, rank: int, batch: int) -> int:
    """The seed of a deterministic batch's generator: a function of the run's seed, the rank and the batch."""
    return (seed * 1_000_003 + rank * 7919 + batch * 104_729) % (2**63)


def worker_main(index: int, rank: int, cfg_dict: dict, policy, board, tasks_q, results_q, restore) -> None:
    """The worker process: any exception goes to the trainer on the result queue, named, then the worker exits."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle: it stops its workers
    try:
        Worker(index, rank, cfg_dict, policy, board, tasks_q, results_q, restore).run()
    except Exception as err:
        last = traceback.format_exc().strip().splitlines()[-3:-1]
        results_q.put(("error", index, f"{type(err).__name__}: {err}", " | ".join(s.strip() for s in last)))


class Worker:
    def __init__(self, index, rank, cfg_dict, policy, board, tasks_q, results_q, restore):
        import dataclasses

        from lrl.config import Config
        from lrl.envs import FailureInjection, make_env
        from lrl.run import run_tokenizer
        from samplers import make_sampler

        torch.set_num_threads(1)
        self.index = index
        self.rank = rank
        self.board = board
        self.tasks_q = tasks_q
        self.results_q = results_q
        self.parent = os.getppid()
        self.cfg = Config(**cfg_dict)
        spec = make_env(self.cfg, run_tokenizer(self.cfg))
        rate, hazard = self.cfg.env_failure_rate, self.cfg.env_failure_hazard
        env_gen = torch.Generator().manual_seed(batch_seed(self.cfg.seed + 2, rank, index))
        self.spec = dataclasses.replace(
            spec,
            make=lambda: FailureInjection(spec.make(), rate, hazard, env_gen if rate or hazard else None),
        )
        self.env_generator = env_gen
        self.shadow = policy.eval()  # the trainer's weights as published, in fp32
        self.sampler = make_sampler(self.cfg.replace(lag=0), self.spec.tok)
        self.version = -1
        self.generator = torch.Generator().manual_seed(batch_seed(self.cfg.seed, rank, 10_000 + index))
        self.groups: dict[int, list[int]] = {}  # group serial -> keys of its episodes in the rollout
        self.started: dict[int, float] = {}  # group serial -> when it started (its generation time)
        self.pending: list[list[tuple]] = []  # units not started yet: each a list of (serial, task, n)
        self.batches: list[tuple] = []  # deterministic: (batch, start version, groups) not started yet
        self.batch = None  # deterministic: (batch, start version, groups) being generated
        self.rollout = None
        self.idle = self.busy = 0.0
        self.stopping = False
        self.last_beat = time.time()
        self.restore = restore

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        if self.restore is not None:
            self._restore(self.restore)
        elif not self.cfg.deterministic:
            self._switch_to(self.board.version)
        while not self.stopping:
            self._messages(block=self._has_nothing_to_do())
            if self.stopping:
                break
            start = time.perf_counter()
            if self.cfg.deterministic:
                self._deterministic_step()
            else:
                self._free_step()
            self.busy += time.perf_counter() - start
            self._beat()

    def _has_nothing_to_do(self) -> bool:
        if self.cfg.deterministic:
            return self.batch is None and not self.batches
        return not self.groups and not self.pending

    def _free_step(self) -> None:
        r = self.rollout
        if r is None or r.between_turns:
            if r is not None:
                finished = [s for s, keys in self.groups.items() if all(r.episodes[k].done for k in keys)]
                for serial in finished:
                    seconds = time.time() - self.started.pop(serial, time.time())
                    self.results_q.put(
                        ("group", self.index, serial, r.take(self.groups.pop(serial)), seconds)
                    )
            newer = self.board.version > self.version
            drain = self.cfg.partial_rollouts == "drain"
            if newer and (not drain or not self.groups):
                self._switch_to(self.board.version)
            if self.pending and not self.groups:
                self._start_unit()
        elif self.cfg.partial_rollouts == "interrupt" and self.board.version > self.version:
            self._switch_to(self.board.version)
        if self.rollout is not None and not self.rollout.done:
            self.rollout.advance()

    def _start_unit(self) -> None:
        """Start the next unit: its groups in a new rollout, on the weights the worker holds now."""
        from lrl.rollout import Rollout

        decoder = self.sampler.decoder()
        self.rollout = Rollout(decoder, self.spec, [], self.generator, self.sampler.sampling, self.version)
        now = time.time()
        for serial, task, n in self.pending.pop(0):
            self.groups[serial] = self.rollout.add([task] * n)
            self.started[serial] = now

    def _switch_to(self, version: int) -> None:
        """Load `version` from the board (the newest when free-running, exactly it when deterministic)."""
        if self.cfg.deterministic:
            self.board.wait_for(self.shadow, version, self.parent_alive)
        elif not self.board.read(self.shadow, version):
            return  # a write was in progress: try again at the next boundary
        self.version = version
        if self.sampler.policy is None:
            self.sampler.setup(self.shadow, version)
        else:
            self.sampler.sync(self.shadow, version)
        if self.rollout is not None:
            self.rollout.switch(version)

    def _deterministic_step(self) -> None:
        from lrl.rollout import Rollout

        if self.batch is None:
            if not self.batches:
                return
            self.batch = self.batches.pop(0)
            b, v0, groups = self.batch
            self._switch_to(v0)
            generator = torch.Generator().manual_seed(batch_seed(self.cfg.seed, self.rank, b))
            self.rollout = Rollout(
                self.sampler.decoder(), self.spec, [], generator, self.sampler.sampling, v0
            )
            self.groups = {serial: self.rollout.add([task] * n) for serial, task, n in groups}
            self.tokens = 0
            self.batch_started = time.time()
        b, v0, _ = self.batch
        every = self.cfg.switch_tokens
        if self.cfg.partial_rollouts == "interrupt" and self.tokens and self.tokens % every == 0:
            scheduled = min(v0 + self.tokens // every, max(b - 1, v0))
            if scheduled > self.version:
                self._switch_to(scheduled)
        if not self.rollout.between_turns or not self.rollout.done:
            self.rollout.advance()
            self.tokens += 1
        if self.rollout.done:
            episodes = {serial: self.rollout.take(keys) for serial, keys in self.groups.items()}
            self.results_q.put(("batch", self.index, b, episodes, time.time() - self.batch_started))
            self.batch, self.rollout, self.groups = None, None, {}

    # -- messages -----------------------------------------------------------------------------------------
    def _messages(self, block: bool) -> None:
        while True:
            start = time.perf_counter()
            try:
                msg = self.tasks_q.get(timeout=BEAT) if block else self.tasks_q.get_nowait()
            except queue.Empty:
                if not block:
                    return
                self.idle += time.perf_counter() - start
                self._beat()
                if not self.parent_alive():
                    self.stopping = True
                    return
                continue
            if block:
                self.idle += time.perf_counter() - start
            kind = msg[0]
            if kind == "work":
                self.pending.append(msg[1])
            elif kind == "batch":
                self.batches.append(msg[1:])
            elif kind == "pause":
                self._pause()
            elif kind == "stop":
                self.stopping = True
            if kind in ("work", "batch", "stop"):
                return

    def _pause(self) -> None:
        """Answer a checkpoint's pause, at this token boundary, with the whole state; then wait to go on."""
        self.results_q.put(("state", self.index, self.state()))
        while True:
            msg = self.tasks_q.get()
            if msg[0] == "resume":
                return
            if msg[0] == "stop":
                self.stopping = True
                return

    def state(self) -> dict:
        return {
            "rollout": self.rollout.state() if self.rollout is not None else None,
            "groups": self.groups,
            "pending": self.pending,
            "batches": self.batches,
            "batch": self.batch,
            "tokens": getattr(self, "tokens", 0),
            "version": self.version,
            "generator": self.generator.get_state(),
            "env_generator": self.env_generator.get_state(),
        }

    def _restore(self, state: dict) -> None:
        from lrl.rollout import Rollout

        self.generator.set_state(state["generator"])
        self.env_generator.set_state(state["env_generator"])
        self.groups, self.pending, self.batches = state["groups"], state["pending"], state["batches"]
        self.batch, self.tokens = state["batch"], state["tokens"]
        self._switch_to(state["version"] if self.cfg.deterministic else self.board.version)
        if state["rollout"] is not None:
            self.rollout = Rollout.restore(
                state["rollout"], self.sampler.decoder(), self.spec, self.sampler.sampling
            )
            if not self.cfg.deterministic:
                self.rollout.generator = self.generator
            self.rollout.switch(self.version)

    # -- health -----------------------------------------------------------------------------------------
    def parent_alive(self) -> bool:
        return os.getppid() == self.parent

    def _beat(self) -> None:
        now = time.time()
        if now - self.last_beat >= BEAT:
            self.results_q.put(("beat", self.index, {"idle": self.idle, "busy": self.busy}))
            self.last_beat = now
            if not self.parent_alive():
                self.stopping = True
