"""The simulator models' pieces on their own, against hand-worked cases: the event model's controller, workers and
trainer (lrl_lab.sim.event, lrl_lab.sim.event_state) one method at a time, and the windowed model's array pieces
(lrl_lab.sim.windowed_state). The whole models are checked in test_board_sim.py, test_load_model.py and
test_windowed.py."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from lrl_lab.sim.event import EventModel
from lrl_lab.sim.event_state import Episode, Groups, Tally
from lrl_lab.sim.windowed_state import Chunks, Ring, Rows, Worker


def model(**kw) -> EventModel:
    """The duration model: 2 groups of 2 a batch, bound 1, 1 s episodes and steps, no switch cost, one worker."""
    s = dict(durs=[1.0], episodes=None, n_slots=2, group_size=2, groups_per_batch=2, train_time=1.0,
             switch_time=0.0, max_staleness=1, interrupt=True, steps=2, workers=1, drop=True, sync_before=False,
             engine=None, co_run=1.0, trace=None, release="group", slice_s=0.0, policy="drop", tool_servers=None,
             patience=math.inf)  # fmt: skip
    s.update(kw)
    args = [s.pop(k) for k in ("durs", "episodes", "n_slots", "group_size", "groups_per_batch", "train_time",
                               "switch_time", "max_staleness", "interrupt", "steps")]  # fmt: skip
    return EventModel(*args, **s)


def running(m: EventModel, w: int, group: int, version: int, start: float = 0.0) -> Episode:
    """An episode of `group` in flight on worker `w`, started at `start` on `version`."""
    ep = Episode(m.started, group, 1.0, start, start + 1.0, version)
    m.started += 1
    m.pool[w].running[ep.index] = ep
    return ep


# -- the event model ------------------------------------------------------------------------------------
def test_the_controller_issues_what_the_throttle_and_each_workers_capacity_allow():
    m = model(workers=2, n_slots=1)  # a unit: 1 group of 2 episodes; a worker holds its slot and a unit: 4
    m.issue()
    assert m.issued_batches == 2  # version 0, bound 1: two batches
    assert [list(w.queue) for w in m.pool] == [[0, 0, 2, 2], [1, 1, 3, 3]]  # round robin, an entry an episode
    assert [w.held for w in m.pool] == [4, 4] and m.groups.worker == {0: 0, 1: 1, 2: 0, 3: 1}
    m.version = 5
    m.issue()
    assert m.issued_batches == 2  # the throttle would allow more; the workers are full


def test_the_groups_close_in_the_order_they_finish_and_keep_the_order_of_those_not_taken():
    groups = Groups()
    for g in range(4):
        groups.open(g, g % 2, 2)
    assert groups.close(2) == 0 and groups.close(1) == 1 and groups.close(3) == 1
    assert list(groups.finished) == [2, 1, 3] and groups.left == {0: 2} and groups.worker == {0: 0}
    groups.keep_unchosen([1])
    assert list(groups.finished) == [2, 3]


def test_the_tally_grows_its_histograms_as_older_work_comes():
    tally = Tally()
    tally.add(2, 0.5)
    tally.add(0, 1.0)
    tally.episode(1)
    tally.wasted(3.0)
    assert tally.hist == [1.0, 0.0, 0.5] and tally.ep_hist == [0, 1]
    assert tally.tokens == {"decoded": 3.0, "wasted": 3.0, "masked": 0.0}


def finish_groups(m: EventModel, groups: dict[int, list[int]]) -> None:
    """Groups finished in this order, each with episodes started on the given versions."""
    for g, versions in groups.items():
        m.groups.open(g, 0, len(versions))
        m.groups.episodes[g] = [Episode(i, g, 1.0, 0.0, 1.0, v) for i, v in enumerate(versions)]
        m.groups.left[g] = 0
        m.groups.close(g)


def test_the_policies_choose_the_groups_of_a_batch():
    # the model's schedule asks the pipeline's policy object (lrl_lab.sim.policy): its choice, in its order
    fifo = model()
    finish_groups(fifo, {3: [2, 2], 1: [0, 2], 2: [1, 1]})
    assert fifo.schedule.take() == [3, 1] and list(fifo.groups.finished) == [2]
    oldest = model(policy="oldest-first")
    finish_groups(oldest, {3: [2, 2], 1: [0, 2], 2: [1, 1]})
    assert oldest.schedule.take() == [1, 2] and list(oldest.groups.finished) == [3]  # oldest episodes first
    ordered = model(policy="ordered")
    finish_groups(ordered, {3: [2, 2], 1: [0, 2], 2: [1, 1]})
    assert ordered.schedule.take() == [1, 2] and list(ordered.groups.finished) == [3]  # the earliest issued


def test_ordered_waits_for_an_earlier_group_then_cuts_those_half_finished():
    m = model(policy="ordered", patience=2.0)
    finish_groups(m, {2: [0, 0], 3: [0, 0]})
    m.groups.open(0, 0, 2)  # issued before them: one of its two episodes finished, the other in flight
    m.groups.left[0] = 1
    m.groups.episodes[0] = [Episode(90, 0, 1.0, 0.0, 1.0, 0)]
    running(m, 0, 0, 0)
    m.groups.open(1, 0, 2)  # none of its episodes finished, one waits in the queue
    m.pool[0].queue.append(1)
    m.pool[0].held = 4
    assert m.schedule.take() is None and m.policy.wakes() == 2.0  # it waits, from now (t = 0) for 2 s
    m.t = 1.5
    assert m.schedule.take() is None
    m.t = 2.0
    assert m.schedule.take() == [0, 2]  # group 0 was sent without its straggler; group 1 is not waited for
    assert m.tally.cut == 1 and m.groups.left == {1: 2} and not m.pool[0].running and m.policy.wakes() is None
    assert list(m.groups.finished) == [3] and m.pool[0].held == 2  # group 0 no longer held


def test_abort_stops_the_episodes_past_the_bound_and_starts_their_tasks_again_first():
    m = model(policy="abort")
    m.version = 3
    old, fresh = running(m, 0, 7, 1), running(m, 0, 8, 2)
    m.pool[0].queue = deque([9])
    m.t = 0.5
    assert m.abort_stale(m.pool[0], 0.5, m.version) == 1
    assert list(m.pool[0].running) == [fresh.index] and list(m.pool[0].queue) == [old.group, 9]
    assert m.tally.aborted == 1 and m.tally.launched == [0.5]
    assert m.tally.tokens["wasted"] == 0.5  # half its unit of work, decoded and lost


def test_cut_sends_a_group_at_its_last_version_when_half_has_finished():
    m = model(policy="cut")
    m.groups.open(5, 0, 2)
    m.groups.left[5] = 1
    m.groups.episodes[5] = [Episode(0, 5, 1.0, 0.0, 1.0, 1)]
    running(m, 0, 5, 1)
    m.pool[0].held = 2
    assert m.cut_short(m.pool[0], 0.0, 1) == 0 and m.tally.cut == 0  # version 1 is not its last (1 + eta)
    assert m.cut_short(m.pool[0], 0.0, 2) == 1
    assert m.tally.cut == 1 and list(m.groups.finished) == [5] and m.pool[0].held == 0


@pytest.mark.parametrize("policy, trained, dropped, masked", [("drop", 1, 1, 0.0), ("mask", 2, 0, 1.0)])
def test_the_trainer_drops_or_masks_what_is_past_the_bound(policy, trained, dropped, masked):
    m = model(policy=policy)
    m.version = 3
    finish_groups(m, {0: [1, 3]})  # one episode started 2 versions behind: past the bound of 1
    batch = m.screen([0])
    m.train(batch, 0.0)
    assert (m.tally.trained, m.tally.dropped) == (trained, dropped)
    assert m.tally.tokens["masked"] == masked  # the duration model: an episode is one unit of work
    # drop: the fresh one; mask: both, the old one counted at the bound (its older tokens are not trained)
    assert m.tally.ep_hist == ([1] if policy == "drop" else [1, 1])
    assert m.training_until == 1.0


# -- the windowed model's pieces ------------------------------------------------------------------------
def test_chunks_pop_every_pair_up_to_a_limit_in_key_order():
    chunks = Chunks()
    chunks.push(np.array([3.0, 1.0, 2.0]), np.array([30, 10, 20]))
    chunks.push(np.array([1.5]), np.array([15]))
    assert chunks.first() == 1.0
    keys, rows = chunks.pop(2.0)
    assert sorted(zip(keys.tolist(), rows.tolist())) == [(1.0, 10), (1.5, 15), (2.0, 20)]
    assert chunks.first() == 3.0 and chunks.pop(2.5)[1].size == 0


def test_rows_recycle_and_grow_keeping_what_they_hold():
    rows = Rows(2)
    first = rows.take(2)
    rows.start[first] = [5.0, 6.0]
    more = rows.take(3)  # more alive than planned: every column grows
    assert rows.rows >= 5 and len(set(first.tolist()) | set(more.tolist())) == 5
    assert rows.start[first].tolist() == [5.0, 6.0]
    rows.give(more[:1])
    assert rows.take(1).tolist() == more[:1].tolist()  # the row given back is the next one taken
    rows.cur_v[first[0]], rows.cur_tok[first[0]] = 4, 3.0  # started on version 0, now on 4: a 5th column
    rows.flush(first[:1])
    assert rows.span == 5 and rows.tok[first[0], 4] == 3.0 and rows.cur_tok[first[0]] == 0.0


def test_the_ring_seats_a_groups_episodes_in_turn_and_refuses_a_place_still_taken():
    ring = Ring(4, 2)
    ring.open(np.array([1, 2]), 2, 0, 2)
    ring.seat(np.array([1, 2]), np.array([10, 20]))  # the first episode of groups 1 and 2
    ring.seat(np.array([2, 1]), np.array([21, 11]))
    assert ring.rows[1].tolist() == [10, 11] and ring.rows[2].tolist() == [20, 21]
    with pytest.raises(RuntimeError, match="still in flight"):
        ring.open(np.array([2]), 2, 0, 2)
    assert ring.close(np.array([2, 1])).tolist() == [20, 21, 10, 11] and ring.left[[1, 2]].tolist() == [
        -1,
        -1,
    ]


def test_a_worker_matches_queued_episodes_to_its_free_slots_in_time():
    wk = Worker(3)
    wk.free = np.array([0.0, 2.0, 5.0])
    wk.queue.append([1.0, np.array([7, 7]), 0])  # issued at 1 s
    wk.queue.append([1.5, np.array([8, 8]), 0])
    starts, groups = wk.match(opens=0.5, limit=4.0)
    assert starts.tolist() == [1.0, 2.0] and groups.tolist() == [7, 7]  # the third slot frees after the limit
    assert wk.free.tolist() == [5.0] and [q[2] for q in wk.queue] == [0]
    starts, groups = wk.match(opens=0.5, limit=9.0)
    assert (
        starts.tolist() == [5.0] and groups.tolist() == [8] and wk.queue[0][2] == 1
    )  # one of group 8 started
    assert wk.match(opens=0.5, limit=9.0) is None  # no free slot
