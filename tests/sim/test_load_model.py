"""The load model of the pipeline simulator (episodes as turns, engines that batch their decoding) against hand
calculations, and its engine curve."""

from __future__ import annotations

import pytest

from lrl_lab.sim.board import simulate_board
from lrl_lab.sim.load import EngineCurve, parse_turns

# a step costs 0.5 s plus 0.5 s per episode decoding: 1 s alone, 1.5 s for two
SHARED = EngineCurve.linear(0.5, 0.5)


def sync_one_group(turns, curve, train=1.0):
    """One synchronous step of one group holding every episode of `turns`, on as many slots."""
    n = len(turns)
    return simulate_board(None, n, n, 1, train, 0.0, 0, True, 1, sync_before=True, turns=turns, engine=curve)


def test_two_sequences_share_their_decode_steps():
    # both decode together at 1.5 s a step: A's 2 tokens end at 3 s; B's last 2 tokens alone at 1 s: 5 s
    sim = sync_one_group([[[2, 0.0]], [[4, 0.0]]], SHARED)
    assert sim["step_ends"] == pytest.approx([6.0])  # the slowest at 5 s, then 1 s of training
    assert sim["trained_duration"] == pytest.approx((3.0 + 5.0) / 2)
    assert sim["slot_util"] == pytest.approx((3.0 + 5.0) / (2 * 6.0))


def test_a_tool_wait_overlaps_the_other_episodes_decoding():
    # A: 1 token, a 2 s tool, 1 token; B: 3 tokens. Together for A's first token (1.5 s); B goes on alone
    # (2 tokens, 1 s each) while A's tool runs, both ending at 3.5 s; then A's last token alone: 4.5 s
    sim = sync_one_group([[[1, 2.0], [1, 0.0]], [[3, 0.0]]], SHARED)
    assert sim["step_ends"] == pytest.approx([5.5])
    assert sim["trained_duration"] == pytest.approx((4.5 + 3.5) / 2)


def test_tool_calls_queue_for_a_pool_of_servers_first_come_first_served():
    # three episodes of 1 token then a 2 s tool, 1 token, decoded together (0.5 + 1.5 = 2 s a step): all three
    # call their tool at 2 s. Unlimited: the tools end at 4 s, the last tokens together by 6 s. Two servers: A
    # and B answer at 4 s, C waits for the first free server and answers at 6 s; A and B decode their last token
    # together 4-5.5 s, C alone 6-7 s
    turns = [[[1, 2.0], [1, 0.0]]] * 3
    free = sync_one_group(turns, SHARED)
    assert free["step_ends"] == pytest.approx([7.0])  # 2 + 2 + 2 (three decoding) + 1 training
    n = len(turns)
    pool = simulate_board(
        None, n, n, 1, 1.0, 0.0, 0, True, 1, sync_before=True, turns=turns, engine=SHARED, tool_servers=2
    )
    assert pool["step_ends"] == pytest.approx([8.0])  # C's last token ends at 7 s, then 1 s of training
    assert pool["trained_duration"] == pytest.approx((5.5 + 5.5 + 7.0) / 3)
    one = simulate_board(
        None, n, n, 1, 1.0, 0.0, 0, True, 1, sync_before=True, turns=turns, engine=SHARED, tool_servers=1
    )
    # one server: answers at 4, 6 and 8 s; each last token alone (1 s): A 4-5, B 6-7, C 8-9
    assert one["step_ends"] == pytest.approx([10.0])


def test_a_weight_switch_pauses_decoding_not_tools_and_splits_the_tokens():
    # groups of one, batch 1 (the oldest finished group), bound 1, 2 slots, steps of 1 s whatever the batch, training 1 s, loads 0.5 s.
    # ep0 = 1 token: ends at 1, trained 1-2. ep1 = 1 token, a 0.5 s tool, 3 tokens: decodes its second action
    # from 1.5 s; at 2 s (version 1 published) it has 0.5 token of it; the load pauses it to 2.5 s, then 2.5
    # tokens on version 1 end it at 5 s; trained 5-6 at version 1
    flat = EngineCurve.linear(1.0, 0.0)
    turns = [[[1, 0.0]], [[1, 0.5], [3, 0.0]], [[10, 0.0]]]  # ep2 (batch 2, from 2.5 s) ends after ep1
    sim = simulate_board(None, 2, 1, 1, 1.0, 0.5, 1, True, 2, turns=turns, engine=flat)
    assert sim["step_ends"] == pytest.approx([2.0, 6.0])
    # tokens: ep0 1 at staleness 0; ep1 1 + 0.5 on version 0 (staleness 1), 2.5 on version 1
    assert sim["staleness_hist"] == pytest.approx([3.5 / 5, 1.5 / 5])
    assert sim["episode_staleness_hist"] == [1, 1]
    assert sim["staleness_max"] == 1


def test_a_switch_leaves_a_tool_wait_alone():
    # as above, but ep1 = 1 token, a 1.5 s tool, 1 token: its tool (1 s to 2.5 s) runs through the load (2 s to
    # 2.5 s) undelayed, so its last token decodes 2.5-3.5 on version 1; trained 3.5-4.5 (a tool paused by the
    # load would answer at 3 s and end the run at 5 s)
    flat = EngineCurve.linear(1.0, 0.0)
    turns = [[[1, 0.0]], [[1, 1.5], [1, 0.0]], [[10, 0.0]]]
    sim = simulate_board(None, 2, 1, 1, 1.0, 0.5, 1, True, 2, turns=turns, engine=flat)
    assert sim["step_ends"] == pytest.approx([2.0, 4.5])
    assert sim["staleness_hist"] == pytest.approx([2 / 3, 1 / 3])


def test_the_engine_curve_interpolates_and_extends_its_fit():
    curve = EngineCurve.of([[1, 1.0], [3, 2.0], [5, 3.0]])
    assert curve.seconds(0) == 0.0
    assert curve.seconds(1) == pytest.approx(1.0)
    assert curve.seconds(2) == pytest.approx(1.5)
    assert curve.seconds(9) == pytest.approx(5.0)  # the line through the points: 0.5 + 0.5 b
    with pytest.raises(ValueError, match="episodes decoding"):
        EngineCurve.of([[0, 1.0]])


def test_turns_are_checked_and_accept_the_history_format():
    assert parse_turns([{"prompt": 16, "turns": [[3, 0.25, 9], [2, 0.5, 0]]}]) == [[(3, 0.25), (2, 0.5)]]
    with pytest.raises(ValueError, match="episode 0"):
        parse_turns([[[-1, 0.5]]])
    with pytest.raises(ValueError, match="no turns"):
        parse_turns([[]])
    with pytest.raises(ValueError, match="needs turns"):
        simulate_board(None, 2, 1, 1, 1.0, 0.0)


def test_the_co_run_slowdown_slows_decoding_while_the_trainer_trains():
    # bound 1: the second batch decodes while the first trains; 2x slower steps while training lengthen it
    turns = [[[4, 0.0]]]
    flat = EngineCurve.linear(1.0, 0.0)
    alone = simulate_board(None, 1, 1, 1, 2.0, 0.0, 1, True, 3, turns=turns, engine=flat)
    shared = simulate_board(None, 1, 1, 1, 2.0, 0.0, 1, True, 3, turns=turns, engine=flat, co_run=2.0)
    assert shared["time"] > alone["time"]


def test_a_worker_waiting_on_its_tools_sees_new_work_at_the_end_of_its_slice():
    # A = 1 token; B = 1 token, then a 1 s tool. Steps of 0.01 s, training 0.25 s, bound 1, slots 2, batches
    # of one episode. A ends at 0.01 and trains to 0.26; from 0.01 the worker only waits on B's tool, in
    # slices of 0.1 s, so the batch issued at 0.26 (and version 1) reach it at 0.31: the third episode (A
    # again) decodes 0.31-0.32 and trains to 0.57. A worker that looked at once would have it done by 0.52.
    flat = EngineCurve.linear(0.01, 0.0)
    turns = [[[1, 0.0]], [[1, 1.0]]]
    kw = dict(turns=turns, engine=flat, drop=False)
    sliced = simulate_board(None, 2, 1, 1, 0.25, 0.0, 1, True, 2, wait_slice=0.1, **kw)
    at_once = simulate_board(None, 2, 1, 1, 0.25, 0.0, 1, True, 2, wait_slice=0.0, **kw)
    assert sliced["step_ends"] == pytest.approx([0.26, 0.57])
    assert at_once["step_ends"] == pytest.approx([0.26, 0.52])
    assert sliced["staleness_hist"] == pytest.approx([1.0])  # it started on version 1, seen at the same wake


def test_the_simulators_wait_slice_is_the_workers():
    from lrl.envs.workers import WAIT_SLICE
    from lrl_lab.sim.board import WAIT_SLICE as SIMULATED

    assert SIMULATED == WAIT_SLICE
