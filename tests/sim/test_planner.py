"""The planner, ``python -m lrl_lab.sim --trace FILE``: a hand-computed throughput, CSV and JSONL traces that
agree, where its settings come from, and one line naming the file and the line for every bad trace."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrl_lab.sim.cli import main
from lrl_lab.sim.tables import DESIGNS


def write_csv(path, durations, train_s=None, sync_s=None):
    """A CSV trace: duration_s, and train_s / sync_s as constant columns when given."""
    head = ["duration_s"] + ["train_s"] * (train_s is not None) + ["sync_s"] * (sync_s is not None)
    rows = [[f"{d!r}"] + [f"{x!r}" for x in (train_s, sync_s) if x is not None] for d in durations]
    path.write_text("\n".join(",".join(r) for r in [head, *rows]) + "\n")
    return path


def write_jsonl(path, durations, train_s=None, sync_s=None):
    """A JSONL trace: an optional first object with the trainer's times, then one object per episode."""
    first = {k: v for k, v in (("train_s", train_s), ("sync_s", sync_s)) if v is not None}
    lines = ([json.dumps(first)] if first else []) + [json.dumps({"duration_s": d}) for d in durations]
    path.write_text("\n".join(lines) + "\n")
    return path


def plan(tmp_path, trace, *flags) -> dict:
    """Run the planner on a trace -> the JSON it wrote."""
    out = tmp_path / "rows.json"
    assert main(["--trace", str(trace), "--json", str(out), *flags]) == 0
    return json.loads(out.read_text())


def test_constant_durations_give_the_hand_computed_synchronous_throughput(tmp_path, capsys):
    # 8 slots, 8 episodes per step, every episode 30 s, training 20 s, sync 10 s. Synchronous: a step's 8
    # episodes start together, all end 30 s later, the trainer trains 20 s, the sync takes 10 s, and only then
    # do the next 8 start. One step = 30 + 20 + 10 = 60 s for 8 episodes:
    #   8 episodes / 60 s = 0.1333 episodes/s = 8 * 3600 / 60 = 480 episodes/hour,
    #   each slot busy 30 s of every 60 s: utilization 30 / 60 = 0.5; staleness 0; trained mean 30 s.
    trace = write_csv(tmp_path / "const.csv", [30.0] * 5, train_s=20.0, sync_s=10.0)
    got = plan(tmp_path, trace, "--slots", "8", "--batch", "8", "--steps", "10")
    sync = got["rows"][0]
    assert sync["design"] == "synchronous"
    assert sync["episodes_per_hour"] == pytest.approx(8 * 3600 / 60, rel=1e-12)
    assert sync["episodes_per_s"] == pytest.approx(8 / 60, rel=1e-12)
    assert sync["slot_utilization"] == pytest.approx(30 / 60, rel=1e-12)
    assert (sync["staleness_mean"], sync["staleness_max"], sync["trained_duration_mean_s"]) == (0.0, 0, 30.0)
    assert sync["simulated_s"] == pytest.approx(10 * 60)
    out = capsys.readouterr().out
    assert "synchronous            |           480 |     0.1333 |      0.50 |" in out
    assert [r["design"] for r in got["rows"]] == list(DESIGNS)
    assert all(r["cycled"] for r in got["rows"])  # 80+ episodes from a trace of 5
    assert "durations were used again in order from the first" in out


def test_csv_and_jsonl_traces_agree(tmp_path):
    durations = (torch.rand(400, generator=torch.Generator().manual_seed(0)) * 300).tolist()
    flags = ("--slots", "16", "--batch", "16")
    from_csv = plan(tmp_path, write_csv(tmp_path / "t.csv", durations, 45.5, 7.25), *flags)
    from_jsonl = plan(tmp_path, write_jsonl(tmp_path / "t.jsonl", durations, 45.5, 7.25), *flags)
    assert (from_csv["format"], from_jsonl["format"]) == ("csv", "jsonl")
    assert from_csv["rows"] == from_jsonl["rows"]
    assert from_csv["rows"][3]["staleness_max"] >= 1  # the async rows are asynchronous
    assert not any(r["cycled"] for r in from_csv["rows"])  # no design starts more than 16 x (20 + 4) = 384
    by_name = {r["design"]: r for r in from_csv["rows"]}
    assert by_name["async eta=2, partial"]["episodes_per_hour"] > by_name["synchronous"]["episodes_per_hour"]


def test_settings_come_from_options_then_the_trace_then_the_defaults(tmp_path, capsys):
    trace = write_jsonl(tmp_path / "t.jsonl", [10.0, 20.0, 30.0], train_s=5.0, sync_s=1.0)
    got = plan(tmp_path, trace, "--sync-time", "2", "--steps", "3")
    assert (got["slots"], got["batch"], got["train_s"], got["sync_s"]) == (64, 64, 5.0, 2.0)
    assert got["source"] == {
        "slots": "default",
        "batch": "default",
        "train_s": "trace",
        "sync_s": "--sync-time",
    }
    assert (
        "slots 64 (default), batch 64 (default), train 5 s (trace), sync 2 s (--sync-time)"
        in capsys.readouterr().out
    )
    (tmp_path / "s.csv").write_text("duration_s,slots,batch,train_s,sync_s\n10,4,2,1,1\n20,4,2,1,1\n")
    got = plan(tmp_path, tmp_path / "s.csv", "--batch", "3")
    assert (got["slots"], got["batch"]) == (4, 3)
    assert got["source"]["slots"] == "trace" and got["source"]["batch"] == "--batch"


BAD = [
    ("empty.csv", "", "1: the file is empty"),
    ("empty.jsonl", "\n\n", "1: the file is empty"),
    (
        "nocol.csv",
        "seconds,train_s\n3,1\n",
        "1: no duration_s column (the header names 'seconds', 'train_s')",
    ),
    ("header.csv", "duration_s,train_s,sync_s\n", "2: no episodes after the header"),
    (
        "neg.csv",
        "duration_s,train_s,sync_s\n5,1,1\n-3,1,1\n",
        "3: duration_s is -3; it must be in [0, 1e+09] seconds",
    ),
    ("nan.csv", "duration_s,train_s,sync_s\nnan,1,1\n", "2: duration_s is nan, not a finite number"),
    (
        "inf.jsonl",
        '{"duration_s": Infinity, "train_s": 1, "sync_s": 1}\n',
        "1: duration_s is inf, not a finite",
    ),
    (
        "word.csv",
        "duration_s,train_s,sync_s\n1,1,1\n2,1,1\nabc,1,1\n",
        "4: duration_s is 'abc', not a number",
    ),
    ("blank.csv", "duration_s,train_s,sync_s\n1,1,1\n,1,1\n", "3: duration_s is empty, not a number"),
    ("short.csv", "train_s,sync_s,duration_s\n1,1,4\n1,1\n", "3: no duration_s value"),
    (
        "train.csv",
        "duration_s,train_s,sync_s\n5,-1,1\n",
        "2: train_s is -1; it must be in [0, 1e+09] seconds",
    ),
    (
        "sync.jsonl",
        '{"train_s": 1, "sync_s": -5}\n{"duration_s": 3}\n',
        "1: sync_s is -5; it must be in [0, 1e+09] seconds",
    ),
    ("two.csv", "duration_s,train_s,sync_s\n5,20,1\n6,30,1\n", "3: train_s is 30 but line 2 says 20"),
    (
        "none.csv",
        "duration_s\n5\n6\n",
        "1: no train_s: give it in the trace (docs/simulate.md) or with --train-time",
    ),
    ("json.jsonl", '{"train_s": 1, "sync_s": 1}\n{"duration_s": 3}\n{"duration_s": 3\n', "3: not JSON"),
    ("list.jsonl", '{"train_s": 1, "sync_s": 1}\n[3]\n', "2: expected a JSON object, got list"),
    ("late.jsonl", '{"train_s": 1, "sync_s": 1}\n{"duration_s": 3}\n{"id": 7}\n', "3: no duration_s"),
    (
        "str.jsonl",
        '{"train_s": 1, "sync_s": 1}\n{"duration_s": true}\n',
        "2: duration_s is true, not a number",
    ),
    (
        "slots.csv",
        "duration_s,train_s,sync_s,slots\n5,1,1,2.5\n",
        "2: slots is 2.5; it must be an integer in [1, 1048576]",
    ),
]


@pytest.mark.parametrize(("name", "text", "what"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_trace_is_one_line_naming_the_file_and_the_line(tmp_path, capsys, name, text, what):
    path = tmp_path / name
    path.write_text(text)
    assert main(["--trace", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m lrl_lab.sim: error: {path}:{what}"), captured.err


def test_unreadable_traces_name_the_file(tmp_path, capsys):
    for path, what in [(tmp_path / "missing.csv", "no such file"), (tmp_path, "not a regular file")]:
        assert main(["--trace", str(path)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"{path}: cannot read it: {what}" in err, err
    (tmp_path / "bin.csv").write_bytes(b"duration_s\n\xff\xfe\n")
    assert main(["--trace", str(tmp_path / "bin.csv")]) == 2
    assert "bin.csv: cannot read it: not UTF-8 text" in capsys.readouterr().err


def test_the_command_exits_2_without_a_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "lrl_lab.sim", "--trace", str(tmp_path / "missing.jsonl")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"python -m lrl_lab.sim: error: {tmp_path / 'missing.jsonl'}: cannot read it: no such file or directory"
    ]


def test_the_documented_examples_are_five_lines_and_agree(tmp_path):
    """docs/simulate.md shows one trace as CSV and as JSONL; both read to the same plan."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "simulate.md").read_text()
    blocks = {kind: re.search(rf"```{kind}\n(.*?)```", doc, re.S).group(1) for kind in ("csv", "json")}
    assert [len(b.splitlines()) for b in blocks.values()] == [5, 5]
    (tmp_path / "trace.csv").write_text(blocks["csv"])
    (tmp_path / "trace.jsonl").write_text(blocks["json"])
    assert plan(tmp_path, tmp_path / "trace.csv")["rows"] == plan(tmp_path, tmp_path / "trace.jsonl")["rows"]


# -- turn traces: episodes as turns, an engine curve, lrl's pipeline (lrl_lab.sim.turns) ---------------------------
def write_turns(path, episodes, **settings):
    lines = ([json.dumps(settings)] if settings else []) + [json.dumps({"turns": e}) for e in episodes]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_turn_trace_plans_each_design_at_each_slot_count(tmp_path):
    # one-turn episodes of 2 tokens and a 1 s tool, steps of 0.1 s alone: a synchronous step of 4 episodes
    # on 4 slots decodes 2 steps together and waits 1 s for the tools
    engine = {"points": [[1, 0.1], [4, 0.1]]}
    trace = write_turns(tmp_path / "t.jsonl", [[[2, 1.0]]] * 8, train_s=0.5, engine=engine, batch=4, group=2)
    out = plan(tmp_path, trace, "--plan-slots", "2", "4", "--bounds", "1", "--steps", "5")
    rows = {(r["slots"], r["design"]): r for r in out["rows"]}
    assert len(rows) == 2 * 3  # synchronous, bound 1 partial and drain at each slot count
    sync = rows[(4, "synchronous")]
    assert sync["episodes_per_s"] == pytest.approx(4 / (0.2 + 1.0 + 0.5))  # the trainer's first step included
    assert rows[(2, "synchronous")]["episodes_per_s"] < sync["episodes_per_s"]  # 2 slots: two waves a batch
    assert rows[(4, "async bound 1, partial")]["episodes_per_s"] > sync["episodes_per_s"]
    assert (
        main(["--trace", str(trace), "--plan-slots", "2", "4", "--steps", "3", "--plot", str(tmp_path)]) == 0
    )
    assert (tmp_path / "plan.png").stat().st_size > 0


def test_a_turn_trace_without_an_engine_says_how_to_give_one(tmp_path, capsys):
    trace = write_turns(tmp_path / "t.jsonl", [[[2, 1.0]]] * 4, train_s=0.5)
    assert main(["--trace", str(trace)]) == 2
    assert "no engine curve" in capsys.readouterr().err
    # numbers on the command line serve
    assert main(["--trace", str(trace), "--engine-step", "0.05", "0.01", "--batch", "4", "--steps", "3"]) == 0
    bad = write_turns(tmp_path / "b.jsonl", [[[2, -1.0]]], train_s=0.5, engine={"base_s": 0.1})
    assert main(["--trace", str(bad)]) == 2
    assert re.search(r"b\.jsonl:2: turns: .*tool seconds", capsys.readouterr().err)


def test_a_turn_trace_plans_the_staleness_policies_under_the_hard_bound(tmp_path, capsys):
    # one episode in four has a 6 s tool: it outlasts every bound-1 window of a trainer that steps in about 1 s,
    # so under the hard bound drop throws its group away and mask trains its fresh tokens only
    episodes = [[[3, 0.2], [3, 6.0 if i % 4 == 0 else 0.2]] for i in range(64)]
    engine = {"points": [[1, 0.01], [8, 0.02]]}
    trace = write_turns(tmp_path / "t.jsonl", episodes, train_s=0.3, engine=engine, batch=8, group=2)
    flags = ("--plan-slots", "8", "--bounds", "1", "--steps", "12")
    out = plan(tmp_path, trace, *flags, "--policies", "drop", "mask", "cut")
    rows = {(r["design"], r["policy"]): r for r in out["rows"]}
    assert len(rows) == 1 + 3 * 2  # synchronous, then bound 1 partial and drain under each policy
    assert rows[("synchronous", None)]["wasted_share"] == 0.0
    for (design, policy), r in rows.items():
        if policy is not None:
            assert r["staleness_max"] <= 1, (design, policy)  # the hard bound holds for every policy
    drop, mask = rows[("async bound 1, partial", "drop")], rows[("async bound 1, partial", "mask")]
    assert drop["dropped"] > 0 and drop["wasted_share"] > 0
    assert mask["dropped"] == 0 and 0 < mask["wasted_share"]
    assert rows[("async bound 1, partial", "cut")]["cut"] > 0
    # the throttle alone, as before: no policy, and the long episodes train staler than the bound
    alone = {r["design"]: r for r in plan(tmp_path, trace, *flags)["rows"]}
    assert alone["async bound 1, partial"]["policy"] is None
    assert alone["async bound 1, partial"]["staleness_max"] > 1
    main(["--trace", str(trace), *flags, "--policies", "mask"])
    assert "| mask " in capsys.readouterr().out
    # the plot draws one line per design and policy, the waste beside the throughput
    from lrl_lab.sim.turns import plan_series

    series, right = plan_series(out["rows"])
    assert right.startswith("wasted") and len(series) == len(rows)
    assert series["async bound 1, partial, mask"] == [(8, mask["episodes_per_s"], 100 * mask["wasted_share"])]
    assert plan_series(plan(tmp_path, trace, *flags)["rows"])[1].startswith("mean token staleness")
    assert main(["--trace", str(trace), *flags, "--policies", "drop", "mask", "--plot", str(tmp_path)]) == 0
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert main(["--trace", str(trace), *flags, "--policies", "pace"]) == 2
    assert "unknown staleness policy ['pace']" in capsys.readouterr().err
    wall = tmp_path / "wall.csv"
    wall.write_text("duration_s\n1.0\n2.0\n")
    with pytest.raises(SystemExit):
        main(["--trace", str(wall), "--policies", "mask"])
    assert "--policies plans from a turn trace" in capsys.readouterr().err


def test_a_turn_trace_with_a_pool_of_tool_servers_queues_its_calls(tmp_path, capsys):
    # 4 episodes of 1 token then a 1 s tool, on 4 slots, a batch of 4: with every call at once a synchronous step
    # is 0.1 + 1 + 0.5 s; with one server the fourth call answers at 0.1 + 4 s
    engine = {"points": [[1, 0.1], [4, 0.1]]}
    episodes = [[[1, 1.0]]] * 8
    free = write_turns(tmp_path / "f.jsonl", episodes, train_s=0.5, engine=engine, batch=4, group=4)
    one = write_turns(
        tmp_path / "o.jsonl", episodes, train_s=0.5, engine=engine, batch=4, group=4, tool_servers=1
    )
    flags = ("--plan-slots", "4", "--bounds", "1", "--steps", "3")
    sync = lambda out: {r["design"]: r for r in out["rows"]}["synchronous"]  # noqa: E731
    assert sync(plan(tmp_path, free, *flags))["episodes_per_s"] == pytest.approx(4 / 1.6)
    assert sync(plan(tmp_path, one, *flags))["episodes_per_s"] == pytest.approx(4 / 4.6)
    given = sync(plan(tmp_path, free, *flags, "--tool-servers", "1"))  # the option gives the same pool
    assert given["episodes_per_s"] == pytest.approx(4 / 4.6)
    bad = write_turns(tmp_path / "b.jsonl", episodes, train_s=0.5, engine=engine, tool_servers=0.5)
    assert main(["--trace", str(bad)]) == 2
    assert "tool_servers is 0.5; it must be an integer >= 1" in capsys.readouterr().err


def test_a_turn_trace_plans_in_windows_where_asked_or_where_the_slots_are_many(tmp_path, capsys):
    # the same plan event by event and in windows agrees; auto takes windows from WINDOWED_FROM slots a worker,
    # and a policy the windowed model does not cover is refused by name
    from lrl_lab.sim import turns

    episodes = [[[2 + i % 5, 0.3 * (1 + i % 3)], [4, 0.5]] for i in range(64)]
    trace = write_turns(tmp_path / "t.jsonl", episodes, train_s=0.5, engine={"points": [[1, 0.01], [16, 0.03]]},
                        batch=16, group=4)  # fmt: skip
    flags = ("--plan-slots", "16", "--bounds", "1", "2", "--steps", "6")
    event = plan(tmp_path, trace, *flags, "--model", "event")["rows"]
    windowed = plan(tmp_path, trace, *flags, "--model", "windowed")["rows"]
    assert {r["model"] for r in event} == {"event"} and {r["model"] for r in windowed} == {"windowed"}
    for e, w in zip(event, windowed):
        assert e["design"] == w["design"]
        # (the event model's worker may wait out a 0.1 s slice while all its episodes wait for tools; here it does
        # not lose its throughput to that, and the two models agree within 0.1%)
        assert w["episodes_per_s"] == pytest.approx(e["episodes_per_s"], rel=0.01), e["design"]
    assert {r["model"] for r in plan(tmp_path, trace, *flags)["rows"]} == {"event"}  # auto, 16 slots: events
    big = turns.plan_turns(
        turns.read_turn_trace(str(trace)), [turns.WINDOWED_FROM], [1], 2, batch=turns.WINDOWED_FROM
    )
    assert {r["model"] for r in big} == {"windowed"}
    seen = []
    turns.plan_turns(turns.read_turn_trace(str(trace)), [16], [1], 2, progress=lambda *a: seen.append(a[:2]))
    assert seen == [(1, 3), (2, 3), (3, 3)]  # one report a row: the command prints it for plans of minutes
    main(["--trace", str(trace), *flags, "--model", "windowed"])
    assert "w: simulated in windows" in capsys.readouterr().out
    assert main(["--trace", str(trace), *flags, "--model", "windowed", "--policies", "mask"]) == 2
    assert "mask needs the event model" in capsys.readouterr().err
