"""``--stale-policy``: what happens to work past the staleness bound. Every policy keeps the guarantee (no trained
token staler than ``max_staleness``, checked per token), the ledger stays lossless, and each does what it says:
``mask`` zeroes exactly the over-stale tokens (and so their gradient), ``drop`` removes their episodes,
``oldest-first`` takes the groups closest to the bound first, ``abort`` stops an episode in flight once it is past
the bound and starts its task again, ``cut`` sends a group at its last trainable version without its stragglers,
``ordered`` takes groups in the order they were issued, waiting (up to a patience) for the earlier ones."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import quick_cfg, rollout
from helpers import Tokens, ledger_is_lossless

from lrl.envs.tinyagent import make_tasks
from lrl.losses import clipped_policy_loss
from lrl.pipeline.policies import STALE_POLICIES, OldestFirst, Ordered, oldest_tag
from lrl.pipeline.schedule import FreeSchedule
from lrl.run import build_run, fit

VERSION, ETA = 5, 1  # the trainer's version in the hand-made batches, and the bound


def async_cfg(**kw):
    base = dict(
        pipeline="async",
        max_steps=6,
        tasks_per_step=4,
        episodes_per_task=4,
        minibatches=2,
        eval_at_start=False,
        threads=1,
        slots=16,
    )
    return quick_cfg(**{**base, **kw})


def retagged(policy, spec, n: int = 4):
    """n real episodes whose action tokens are re-tagged: the first half of each on VERSION - 3 (past the bound)
    for an even i, on VERSION - 1 (within it) for an odd one; the rest on VERSION (fresh)."""
    tasks = make_tasks("train")[:n]
    episodes = rollout(policy, tasks, spec)
    for i, episode in enumerate(episodes):
        actions = [k for k, g in enumerate(episode.generated) if g]
        assert len(actions) >= 2
        for k in actions:
            episode.version[k] = VERSION
        for k in actions[: len(actions) // 2]:
            episode.version[k] = VERSION - 3 if i % 2 == 0 else VERSION - 1
    return episodes


def source_for(policy_name: str, model, spec):
    from lrl.pipeline.source import AsyncSource

    cfg = async_cfg(max_staleness=ETA, stale_policy=policy_name, tasks_per_step=2, episodes_per_task=2)
    return AsyncSource(cfg, spec, model)


def test_mask_gives_no_gradient_to_exactly_the_over_stale_tokens(format_policy, spec):
    from lrl.batch import collate
    from lrl.sources.base import score_batch

    episodes = retagged(format_policy, spec)
    source = source_for("mask", format_policy, spec)
    try:
        batch, info = source._assemble([(0, episodes[:2]), (1, episodes[2:])], VERSION, 0.0)
    finally:
        source.close()
    assert info["dropped_ids"] == [] and len(info["trained_ids"]) == 4  # nothing dropped: every episode trains
    # what collate makes of the episodes' own tags, without the policy
    plain = collate(episodes, spec.tok.pad_id)
    over = (plain["action_mask"] > 0) & (plain["version"] < VERSION - ETA)
    assert over.sum() > 0 and (plain["action_mask"] > 0).sum() > over.sum()
    expected = plain["action_mask"] * (~over).float()
    assert torch.equal(batch["action_mask"], expected)  # exactly the over-stale tokens lost their mask
    metrics = info["metrics"]
    assert metrics["pipeline/masked_tokens"] == float(over.sum())
    assert metrics["pipeline/wasted_tokens"] == float(over.sum())
    assert metrics["pipeline/decoded_tokens"] == float((plain["action_mask"] > 0).sum())
    counts = info["staleness_counts"]
    assert len(counts) <= ETA + 1 and sum(counts) == int(expected.sum())  # only trained tokens are counted

    # the clipped loss of the batch: its gradient is zero on every masked token, non-zero on every trained one
    old = torch.randn(batch["action_mask"].shape)
    logp = old.clone().requires_grad_(True)
    loss, _ = clipped_policy_loss(logp, old, torch.ones_like(old), batch["action_mask"])
    loss.backward()
    grad = logp.grad
    assert torch.all(grad[over] == 0)
    assert torch.all(grad[expected > 0] != 0)
    # the advantage still comes from the whole episode: the same as without masking
    assert torch.equal(batch["advantage"], score_batch(episodes, spec, source.cfg)["advantage"])


@pytest.mark.parametrize("name", ["drop", "oldest-first", "abort"])
def test_the_other_policies_drop_an_episode_with_an_over_stale_token(format_policy, spec, name):
    episodes = retagged(format_policy, spec)
    source = source_for(name, format_policy, spec)
    try:
        batch, info = source._assemble([(0, episodes[:2]), (1, episodes[2:])], VERSION, 0.0)
    finally:
        source.close()
    assert info["dropped_ids"] == ["0:0", "0:2"]  # episodes 0 and 2 hold tokens 3 versions old
    assert info["trained_ids"] == ["0:1", "0:3"]
    on = batch["action_mask"].bool()
    assert int((VERSION - batch["version"][on]).max()) <= ETA
    dropped = sum(sum(episodes[i].generated) for i in (0, 2))
    assert info["metrics"]["pipeline/wasted_tokens"] == dropped
    assert info["metrics"]["pipeline/masked_tokens"] == 0


def test_a_take_dropped_whole_is_carried_into_the_next_batch(format_policy, spec):
    """A take whose every episode is dropped makes no batch; its ids, group time and tokens go into the next one's."""
    from lrl.pipeline.metrics import Carry

    episodes = retagged(format_policy, spec)
    source = source_for("drop", format_policy, spec)
    try:
        nothing, _ = source._assemble([(0, [episodes[0], episodes[2]])], VERSION, 0.0)  # both over-stale
        batch, info = source._assemble([(1, [episodes[1], episodes[3]])], VERSION, 0.0)
    finally:
        source.close()
    assert nothing is None and batch is not None
    assert info["dropped_ids"] == ["0:0", "0:1"] and info["trained_ids"] == ["0:2", "0:3"]
    assert len(info["time/group_seconds"]) == 2  # the dropped group's time too
    dropped = sum(sum(episodes[i].generated) for i in (0, 2))
    assert info["metrics"]["pipeline/wasted_tokens"] == dropped
    assert info["metrics"]["pipeline/decoded_tokens"] == sum(sum(e.generated) for e in episodes)
    assert sorted(batch["sampled_length"].tolist()) == sorted(float(len(e.ids)) for e in episodes)
    assert source._carry == Carry()  # made into a batch: nothing is carried further


class _Ep:
    def __init__(self, versions):
        self.version = versions
        self.generated = [True] * len(versions)

    def state(self):
        return {"version": self.version}


def test_oldest_first_takes_the_groups_closest_to_the_bound():
    schedule = FreeSchedule(2, 1, 1, 1, 0, OldestFirst())
    from lrl.pipeline.messages import GroupDone

    for serial, versions in [(0, [4, 4]), (1, [2, 5]), (2, [3]), (3, [5])]:  # finished in this order
        schedule.accept(GroupDone(0, serial, [_Ep(versions)], 1.0))
    taken = schedule.take()
    assert [s for s, _ in taken] == [1, 2]  # oldest tokens 2 and 3, though 0 finished first
    assert [s for s, _ in schedule.ready] == [0, 3]  # the rest keep their order
    assert oldest_tag([_Ep([])]) > 10**9  # a group without action tokens sorts last
    fifo = FreeSchedule(2, 1, 1, 1, 0)
    for serial, versions in [(0, [4, 4]), (1, [2, 5])]:
        fifo.accept(GroupDone(0, serial, [_Ep(versions)], 1.0))
    assert [s for s, _ in fifo.take()] == [0, 1]  # the default: the order they finished


def test_ordered_takes_the_earliest_issued_groups_and_waits_for_an_earlier_one(monkeypatch):
    from lrl.pipeline import schedule as module  # the clock the take reads (schedule.now)
    from lrl.pipeline.messages import CutDone, GroupDone

    clock = [100.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])

    def fresh(patience):
        schedule = FreeSchedule(2, 1, 2, 1, 0, Ordered())  # groups of one, two a batch, two workers
        schedule.policy.patience = patience
        schedule.owner = {s: 0 for s in range(5)}  # issued to worker 0, none back yet
        for serial in (3, 1, 2):  # finished in this order; 0 and 4 are still out
            schedule.accept(GroupDone(0, serial, [_Ep([4])], 1.0))
        return schedule

    forever = fresh(float("inf"))
    clock[0] += 1e6
    assert forever.take() is None  # group 0 was issued before 1 and 2: the take waits for it
    forever.accept(GroupDone(0, 0, [_Ep([3])], 1.0))
    assert [s for s, _ in forever.take()] == [0, 1]  # the earliest issued, though 3 finished first
    assert [s for s, _ in forever.take()] == [2, 3]  # 4 was issued after both: no wait
    assert forever.take() is None and forever.flying == {4}

    patient = fresh(2.0)
    patient.owner = {0: 1, 4: 0}
    assert patient.take() is None  # the wait begins
    clock[0] += 1.9
    assert patient.take() is None and patient.outbox == []
    clock[0] += 0.2  # 2.1 s after it began: worker 1 is asked to cut group 0, and the take waits for its answer
    assert patient.take() is None and patient.outbox == [(1, [0])]
    patient.outbox.clear()
    assert patient.take() is None
    patient.accept(GroupDone(1, 0, [_Ep([3])], 1.0))  # group 0, sent without its unfinished episode
    assert [s for s, _ in patient.take()] == [0, 1]
    assert [s for s, _ in patient.take()] == [2, 3]  # nothing issued before them is out: no wait

    declined = fresh(0.0)  # patience 0: asks at once
    assert declined.take() is None and declined.outbox == [(0, [0])]
    declined.accept(CutDone(0, [0]))  # less than half of group 0 has finished: not sent
    assert [s for s, _ in declined.take()] == [1, 2]  # taken without it
    assert declined.flying == {0, 4} and declined.cutting is None

    restored = FreeSchedule(2, 1, 2, 1, 0, Ordered())
    saved = fresh(1.0)
    saved.owner = {0: 1, 4: 0}
    restored.load_state_dict(saved.state_dict(), lambda e: _Ep(e["version"]))  # a checkpoint keeps what is out
    assert restored.flying == {0, 4} and restored.owner == {0: 1, 4: 0}
    assert [s for s, _ in restored.ready] == [3, 1, 2]


@pytest.mark.slow  # about 17 s each on 2 cores (the schedule's own test above runs by default)
@pytest.mark.parametrize("partial", ["interrupt", "drain"])
def test_ordered_without_patience_never_passes_the_bound(format_policy, partial):
    """Batch b goes out once the trainer is at b - eta and is taken whole at step b: nothing to drop."""
    tokens = Tokens()
    cfg = async_cfg(
        max_staleness=1, stale_policy="ordered", partial_rollouts=partial, tool_latency="lognormal:0.02:2.0"
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    history = run.module.history
    trained, dropped = ledger_is_lossless(history)
    assert dropped == 0 and trained == cfg.max_steps * cfg.tasks_per_step * cfg.episodes_per_task
    assert all(h["pipeline/wasted_tokens"] == 0 for h in history)
    for step, h in enumerate(history):  # each step trained the groups issued as its own batch
        serials = {int(e.split(":")[1]) // cfg.episodes_per_task for e in h["trained_ids"]}
        assert serials == set(range(step * cfg.tasks_per_step, (step + 1) * cfg.tasks_per_step))
    assert tokens.staleness and max(tokens.staleness) <= 1


@pytest.mark.slow  # about 20 s on 2 cores
@pytest.mark.parametrize("workers", [1, 2])
def test_ordered_out_of_patience_cuts_the_groups_it_waited_for(format_policy, workers):
    tokens = Tokens()
    cfg = async_cfg(
        max_staleness=1,
        stale_policy="ordered",
        take_patience=0.0,
        rollout_workers=workers,
        tool_latency="lognormal:0.02:2.0",
        max_steps=8,
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    history = run.module.history
    cut = sum(h["pipeline/cut"] for h in history)
    assert cut > 0  # the workers were asked, and sent groups without their stragglers
    assert sum(h["pipeline/cut_wait"] for h in history) > 0  # and the wait for their answers was timed
    trained, dropped = ledger_is_lossless(history)  # the stragglers are recorded, not lost
    # with the dropped, or among the unfinished when their group was sent back after the last take
    assert dropped + len(history[-1].get("unfinished_ids", [])) >= cut
    assert all(h["pipeline/wasted_tokens"] >= h["pipeline/cut_tokens"] for h in history)
    assert tokens.staleness and max(tokens.staleness) <= 1


@pytest.mark.slow  # about 20 s on 2 cores
def test_ordered_with_a_patience_in_trainer_steps_measures_the_trainer_then_cuts(format_policy):
    tokens = Tokens()
    cfg = async_cfg(
        max_staleness=1,
        stale_policy="ordered",
        take_patience_steps=0.5,
        tool_latency="lognormal:0.02:2.0",
        max_steps=8,
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    history = run.module.history
    assert "pipeline/take_patience" not in history[0]  # no trainer step measured before the first take
    patience = [h["pipeline/take_patience"] for h in history[1:]]
    assert len(patience) == 7 and all(0 < p < 60 for p in patience)  # half a measured step, in seconds
    assert sum(h["pipeline/cut"] for h in history) > 0  # it ran out of that patience and cut
    ledger_is_lossless(history)
    assert tokens.staleness and max(tokens.staleness) <= 1


def test_rollout_abort_stops_the_rejected_episodes_and_forgets_their_tools(format_policy, spec):
    from lrl.decoding import TrainerStyleDecoder
    from lrl.envs.latency import parse_latency
    from lrl.envs.workers import ThreadTools
    from lrl.rollout import Rollout

    tools = ThreadTools(parse_latency("lognormal:0.2:0"), torch.Generator().manual_seed(0))
    roll = Rollout(
        TrainerStyleDecoder(format_policy, spec.tok.pad_id),
        spec,
        (),
        torch.Generator().manual_seed(0),
        lockstep=False,
        tools=tools,
    )
    roll.add(make_tasks("train")[:4], tags=[(0, j) for j in range(4)])
    while tools.pending < 2:  # some episodes wait for a tool, others may still decode
        roll.advance()
    waiting = [k for k, s in roll.slots.items() if s.phase == "tool"]
    stopped = roll.abort(lambda e: e.tag[1] >= 2)
    assert sorted(e.tag[1] for e in stopped) == [0, 1]
    assert all(e.tag[1] >= 2 for e in (s.episode for s in roll.slots.values()))
    assert all(k not in tools.calls for k in waiting if k not in roll.slots)  # their tool calls are forgotten
    finished = []
    while not roll.done:
        finished += roll.advance()
    assert sorted(e.tag[1] for e in finished) == [2, 3]  # the stopped ones never end


SETTINGS = [(0, "interrupt", 1), (1, "interrupt", 2), (1, "drain", 1), (2, "interrupt", 1), (2, "drain", 2)]
DEFAULT = {  # one run in the default run (about 20 s each; mask, oldest-first and abort have unit tests above);
    ("cut", 1, "interrupt", 1),  # the whole grid, every policy at bounds 0-2, with -m slow
}
GRID = [
    pytest.param(p, *s, marks=() if (p, *s) in DEFAULT else pytest.mark.slow)
    for p in STALE_POLICIES
    for s in SETTINGS
]


@pytest.mark.parametrize("policy, eta, partial, workers", GRID)
def test_every_policy_keeps_every_trained_token_within_the_bound(format_policy, policy, eta, partial, workers):
    tokens = Tokens()
    cfg = async_cfg(
        max_staleness=eta,
        rollout_workers=workers,
        partial_rollouts=partial,
        stale_policy=policy,
        tool_latency="lognormal:0.02:2.0",  # heavy tails: stragglers pass the bound
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    history = run.module.history
    assert tokens.staleness and max(tokens.staleness) <= eta  # per trained token
    ledger_is_lossless(history)
    for h in history:
        assert h["pipeline/wasted_tokens"] <= h["pipeline/decoded_tokens"]
        assert h["pipeline/wasted_tokens"] >= h["pipeline/masked_tokens"]
        if policy != "mask":
            assert h["pipeline/masked_tokens"] == 0
        if policy != "abort":
            assert h["pipeline/aborted"] == 0
        if policy != "cut":
            assert h["pipeline/cut"] == 0
        if policy == "mask":
            assert h["dropped_ids"] == []


@pytest.mark.slow  # 27 s on 2 cores: out of the default run (pytest -m slow)
def test_cut_sends_a_group_without_its_stragglers_and_records_them(format_policy):
    tokens = Tokens()
    cfg = async_cfg(max_staleness=1, stale_policy="cut", tool_latency="lognormal:0.02:2.0", max_steps=8)
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    history = run.module.history
    cut = sum(h["pipeline/cut"] for h in history)
    assert cut > 0  # heavy tails: some groups reach their last version with stragglers in flight
    trained, dropped = ledger_is_lossless(history)  # the stragglers are recorded, not lost
    assert dropped >= cut
    per_group: dict[int, int] = {}
    for h in history:
        for eid in h["trained_ids"]:
            serial = int(eid.split(":")[1]) // cfg.episodes_per_task
            per_group[serial] = per_group.get(serial, 0) + 1
    short = [n for n in per_group.values() if n < cfg.episodes_per_task]
    assert short  # groups trained without some of their episodes (the consumer's drop is per episode too)
    assert tokens.staleness and max(tokens.staleness) <= 1


class _Waiting:
    """Workers whose finished groups are all already waiting when the trainer asks for a batch."""

    running = True

    def __init__(self, messages):
        self.messages = list(messages)
        self.sent = []

    def send(self, worker, work):
        self.sent.append(work)

    def receive(self, timeout):
        return self.messages.pop(0) if self.messages else None

    def close(self):
        pass


@pytest.mark.parametrize("name", ["drop", "oldest-first"])
def test_a_take_chooses_among_every_group_already_finished(format_policy, spec, name):
    """Groups that finished while the trainer was busy all wait for the next take: oldest-first must see them
    all, not only the first G read (before, the controller took as soon as G had been read, so oldest-first
    took what drop took). Groups 0-1 are fresh and come first; groups 2-3 hold tokens one version old."""
    from lrl.pipeline.messages import GroupDone

    episodes = rollout(format_policy, make_tasks("train")[:8], spec)
    for i, episode in enumerate(episodes):
        episode.version = [VERSION - (i >= 4)] * len(episode.version)  # episodes 4-7: one version old
    source = source_for(name, format_policy, spec)
    source.bind(0, 1)
    waiting = _Waiting(GroupDone(0, s, episodes[2 * s : 2 * s + 2], 1.0) for s in range(4))
    source.workers = waiting
    try:
        batch = source.next_batch(VERSION)
    finally:
        source.close()
    trained = batch["ledger"]["trained_ids"]
    expected = {"drop": ["0:0", "0:1", "0:2", "0:3"], "oldest-first": ["0:4", "0:5", "0:6", "0:7"]}[name]
    assert trained == expected
    assert waiting.messages == []  # every waiting message was read before the take
    assert batch["pipeline"]["pipeline/queue_depth_at_take"] == 8.0  # four groups of two were there to choose from
    assert batch["pipeline"]["pipeline/queue_depth"] == 4.0  # two groups are left for the next batch


def test_a_patience_in_trainer_steps_is_that_many_median_steps_and_excludes_one_in_seconds():
    from lrl.config import ConfigError
    from lrl.pipeline.policies import patience_seconds

    assert patience_seconds(1.5, []) == math.inf  # nothing measured: wait for the earlier group
    assert patience_seconds(1.5, [0.3]) == pytest.approx(0.45)
    assert patience_seconds(2.0, [0.5, 0.2, 9.0]) == pytest.approx(1.0)  # the median: one slow step moves it not
    assert async_cfg(max_staleness=1, stale_policy="ordered", take_patience_steps=1.0).take_patience_steps == 1.0
    with pytest.raises(ConfigError, match="give one"):
        async_cfg(max_staleness=1, stale_policy="ordered", take_patience=0.5, take_patience_steps=1.0)
    with pytest.raises(ConfigError, match="take_patience_steps"):
        async_cfg(max_staleness=1, stale_policy="ordered", take_patience_steps=-1.0)
    with pytest.raises(ConfigError, match="take_patience_steps"):
        async_cfg(max_staleness=1, stale_policy="drop", take_patience_steps=1.0)
