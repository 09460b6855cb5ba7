"""The staleness policies as objects (lrl.pipeline.policies): the registry has every built-in one under its name,
each hook does what its policy says and nothing else, the pipeline calls the hooks (the free schedule's take, a
free-running worker once per newer version it sees), and a policy of a user's own is registered and used exactly
like a built-in one."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from lrl.pipeline.messages import GroupDone
from lrl.pipeline.policies import (
    STALE_POLICIES,
    Abort,
    Cut,
    Drop,
    Mask,
    OldestFirst,
    Ordered,
    ThrottleOnly,
    Verdict,
    issue_limit,
    make_stale_policy,
    register_stale_policy,
    unit_episodes,
    worker_capacity,
)
from lrl.pipeline.schedule import DeterministicSchedule, FreeSchedule
from lrl.registry import STALENESS, RegistryError
from lrl.sections import RolloutOptions

BUILT_IN = {
    Drop: "drop",
    Mask: "mask",
    Abort: "abort",
    OldestFirst: "oldest-first",
    Cut: "cut",
    Ordered: "ordered",
}


def cfg_of(**kw):
    """The rollout options a policy is built with (lrl.sections.RolloutOptions)."""
    return RolloutOptions(**kw)


def test_every_built_in_policy_is_registered_under_its_name_and_chosen_by_the_config():
    assert STALE_POLICIES == (
        "drop",
        "mask",
        "abort",
        "oldest-first",
        "cut",
        "ordered",
    )  # --stale-policy's order
    for cls, name in BUILT_IN.items():
        assert cls.name == name and STALENESS[name].factory is cls
        assert type(make_stale_policy(cfg_of(stale_policy=name))) is cls
        # --staleness-drop false: the throttle alone, whatever the policy named
        assert type(make_stale_policy(cfg_of(stale_policy=name, staleness_drop=False))) is ThrottleOnly
    assert ThrottleOnly.name == "none" and STALENESS["none"].factory is ThrottleOnly
    assert STALENESS["ordered"].uses == ("take_patience", "take_patience_steps")
    assert all(STALENESS[name].help for name in STALENESS)  # each says in a line what it does (--help)
    from lrl.config import OPTIONS  # the config offers whatever is registered, `none` and a plugin's too

    assert OPTIONS["stale_policy"].meta["choices"] is STALENESS
    assert set(STALE_POLICIES) | {"none"} <= set(STALENESS)


@pytest.mark.parametrize(
    "cls, past, within",
    [
        (Drop, Verdict.DROP, Verdict.KEEP),
        (Mask, Verdict.MASK, Verdict.KEEP),
        (Abort, Verdict.DROP, Verdict.KEEP),
        (OldestFirst, Verdict.DROP, Verdict.KEEP),
        (Cut, Verdict.DROP, Verdict.KEEP),
        (Ordered, Verdict.DROP, Verdict.KEEP),
        (ThrottleOnly, Verdict.KEEP, Verdict.KEEP),
    ],
)
def test_each_policy_judges_an_episode_by_its_oldest_action_token(cls, past, within):
    policy = cls()
    assert policy.verdict([4, 2, 5], oldest=3) is past  # one token older than the bound
    assert policy.verdict([3, 4, 5], oldest=3) is within  # the oldest is just within
    assert policy.verdict([], oldest=3) is Verdict.KEEP  # no action token: nothing to judge


class RecordingWorker:
    def __init__(self):
        self.calls = []

    def abort_stale(self, version):
        self.calls.append(("abort_stale", version))

    def cut_stragglers(self, version):
        self.calls.append(("cut_stragglers", version))


@pytest.mark.parametrize("cls", [*BUILT_IN, ThrottleOnly])
def test_only_abort_and_cut_act_in_the_worker_when_a_version_is_published(cls):
    worker = RecordingWorker()
    cls().published(worker, 7)
    expected = {Abort: [("abort_stale", 7)], Cut: [("cut_stragglers", 7)]}.get(cls, [])
    assert worker.calls == expected


def test_only_ordered_with_a_patience_in_steps_measures_the_trainer_and_logs_it():
    for cls in [*BUILT_IN, ThrottleOnly]:
        policy = cls(cfg_of(take_patience_steps=2.0) if cls is Ordered else None)
        policy.measured([0.5, 0.1, 0.3])
        if cls is Ordered:
            assert policy.patience == pytest.approx(0.6)  # 2 x the median step
            assert policy.metrics() == {"pipeline/take_patience": policy.patience}
        else:
            assert policy.metrics() == {}
    waiting = Ordered(cfg_of(take_patience_steps=2.0))
    waiting.measured([])  # nothing measured yet: wait for the earlier group, log nothing
    assert waiting.patience == math.inf and waiting.metrics() == {}
    seconds = Ordered(cfg_of(take_patience=1.5))
    seconds.measured([9.0])  # a patience in seconds stays as given, and is not logged
    assert seconds.patience == 1.5 and seconds.metrics() == {}


def finished(schedule, groups):
    """GroupDone for each (serial, versions of its one episode), in this order."""

    class Ep:
        def __init__(self, versions):
            self.version, self.generated = versions, [True] * len(versions)

    for serial, versions in groups:
        schedule.accept(GroupDone(0, serial, [Ep(versions)], 1.0))


@pytest.mark.parametrize("cls", [Drop, Mask, Abort, Cut, ThrottleOnly])
def test_the_policies_without_a_choice_of_their_own_take_the_oldest_finished(cls):
    schedule = FreeSchedule(2, 1, 1, 1, 0, cls())
    finished(schedule, [(3, [5]), (0, [1]), (2, [2])])
    assert [s for s, _ in schedule.take()] == [3, 0]
    assert [s for s, _ in schedule.ready] == [2]


def test_the_schedules_log_the_wait_for_cut_answers_only_where_it_can_happen():
    free = FreeSchedule(2, 1, 1, 1, 0)
    free.cut_wait = 0.25
    assert free.metrics() == {"pipeline/cut_wait": 0.25} and free.metrics() == {"pipeline/cut_wait": 0.0}
    assert DeterministicSchedule(2, 1, 1, 1, 0).metrics() == {}  # batches in order: nothing is ever cut


def test_the_throttle_and_a_workers_capacity():
    assert issue_limit(0, 1) == 2 and issue_limit(5, 0) == 6  # (v + 1 + eta) batches
    assert unit_episodes(8, 3, 4) == 12  # 8 groups over 3 workers: at most 3 groups of 4
    assert unit_episodes(8, 2, 4) == 16
    assert (
        worker_capacity(64, 12) == 76 and worker_capacity(4, 12) == 24
    )  # slots and a unit, at least 2 units


def test_a_users_policy_is_registered_and_chosen_like_a_built_in_one():
    name = "newest-first-test"
    try:

        @register_stale_policy(name)
        class NewestFirst(Drop):
            """take the groups that finished last first"""

            def choose(self, schedule):
                return list(range(len(schedule.ready)))[::-1][: schedule.groups_per_batch]

        assert NewestFirst.name == name and STALENESS[name].help == "take the groups that finished last first"
        policy = make_stale_policy(cfg_of(stale_policy=name))
        schedule = FreeSchedule(2, 1, 1, 1, 0, policy)
        finished(schedule, [(0, [1]), (1, [1]), (2, [1])])
        assert [s for s, _ in schedule.take()] == [2, 1]
        with pytest.raises(RegistryError, match="registered twice"):
            register_stale_policy(name)(type("Other", (Drop,), {}))
    finally:
        STALENESS.entries.pop(name, None)
    with pytest.raises(RegistryError, match="identifier"):
        register_stale_policy("-bad")(Drop)
    with pytest.raises(RegistryError, match="registered twice"):
        register_stale_policy("drop")(Mask)
    assert (Drop.name, Mask.name) == ("drop", "mask")  # a refused registration renames nothing


def test_a_free_running_worker_tells_its_policy_each_newer_version_once():
    from conftest import quick_cfg

    from lrl.pipeline.worker.free import FreeRunning

    class Rollout:
        done = True

        def pausing(self, on):
            pass

        def switch(self, version):
            pass

        def room(self, slots):
            return 0

    class Worker:
        def __init__(self):
            self.cfg = quick_cfg(pipeline="async", stale_policy="abort", slots=4)
            self.rank, self.index, self.version = 0, 0, -1
            self.board = SimpleNamespace(version=-1)

        def load(self, version):
            self.version = self.board.version
            return True

    class Told(Drop):
        def __init__(self):
            self.calls = []

        def published(self, worker, version):
            self.calls.append((worker, version))

    worker = Worker()
    mode = FreeRunning(worker)
    assert type(mode.stale) is Abort  # the run's policy, from the config
    mode.stale, mode.rollout = Told(), Rollout()
    for version in (-1, 0, 0, 2, 2, 1, 3):  # what the board shows at each step (a lagging read included)
        worker.board.version = version
        mode.step()
    assert mode.stale.calls == [(mode, 0), (mode, 2), (mode, 3)]
