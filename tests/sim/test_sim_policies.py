"""The simulator's staleness policy is the pipeline's own object (lrl_lab.sim.policy): a policy a plugin registers is
simulated by ``python -m lrl_lab.sim --plugins``, the simulated take chooses what the controller's schedule chooses
from the same finished groups, a simulated worker hears of each newer version once, as a free-running worker does,
and the built-in policies' results are the ones the simulator gave when it played each policy by its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

import lrl_lab.sim.event as event
from lrl.pipeline.policies import Drop, OldestFirst, Ordered
from lrl.pipeline.schedule import FreeSchedule
from lrl_lab.sim.board import simulate_board

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"

STRAGGLERS = [3.0, 0.1, 0.1, 0.1] * 100  # one episode in four outlasts several steps
# 3 workers of 3 slots, groups of 2, 3 groups a batch, steps of 0.3 s, switches of 0.02 s, bound 1, 14 steps
SETUP = dict(n_slots=3, group_size=2, groups_per_batch=3, train_time=0.3, switch_time=0.02, max_staleness=1,
             interrupt=True, steps=14, workers=3, release="episode")  # fmt: skip


def write_turns(path: Path, episodes, **settings) -> Path:
    lines = [json.dumps(settings)] + [json.dumps({"turns": e}) for e in episodes]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.early
def test_a_plugin_policy_is_simulated_by_the_command(tmp_path, monkeypatch):
    # tests/plugins/cut_and_abort.py registers "cut-and-abort" as a user registers a policy: when a worker sees a
    # newer version it cuts the groups at their last version, then aborts what is past the bound. No built-in
    # policy does both: its rows show cuts and aborts, cut's show no abort, abort's no cut.
    episodes = [[[3, 0.2], [3, 6.0 if i % 4 == 0 else 0.2]] for i in range(64)]
    trace = write_turns(tmp_path / "t.jsonl", episodes, train_s=0.3, engine={"points": [[1, 0.01], [8, 0.02]]},
                        batch=8, group=2)  # fmt: skip
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT)])}
    args = [sys.executable, "-m", "lrl_lab.sim", "--trace", str(trace), "--plan-slots", "8", "--bounds", "1"]
    args += ["--steps", "12", "--json", str(out), "--plugins", "cut_and_abort"]
    done = subprocess.run([*args, "--policies", "cut", "abort", "cut-and-abort"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    partial = [r for r in json.loads(out.read_text())["rows"] if r["design"] == "async bound 1, partial"]
    rows = {r["policy"]: r for r in partial}
    assert list(rows) == ["cut", "abort", "cut-and-abort"]
    assert rows["cut"]["cut"] > 0 and rows["cut"]["aborted"] == 0
    assert rows["abort"]["aborted"] > 0 and rows["abort"]["cut"] == 0
    both = rows["cut-and-abort"]
    assert both["cut"] > 0 and both["aborted"] > 0 and both["staleness_max"] <= 1
    assert "| cut-and-abort |" in done.stdout  # the table's column fits the plugin's name
    # the plugin's policy, in process, gives the same row: the command ran its hooks, not another policy's
    from lrl import plugins
    from lrl.registry import STALENESS
    from lrl_lab.sim.turns import plan_turns, read_turn_trace

    monkeypatch.syspath_prepend(str(PLUGINS))
    try:
        assert plugins.load(["cut_and_abort"]) == []
        again = plan_turns(read_turn_trace(str(trace)), [8], [1], 12, policies=["cut-and-abort"])
    finally:  # the registry as the other tests know it
        STALENESS.entries.pop("cut-and-abort", None)
        sys.modules.pop("cut_and_abort", None)
        plugins._loaded.discard("cut_and_abort")
    assert [r for r in again if r["design"] == "async bound 1, partial"][0] == both
    # without the plugin the name is not a policy: one line, status 2
    done = subprocess.run(
        [*args[:-2], "--policies", "cut-and-abort"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and "unknown staleness policy ['cut-and-abort']" in done.stderr
    done = subprocess.run([*args[:-1], "no_such_plugin"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "cannot import 'no_such_plugin'" in done.stderr


class Recorder:
    """A policy object, its decisions recorded: each take's finished groups, groups out and choice, and the
    versions each worker was told of."""

    def __init__(self, policy):
        self.policy, self.takes, self.told = policy, [], {}

    def choose(self, schedule):
        ready, owner = list(schedule.ready), dict(schedule.owner)
        positions = self.policy.choose(schedule)
        self.takes.append((ready, owner, positions))
        return positions

    def published(self, worker, version):
        self.told.setdefault(id(worker.worker), []).append(version)
        self.policy.published(worker, version)

    def __getattr__(self, hook):  # verdict, measured, metrics, wakes: as the policy has them
        return getattr(self.policy, hook)


@pytest.mark.parametrize("cls", [Drop, OldestFirst, Ordered])
def test_the_simulated_take_chooses_what_the_controllers_schedule_chooses(monkeypatch, cls):
    recorders = []

    def recording(*args, **kwargs):
        recorders.append(Recorder(event_make_policy(*args, **kwargs)))
        return recorders[-1]

    event_make_policy = event.make_policy
    monkeypatch.setattr(event, "make_policy", recording)
    result = simulate_board(STRAGGLERS, **SETUP, policy=cls.name)
    (rec,) = recorders
    assert type(rec.policy) is cls and len(rec.takes) >= SETUP["steps"]
    for (
        ready,
        owner,
        positions,
    ) in rec.takes:  # each choice again, by the pipeline's schedule and a new policy
        schedule = FreeSchedule(SETUP["groups_per_batch"], SETUP["group_size"], SETUP["workers"], 1, 3, cls())
        schedule.ready, schedule.owner = deque(ready), dict(owner)
        taken = schedule.take()
        expected = None if positions is None else [ready[i][0] for i in positions]
        assert (None if taken is None else [serial for serial, _ in taken]) == expected
    waited = sum(positions is None for _, _, positions in rec.takes)
    reordered = sum(positions is not None and positions != sorted(positions) for _, _, positions in rec.takes)
    if cls is Ordered:
        assert waited > 0 and result["dropped"] == 0  # it waited for earlier groups, so none passed the bound
    if cls is OldestFirst:
        assert reordered > 0  # it took groups out of the order they finished
    for versions in rec.told.values():  # once for each newer version a worker sees, as FreeRunning calls it
        assert versions == sorted(set(versions)) and versions[0] >= 1


# (trained, dropped, aborted, cut), seconds simulated and wasted work of each built-in policy on SETUP, as the
# simulator gave them before it drove the policy objects (when it played each policy by its name)
BEFORE = {
    "drop": ((48, 36, 0, 0), 16.759999999999998, 36.0),
    "mask": ((84, 0, 0, 0), 16.759999999999998, 24.75670965493204),
    "abort": ((64, 20, 8, 0), 15.859999999999998, 22.186666666666667),
    "oldest-first": ((50, 34, 0, 0), 16.759999999999998, 34.0),
    "cut": ((63, 0, 0, 23), 4.399999999999999, 2.366666666666666),
    "ordered": ((84, 0, 0, 0), 23.64, 0.0),
    "ordered 0.4 s": ((63, 0, 0, 22), 11.559999999999999, 7.32),
    "ordered 2 steps": ((63, 0, 0, 22), 14.359999999999992, 9.653333333333325),
    "throttle alone": ((84, 0, 0, 0), 16.759999999999998, 0.0),
}


def test_the_built_in_policies_simulate_as_before():
    runs = {
        label: simulate_board(STRAGGLERS, **SETUP, **kw)
        for label, kw in [
            *((name, {"policy": name}) for name in list(BEFORE)[:6]),
            ("ordered 0.4 s", {"policy": "ordered", "patience": 0.4}),
            ("ordered 2 steps", {"policy": "ordered", "patience_steps": 2.0}),
            ("throttle alone", {"drop": False}),
        ]
    }
    for label, (counts, seconds, wasted) in BEFORE.items():
        r = runs[label]
        assert (r["trained"], r["dropped"], r["aborted"], r["cut"]) == counts, label
        assert r["time"] == pytest.approx(seconds, rel=1e-12, abs=1e-12), label
        assert r["wasted_tokens"] == pytest.approx(wasted, rel=1e-12, abs=1e-12), label
