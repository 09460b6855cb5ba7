"""A rollout worker's process shell: configuration, its copy of the weights, messages, heartbeats.

Its configuration is the one the trainer's preflight resolved (a named model's folder, not its name), taken as it
is: a worker neither checks nor resolves it again (:meth:`lrl.config.Config.resolved`).

Started by a backend (a spawned process: :mod:`lrl.pipeline.backends.spawn`; a thread; a Ray actor); its first
message is its :class:`~lrl.pipeline.messages.Setup`. The worker runs one :class:`lrl.rollout.Rollout` (the same
episode loop as the synchronous pipeline): up to ``--slots`` episodes in flight, all those generating decoded in
one batched step per token, environment steps on the tool runner (:mod:`lrl.envs.workers`), so the engine
decodes while tools run. What it runs, and when it loads new weights, is its scheduling mode
(:mod:`lrl.pipeline.worker.free`, :mod:`lrl.pipeline.worker.deterministic`), which also owns its checkpoint
format. A :class:`~lrl.pipeline.messages.Pause` (a checkpoint) is answered at a token boundary with the mode's
whole state as plain data; the worker then waits for Resume or Stop.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback

import torch

from lrl.pipeline.messages import (
    Beat,
    Cut,
    CutDone,
    Failed,
    Pause,
    Paused,
    Resume,
    Setup,
    Stop,
    Work,
    WorkerStats,
)
from lrl.pipeline.worker.modes import mode_class
from lrl.streams import ENV_FAILURES, batch_seed, stream_seed

BEAT = 0.2  # seconds between heartbeats


def shadow_model(setup: Setup):
    """A worker's copy of the model (its initialisation, overwritten by the board's weights, leaves the global
    generator as it was)."""
    with torch.random.fork_rng(devices=[]):
        return setup.model_class(setup.model_config).float().eval()


class Stopping(Exception):
    """The trainer asked the worker to stop while it waited (for weights)."""


def worker_main(trainer: int | None, index: int, inbox, outbox) -> None:
    """A worker's life: any exception goes to the trainer, named, and the worker ends. `trainer` is the pid the
    worker's parent process must be (it stops when that one is gone); None for a worker that runs in the
    trainer's own process (a thread), which lives exactly as long as the trainer."""
    try:
        setup = inbox.get()
        Worker(trainer, index, setup, inbox, outbox).run()
    except Stopping:
        return
    except BaseException as err:  # noqa: BLE001 (whatever stops the worker is reported before it exits)
        lines = traceback.format_exc().strip().splitlines()
        where = " | ".join(s.strip() for s in lines[-3:-1])
        outbox.put(Failed(index, f"{type(err).__name__}: {err}", where))


class Worker:
    """The process shell: configuration, weights, messages, heartbeats; its mode decides what runs when."""

    def __init__(self, trainer: int | None, index: int, setup: Setup, inbox, outbox):
        from lrl.envs import make_env, run_tokenizer
        from lrl.samplers import make_sampler

        if trainer is not None:  # a process of its own; in the trainer's process the threads are the trainer's
            torch.set_num_threads(int(setup.cfg.worker_threads))
        self.trainer = trainer
        self.index = index
        self.rank = setup.rank
        self.board = setup.board
        self.inbox = inbox
        self.outbox = outbox
        self.cfg = setup.cfg  # checked and resolved once, by the trainer's preflight; rebuilt on its way here
        self.world = setup.world
        self.spec = make_env(self.cfg, run_tokenizer(self.cfg.policy))
        self.env_generator = torch.Generator().manual_seed(
            batch_seed(stream_seed(self.cfg.run.seed, ENV_FAILURES), self.rank, index)
        )
        self.failing_spec = self._failing_spec()
        self.tasks = list(self.spec.train_tasks)
        self.task_ids = {t.task_id: t for t in self.tasks}
        self.shadow = setup.shadow if setup.shadow is not None else shadow_model(setup)
        self.sampler = make_sampler(self.cfg, self.spec.tok)
        self.version = -1
        self.stats = WorkerStats()
        self.stopping = False
        self.last_beat = 0.0
        self._snapshot: WorkerStats | None = None  # the totals of the last beat, for the keep-alive thread
        self._done = False
        self.mode = mode_class(self.cfg.rollout.deterministic)(self)
        if setup.restore is not None:
            self.mode.restore(setup.restore)
        else:
            self.mode.begin()

    def _failing_spec(self):
        """The env spec whose envs inject the run's worker failures (drawn from the worker's env generator)."""
        from lrl.envs import FailureInjection

        rate = self.cfg.environment.env_failure_rate
        hazard = self.cfg.environment.env_failure_hazard
        generator = self.env_generator if rate or hazard else None
        make = self.spec.make
        return dataclasses.replace(self.spec, make=lambda: FailureInjection(make(), rate, hazard, generator))

    # -- weights ----------------------------------------------------------------------------------------
    def load(self, version: int | None) -> bool:
        """Load `version` from the board (None: the newest, if newer than what is held) -> whether it did.

        An exact version is waited for (a deterministic schedule may ask for one the trainer has not published
        yet); the worker keeps beating while it waits."""
        start = time.perf_counter()
        if version is None:
            newest = self.board.read_newest(self.shadow, self.version)
            if newest is None:
                return False
            version = newest
        else:
            try:
                self.board.wait_for(self.shadow, version, self._waiting)
            except RuntimeError:
                if self.stopping:
                    raise Stopping from None
                raise
        if self.sampler.policy is None:
            self.sampler.setup(self.shadow, version)
        else:
            self.sampler.sync(self.shadow, version)
        self.version = version
        self.stats.switches += 1
        self.stats.switch_seconds += time.perf_counter() - start
        return True

    def _waiting(self) -> bool:
        """While waiting for weights: beat, and answer a checkpoint's Pause (the trainer cannot publish the
        version waited for before its checkpoint is written)."""
        self.beat()
        self.messages(block=False)
        return self.parent_alive() and not self.stopping

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> None:
        alive = threading.Thread(target=self._keep_alive, name=f"lrl-worker-{self.index}-alive", daemon=True)
        alive.start()
        try:
            self._loop()
        except Stopping:
            pass
        finally:
            self._done = True
        self.mode.close()

    def _keep_alive(self) -> None:
        """Beat for the worker while one step of its work runs long (a real model's prefill of a whole batch on
        one thread takes tens of seconds): the last totals again, so the trainer hears a live process whatever
        it decodes. A process that is stopped or dead beats no more, on either thread."""
        while not self._done and not self.stopping:
            time.sleep(BEAT)
            snapshot = self._snapshot
            if snapshot is not None and time.monotonic() - self.last_beat > 2 * BEAT:
                try:
                    self.outbox.put(Beat(self.index, snapshot, []))
                except (OSError, ValueError):  # the queue is closed: the worker is ending
                    return

    def _loop(self) -> None:
        while not self.stopping:
            self.messages(block=self.mode.idle())
            if self.stopping:
                break
            start = time.perf_counter()
            self.mode.step()
            self.stats.busy += time.perf_counter() - start
            self.beat()

    def messages(self, block: bool) -> None:
        """Take the messages waiting (with `block`, wait for one, beating meanwhile)."""
        import queue

        while True:
            start = time.perf_counter()
            try:
                message = self.inbox.get(timeout=BEAT) if block else self.inbox.get_nowait()
            except queue.Empty:
                if not block:
                    return
                self.stats.idle += time.perf_counter() - start
                self.beat()
                if self.stopping:
                    return
                continue
            if block:
                self.stats.idle += time.perf_counter() - start
            if isinstance(message, Work):
                self.mode.accept(message)
                block = False
            elif isinstance(message, Cut):
                self.send(CutDone(self.index, self.mode.cut_groups(message.serials)))
            elif isinstance(message, Pause):
                self.pause()
            elif isinstance(message, Stop):
                self.stopping = True
                return

    def pause(self) -> None:
        """Answer a checkpoint's pause, at this token boundary, with the whole state; then wait to go on."""
        self.outbox.put(Paused(self.index, self.mode.state()))
        while True:
            message = self.inbox.get()
            if isinstance(message, Resume):
                return
            if isinstance(message, Stop):
                self.stopping = True
                return

    # -- health -----------------------------------------------------------------------------------------
    def parent_alive(self) -> bool:
        return self.trainer is None or os.getppid() == self.trainer

    def beat(self) -> None:
        now = time.monotonic()
        if now - self.last_beat < BEAT:
            return
        self.last_beat = now
        self.stats.slot_seconds = self.mode.slot_seconds()
        self.stats.capacity_seconds = self.mode.capacity_seconds()
        for name, value in self.mode.phase_seconds().items():
            setattr(self.stats, name, value)
        rollout = self.mode.rollout
        timeline = rollout.take_timeline() if rollout is not None else []
        self._snapshot = dataclasses.replace(self.stats)
        self.outbox.put(Beat(self.index, dataclasses.replace(self.stats), timeline))
        if not self.parent_alive():
            self.stopping = True

    def send(self, message) -> None:
        """Send a result, after a heartbeat with up-to-date totals (so a step's metrics see its own work)."""
        self.last_beat = 0.0
        self.beat()
        self.outbox.put(message)
