"""The pipeline's self-contained pieces on their own, against hand-worked sequences: the controller's two
schedules, the shared-memory board under concurrent readers, the liveness rule and the fault paths of the local
and thread backends (with fake processes), the engine's admission rule, and the work a mode's saved state holds."""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest
import torch

from lrl.errors import WorkerError
from lrl.pipeline.backends.base import STARTUP_SECONDS, Liveness
from lrl.pipeline.backends.shared_board import WeightBoard
from lrl.pipeline.messages import BatchDone, Failed, Group, GroupDone, Stop, Work
from lrl.pipeline.schedule import DeterministicSchedule, FreeSchedule


# -- the controller's schedules -------------------------------------------------------------------------
def groups_of(serials: list[int]) -> list[Group]:
    return [Group(s, s % 5, 2) for s in serials]


def free_schedule():
    """4 groups a batch, 2 episodes a group, 2 workers, bound 1, lockstep (slots 0)."""
    return FreeSchedule(4, 2, 2, 1, 0)


def test_the_free_schedule_splits_batches_round_robin_and_throttles_to_the_bound():
    schedule = free_schedule()
    sent = []
    batch = iter(range(10))

    def new_groups():
        b = next(batch)
        return groups_of(list(range(4 * b, 4 * b + 4)))

    schedule.issue(
        0, new_groups, lambda w, work: sent.append((w, [g.serial for g in work.groups], work.batch))
    )
    # version 0, bound 1: batches 0 and 1 (the throttle: (v + 1 + eta) batches), each split 0,2 / 1,3
    assert sent == [(0, [0, 2], 0), (1, [1, 3], 0), (0, [4, 6], 1), (1, [5, 7], 1)]
    assert schedule.held == [8, 8]  # episodes each worker holds
    schedule.issue(0, new_groups, lambda w, work: sent.append(w))
    assert len(sent) == 4  # nothing more at version 0
    schedule.issue(1, new_groups, lambda w, work: sent.append(w))
    assert len(sent) == 4  # version 1 allows a third batch, but each worker holds its capacity (8)


def test_the_free_schedule_takes_the_oldest_finished_groups_whatever_their_batch():
    schedule = free_schedule()
    for serial, worker in [(5, 1), (0, 0), (2, 0), (7, 1), (1, 1)]:
        schedule.accept(GroupDone(worker, serial, ["e", "e"], float(serial)))
    assert schedule.take() == [(5, ["e", "e"]), (0, ["e", "e"]), (2, ["e", "e"]), (7, ["e", "e"])]
    assert schedule.take() is None  # one finished group left: not a batch
    assert schedule.queued == 2 and schedule.seconds[7] == 7.0


def test_the_deterministic_schedule_sends_whole_batches_on_their_version_and_takes_them_in_order():
    schedule = DeterministicSchedule(2, 2, 2, 1, 0)
    sent = []
    counter = iter(range(100))
    schedule.issue(
        2, lambda: groups_of([next(counter), next(counter)]), lambda w, work: sent.append((w, work))
    )
    # version 2, bound 1: batches 0..3; batch b to worker b mod 2, on version max(0, b - 1)
    assert [(w, work.batch, work.start_version) for w, work in sent] == [
        (0, 0, 0),
        (1, 1, 0),
        (0, 2, 1),
        (1, 3, 2),
    ]
    schedule.accept(BatchDone(1, 1, {2: ["b"], 3: ["b"]}, 1.0))
    assert schedule.take() is None  # batch 1 is done, but batch 0 comes first
    schedule.accept(BatchDone(0, 0, {1: ["a"], 0: ["a"]}, 1.0))
    assert schedule.take() == [(0, ["a"]), (1, ["a"])]
    assert schedule.take() == [(2, ["b"]), (3, ["b"])]


@pytest.mark.parametrize("kind", ["free", "deterministic"])
def test_a_schedules_state_comes_back_whole(kind):
    from lrl.episode import Episode

    task = type("T", (), {"task_id": 3})()
    episode = Episode(task, [1, 2, 3])
    schedule = free_schedule() if kind == "free" else DeterministicSchedule(2, 1, 2, 1, 0)
    schedule.issue(0, lambda: groups_of([0, 1, 2, 3][: schedule.groups_per_batch]), lambda w, work: None)
    if kind == "free":
        schedule.accept(GroupDone(0, 0, [episode], 2.5))
    else:
        schedule.accept(BatchDone(0, 0, {0: [episode], 1: [episode]}, 2.5))
    state = schedule.state_dict()
    again = free_schedule() if kind == "free" else DeterministicSchedule(2, 1, 2, 1, 0)
    again.load_state_dict(state, lambda saved: Episode.from_state(saved, task))
    assert again.state_dict() == state


def test_a_checkpoint_from_before_the_groups_out_were_kept_counts_the_unconsumed_unfinished_as_out():
    schedule = free_schedule()
    schedule.issue(0, lambda: groups_of([0, 1, 2, 3]), lambda w, work: None)
    schedule.accept(GroupDone(1, 1, [], 1.0))
    state = schedule.state_dict()
    del state["owner"]  # as an older checkpoint has it
    again = free_schedule()
    again.load_state_dict(state, lambda saved: saved, unconsumed=[0, 1, 3])  # group 2 was trained
    assert again.owner == {0: 0, 3: 0}  # neither trained nor finished: out, on a worker not recorded


# -- the shared-memory board ---------------------------------------------------------------------------
def filled(value: float) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def test_readers_never_load_a_mix_of_two_versions_while_the_trainer_publishes():
    board = WeightBoard(filled(0.0), 0, copies=1)
    seen: list[list[int]] = [[], [], []]
    mixed: list[set] = []
    stop = threading.Event()

    def reader(mine: list[int]):
        model, known = filled(-1.0), -1
        while not stop.is_set():
            version = board.read_newest(model, known)
            if version is None:
                continue
            values = {float(v) for p in model.parameters() for v in p.detach().flatten()[::97]}
            if values != {float(version)}:
                mixed.append(values)
            mine.append(version)
            known = version

    threads = [threading.Thread(target=reader, args=(mine,)) for mine in seen]
    for t in threads:
        t.start()
    for version in range(1, 300):
        board.publish(filled(float(version)), version)
    time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert not mixed, mixed[:3]
    assert all(mine and mine == sorted(mine) for mine in seen)  # each reader's versions only go forward
    assert board.version == 299


def test_an_exact_version_is_waited_for_and_one_that_is_gone_is_an_error():
    board = WeightBoard(filled(0.0), 0, copies=2)
    model = filled(-1.0)
    beats = []

    def publish_later():
        time.sleep(0.1)
        board.publish(filled(1.0), 1)

    threading.Thread(target=publish_later).start()
    board.wait_for(model, 1, alive=lambda: beats.append(1) or True)
    assert float(next(model.parameters()).detach().flatten()[0]) == 1.0 and beats  # it beat while it waited
    for version in (2, 3):
        board.publish(filled(float(version)), version)
    with pytest.raises(RuntimeError, match="version 1 is gone"):
        board.wait_for(model, 1)
    assert sorted(board.kept()) == [2, 3]
    with pytest.raises(RuntimeError, match="went away"):
        board.wait_for(model, 9, alive=lambda: False)


# -- liveness and the backends' fault paths -------------------------------------------------------------
def test_the_silence_rule_gives_a_starting_worker_the_startup_time():
    liveness = Liveness(timeout=2.0)
    liveness.reset(2)
    now = time.monotonic()
    assert not liveness.silent(0, now + 3.0)  # not started: STARTUP_SECONDS
    assert liveness.silent(0, now + STARTUP_SECONDS + 1)
    liveness.heard_from(1)
    assert liveness.silent(1, time.monotonic() + 2.5) and not liveness.silent(1, time.monotonic() + 1.0)
    error = liveness.silence_error(1, "rollout worker 1 (pid 7)", "process is sleeping")
    assert str(error) == (
        "rollout worker 1 (pid 7) sent no heartbeat for 2 s (--worker-timeout); its process is sleeping"
    )


class FakeProcess:
    def __init__(self, alive=True, exitcode=None, pid=4242):
        self.alive, self.exitcode, self.pid = alive, exitcode, pid
        self.killed = False

    def is_alive(self):
        return self.alive and not self.killed

    def kill(self):
        self.killed = True

    terminate = kill

    def join(self, timeout=None):
        pass


class FakeQueue:
    def __init__(self, items=()):
        self.items = deque(items)

    def put(self, item):
        self.items.append(item)

    def get(self, timeout=None):
        import queue

        if not self.items:
            raise queue.Empty
        return self.items.popleft()

    def get_nowait(self):
        return self.get()

    def cancel_join_thread(self):
        pass

    def close(self):
        pass


def local_workers(procs, outbox=()):
    from lrl.pipeline.backends.local import LocalWorkers

    workers = LocalWorkers(timeout=1.0)
    workers.procs = list(procs)
    workers.inboxes = [FakeQueue() for _ in procs]
    workers.outbox = FakeQueue(outbox)
    workers.liveness.reset(len(procs))
    return workers


def test_a_dead_worker_process_is_named_with_its_signal_and_every_worker_is_stopped():
    alive = FakeProcess()
    workers = local_workers([alive, FakeProcess(alive=False, exitcode=-9, pid=77)])
    with pytest.raises(WorkerError, match=r"rollout worker 1 \(pid 77\) died: killed by SIGKILL"):
        workers.check()
    assert alive.killed and not workers.running  # the live one was ended, the workers closed


def test_a_dead_worker_that_reported_its_error_is_named_with_the_error():
    failed = Failed(1, "RuntimeError: boom", "env.py:3")
    workers = local_workers([FakeProcess(), FakeProcess(alive=False, exitcode=1)], outbox=[failed])
    with pytest.raises(WorkerError, match=r"rollout worker 1 failed: RuntimeError: boom \(at env.py:3\)"):
        workers.check()


def test_a_silent_worker_process_is_killed_and_named():
    hung = FakeProcess(pid=99)
    workers = local_workers([hung])
    workers.liveness.heard_from(0)
    workers.liveness.heard[0] -= 5.0  # last heard 5 s ago, with a timeout of 1 s
    with pytest.raises(WorkerError, match=r"rollout worker 0 \(pid 99\) sent no heartbeat for 1 s"):
        workers.check()
    assert hung.killed


def test_a_failed_message_closes_the_workers_and_names_the_worker():
    workers = local_workers([FakeProcess()], outbox=[Failed(0, "ValueError: x", "here")])
    with pytest.raises(WorkerError, match=r"rollout worker 0 failed: ValueError: x \(at here\)"):
        workers.receive(0.01)
    assert not workers.running


def ended_thread_workers():
    """Thread workers whose one worker thread has already ended."""
    from lrl.pipeline.backends.thread import ThreadWorkers

    workers = ThreadWorkers(timeout=5.0)
    workers.threads = [threading.Thread(target=lambda: None)]
    workers.inboxes = [FakeQueue()]
    workers.liveness.reset(1)
    workers.threads[0].start()
    workers.threads[0].join()
    return workers


def test_a_worker_thread_that_ends_without_a_word_is_one_line():
    workers = ended_thread_workers()
    with pytest.raises(WorkerError, match=r"rollout worker 0 \(thread\) ended without reporting an error"):
        workers.check()


@pytest.mark.parametrize("backend", ["local", "thread"])
def test_a_failure_read_with_the_waiting_messages_is_named_with_its_error(backend):
    """The periodic check first reads what waited in the queue, then judges the workers: a worker that reported
    its error and ended is named with that error, not as one that ended without a word."""
    failed = Failed(0, "RuntimeError: the environment broke", "env.py:7")
    if backend == "local":
        workers = local_workers([FakeProcess(alive=False, exitcode=1)], outbox=[failed])
    else:
        workers = ended_thread_workers()
        workers.outbox.put(failed)
    workers._checked = time.monotonic() - 3600  # the check is due: receive reads the queue before judging
    with pytest.raises(WorkerError, match=r"rollout worker 0( \(thread\))? failed: RuntimeError: the environment"):
        workers.receive(0.01)


def test_closing_thread_workers_sends_stop_and_waits_for_them():
    from lrl.pipeline.backends.thread import ThreadWorkers

    workers = ThreadWorkers(timeout=5.0)
    inbox = FakeQueue()
    stopped = threading.Event()

    def loop():
        while True:
            if any(isinstance(m, Stop) for m in inbox.items):
                stopped.set()
                return
            time.sleep(0.01)

    workers.threads = [threading.Thread(target=loop, daemon=True)]
    workers.inboxes = [inbox]
    workers.threads[0].start()
    workers.close()
    assert stopped.is_set() and not workers.running


# -- the engine's admission rule and a mode's held work -------------------------------------------------
def test_the_admission_rule_fills_slots_or_waits_for_the_whole_lockstep_turn():
    from lrl.rollout import Rollout

    rollout = Rollout.__new__(Rollout)  # only its slots matter here
    rollout.slots = {}
    assert rollout.room(4) == 4 and rollout.room(0) > 10**9  # nothing in flight
    rollout.slots = {0: None, 1: None, 2: None}
    assert rollout.room(4) == 1 and rollout.room(2) == 0
    assert rollout.room(0) == 0  # lockstep: nothing joins a turn in progress


def test_each_mode_reads_the_work_its_own_state_holds():
    import dataclasses

    from lrl.pipeline.worker.modes import held_work

    unit = dataclasses.asdict(Work([Group(8, 1, 2)], 4))
    free = {"units": [unit], "groups": {"done": {}, "elapsed": {5: 1.0}, "tasks": {5: 3, 6: 0}}}
    assert held_work(False, 2, free) == [
        Work([Group(5, 3, 2), Group(6, 0, 2)], -1),
        Work([Group(8, 1, 2)], 4),
    ]
    current = dataclasses.asdict(Work([Group(0, 2, 2)], 0, 0))
    deterministic = {
        "current": {"work": current},
        "batches": [dataclasses.asdict(Work([Group(1, 1, 2)], 1, 0))],
    }
    assert held_work(True, 2, deterministic) == [
        Work([Group(0, 2, 2)], 0, 0),
        Work([Group(1, 1, 2)], 1, 0),
    ]
    assert held_work(True, 2, None) == []
    old = {"units": [], "groups": {"done": {}, "elapsed": {5: 1.0}}}  # before groups recorded their tasks
    assert held_work(False, 2, old) is None
