"""Tests of the pipeline simulator: the reference chapter's printed numbers (quoted in docs/simulate.md), agreement with a
slot-scanning reference of the same rules, the extensions, bad input, and the command line."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lrl_lab.sim import agent_episode_durations, exponential_durations, harmonic, simulate_pipeline
from lrl_lab.sim.cli import main
from lrl_lab.sim.reference import scan_reference
from lrl_lab.sim.tables import DESIGNS, Setup, duration_lines, failure_lines, sync_lines, timeout_lines

NUMBER = re.compile(r"\d+(?:\.\d+)?%?")


@pytest.fixture(scope="module")
def durations() -> torch.Tensor:
    """The reference pool: 65,536 durations from a CPU generator seeded 0 -> [65536] s."""
    return agent_episode_durations(65_536, torch.Generator().manual_seed(0))


SETUP = Setup()  # 64 slots, 64 episodes per step, 60 s training, 10 s sync, 20 steps

# Expected numbers, copied from the outputs the reference chapter prints (never from this code). Each line of a table is
# given as (its length in characters, the numbers on it, left to right), which pins both digits and layout.
SPEC_DURATIONS = [  # durations
    (59, ["96", "68", "90", "215", "99", "430", "624"]),
    (57, ["8", "251", "2.6"]),
    (57, ["64", "415", "4.3"]),
    (57, ["512", "515", "5.4"]),
]
SPEC_DESIGNS = {  # designs: episodes/hour, slot util, staleness mean, max, trained episode mean (s)
    "synchronous": ["451", "0.19", "0.00", "0", "97.7"],
    "one step ahead, drain": ["506", "0.22", "0.95", "1", "97.7"],
    "async eta=1, partial": ["1836", "0.81", "0.93", "5", "94.1"],
    "async eta=2, partial": ["2077", "0.95", "1.50", "7", "93.2"],
    "async eta=4, drain": ["490", "0.25", "3.19", "4", "97.7"],
}
SPEC_TIMEOUT = [  # timeout: (episodes/hour, slot utilization) without and with a timeout at p95
    (83, ["451", "0.19"]),
    (83, ["95", "279", "661", "0.27"]),
    (39, ["5.0%"]),
]
SPEC_SYNC = {1.0: ["459", "2261"], 10.0: ["451", "2077"], 60.0: ["410", "1432"]}  # sync cost
SPEC_FAILURE = [(53, ["4.5%", "10%", "13.6%"]), (40, ["96", "92"])]  # failures, mtbf 2,000 s, seed 1


def _shape(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Each line as (length, its numbers)."""
    return [(len(line), NUMBER.findall(line)) for line in lines]


# ----------------------------------------------------------------------------------------------------------
# The reference tables, digit for digit


def test_duration_table(durations):
    assert _shape(duration_lines(durations, [8, 64, 512])) == SPEC_DURATIONS


def test_designs_match_spec(durations):
    for name, kw in DESIGNS.items():
        r = SETUP.run(durations, **kw)
        got = [
            f"{r['throughput']:.0f}",
            f"{r['gen_util']:.2f}",
            f"{r['staleness_mean']:.2f}",
            str(r["staleness_max"]),
            f"{r['trained_duration']:.1f}",
        ]
        assert got == SPEC_DESIGNS[name], name


def test_timeout_sync_and_failure_tables(durations):
    assert _shape(timeout_lines(durations, SETUP, 0.95)) == SPEC_TIMEOUT
    sync = sync_lines(durations, SETUP, [1.0, 10.0, 60.0], eta=2)
    assert [NUMBER.findall(line)[1:] for line in sync[1:]] == list(SPEC_SYNC.values())
    assert all(len(line) == 41 for line in sync[1:]) and len(sync[0]) == 68
    assert _shape(failure_lines(durations, 2000.0, seed=1)) == SPEC_FAILURE


def test_cli_prints_every_table(capsys):
    assert main([]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert _shape(lines[:4]) == SPEC_DURATIONS
    design_rows = lines[5:10]
    assert [row.split("|")[0].strip() for row in design_rows] == list(DESIGNS)
    assert [NUMBER.findall(row)[-5:] for row in design_rows] == list(SPEC_DESIGNS.values())
    assert len(lines[4]) == 99 and {len(row) for row in design_rows} == {79}
    assert _shape(lines[10:13]) == SPEC_TIMEOUT
    assert [NUMBER.findall(row)[1:] for row in lines[14:17]] == list(SPEC_SYNC.values())
    assert _shape(lines[17:19]) == SPEC_FAILURE
    assert len(lines) == 19


def test_figure_13_1_durations(durations):
    """The spec says the 4 steps of its 8-slot timelines take 1,130 s (synchronous) and 493 s (eta 1)."""
    small = Setup(8, 8, 60.0, 10.0, 4)
    assert f"{small.run(durations, max_staleness=0)['time']:,.0f}" == "1,130"
    assert f"{small.run(durations, max_staleness=1)['time']:,.0f}" == "493"


# ----------------------------------------------------------------------------------------------------------
# Agreement with a slot-scanning reference of the same rules


@st.composite
def pipelines(draw):
    n_slots, batch = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    eta, steps = draw(st.integers(0, 4)), draw(st.integers(1, 5))
    values = st.one_of(st.integers(0, 4).map(float), st.floats(0, 100, allow_nan=False, width=32))
    durs = draw(st.lists(values, min_size=(steps + eta) * batch, max_size=(steps + eta) * batch))
    train, sync = draw(st.sampled_from([0.0, 1.0, 2.5, 60.0])), draw(st.sampled_from([0.0, 0.1, 1.0, 10.0]))
    return durs, n_slots, batch, train, sync, eta, draw(st.booleans()), steps


@settings(max_examples=150, deadline=None)
@given(pipelines())
@example(([0.0, 0.0, 1.0], 1, 1, 0.0, 0.0, 2, False, 1))  # zero simulated time: refused, not divided by
def test_heap_simulator_equals_scan_reference(case):
    durs, *rest = case
    try:
        want = scan_reference(durs, *rest)
    except ZeroDivisionError:  # the run took no simulated time: the package refuses it
        with pytest.raises(ValueError):
            simulate_pipeline(torch.tensor(durs), *rest)
        return
    got = simulate_pipeline(torch.tensor(durs), *rest)
    for key, value in want.items():
        assert got[key] == value, key


@contextmanager
def thresholds(bulk_min: int, run_min: int, backoff: int):
    """The simulator with other bulk thresholds: (1, 1, 0) takes every end it can in bulk, huge ones none."""
    patch = dict(BULK_MIN=bulk_min, RUN_MIN=run_min, BULK_WORTH=backoff, BULK_BACKOFF=backoff)
    with mock.patch.multiple("lrl_lab.sim.pipeline", **patch):
        yield


@settings(max_examples=150, deadline=None)
@given(pipelines())
@example(([0.0, 0.0, 1.0], 1, 1, 0.0, 0.0, 2, False, 1))
@example(
    ([1.0, 3.0, 1.0, 2.0, 1.0, 2.0, 2.0, 2.0, 3.0, 2.0, 1.0, 1.0], 4, 2, 5.0, 1.0, 2, True, 3)
)  # bulk ties
def test_bulk_ends_equal_scan_reference(case):
    """The same check with every episode end that can be handled in bulk handled so, on any number of slots."""
    durs, *rest = case
    try:
        want = scan_reference(durs, *rest)
    except ZeroDivisionError:
        return
    with thresholds(1, 1, 0):
        got = simulate_pipeline(torch.tensor(durs), *rest)
    for key, value in want.items():
        assert got[key] == value, key


def test_bulk_and_single_ends_agree_on_the_extensions(durations):
    """Timeouts, the consumption bound and drain through the bulk path and one event at a time: the same."""
    cap = durations.quantile(0.9).item()
    for kw in (
        dict(max_staleness=2, timeout=cap),
        dict(max_staleness=3, consume_max_staleness=1),
        dict(max_staleness=4, interrupt=False),
    ):
        with thresholds(1, 1, 0):
            bulk = SETUP.run(durations, **kw)
        with thresholds(10**9, 10**9, 0):
            single = SETUP.run(durations, **kw)
        assert bulk == single and bulk == SETUP.run(durations, **kw)


def test_reference_agrees_on_the_spec_designs(durations):
    for kw in DESIGNS.values():
        want = scan_reference(
            durations[:2000].tolist(), 64, 64, 60.0, 10.0, kw["max_staleness"], kw.get("interrupt", True), 20
        )
        got = SETUP.run(durations, **kw)
        assert all(got[k] == v for k, v in want.items())


def test_simultaneous_ends_follow_start_order():
    """Slot 1 (started first) and slot 0 (restarted at t=5) both end at t=10: slot 1's episode comes first."""
    r = simulate_pipeline(
        torch.tensor([5.0, 10.0, 5.0, 1.0, 1.0, 1.0]), 2, 2, 1.0, 1.0, max_staleness=2, steps=1
    )
    gens = [e for e in r["events"] if e[0] == "gen"]
    assert gens[:3] == [("gen", 0, 0.0, 5.0, 0), ("gen", 1, 0.0, 10.0, 0), ("gen", 0, 5.0, 10.0, 0)]
    assert r["trained_duration"] == 7.5  # the batch is the 5 s and the 10 s episode, in that order


def test_partial_rollout_pushes_back_by_sync_time():
    """The 4 s episode on slot 1 is in flight during the sync from 2 s to 5 s, so it ends at 4 + 3 = 7 s."""
    r = simulate_pipeline(torch.tensor([1.0, 4.0, 1.0, 1.0]), 2, 1, 1.0, 3.0, max_staleness=1, steps=2)
    assert r["events"] == [
        ("gen", 0, 0.0, 1.0, 0),
        ("train", 0, 1.0, 2.0, 0),
        ("sync", 0, 2.0, 5.0, 0),
        ("gen", 0, 5.0, 6.0, 1),
        ("train", 0, 6.0, 7.0, 1),
        ("gen", 1, 0.0, 7.0, 0),
        ("sync", 0, 7.0, 10.0, 1),
    ]
    assert r["staleness_hist"] == [2] and r["time"] == 10.0 and r["in_flight"] == []
    drained = simulate_pipeline(torch.tensor([1.0, 4.0, 1.0, 1.0]), 2, 1, 1.0, 3.0, 1, False, steps=1)
    assert drained["events"][-1] == ("sync", 0, 4.0, 7.0, 0)  # drain: the sync waits for the 4 s episode


def test_events_and_metrics_are_consistent(durations):
    r = SETUP.run(durations, max_staleness=2)
    gens = [e for e in r["events"] if e[0] == "gen"]
    assert sum(r["staleness_hist"]) == r["trained"] == 20 * 64
    assert len([e for e in r["events"] if e[0] == "sync"]) == 20
    assert r["n_events"] == len(r["events"])
    assert r["started"] == len(gens) + len(r["in_flight"]) <= (20 + 2) * 64
    assert all(e[2] <= e[3] for e in r["events"])
    lean = SETUP.run(durations, max_staleness=2, keep_events=False)
    assert lean["events"] is None and lean["in_flight"] is None
    assert {k: v for k, v in lean.items() if k not in ("events", "in_flight")} == {
        k: v for k, v in r.items() if k not in ("events", "in_flight")
    }


def test_chunked_conversion_changes_nothing(durations):
    for kw in (dict(max_staleness=1), dict(max_staleness=2, failure_mtbf=500.0, timeout=200.0)):
        assert SETUP.run(durations, chunk=37, **kw) == SETUP.run(durations, **kw)


def test_a_run_that_takes_no_time_is_an_error():
    with pytest.raises(ValueError, match="no time"):
        simulate_pipeline(torch.zeros(8), 2, 2, 0.0, 0.0, steps=2)


# ----------------------------------------------------------------------------------------------------------
# Extensions


def test_consume_bound_caps_staleness_and_counts_discards(durations):
    free = SETUP.run(durations, max_staleness=1)
    bound = SETUP.run(durations, max_staleness=1, consume_max_staleness=1)
    assert free["staleness_max"] == 5 and bound["staleness_max"] <= 1
    assert bound["discarded"] > 0 and bound["trained"] == 20 * 64
    assert bound["throughput"] < free["throughput"]
    loose = SETUP.run(durations, max_staleness=1, consume_max_staleness=free["staleness_max"])
    assert loose["discarded"] == 0 and loose["throughput"] == free["throughput"]


def test_timeout_equals_clamped_durations(durations):
    cap = durations.quantile(0.95).item()
    r = SETUP.run(durations, timeout=cap)
    assert r["throughput"] == SETUP.run(durations.clamp(max=cap))["throughput"]
    assert r["truncated"] == int((durations[: r["started"]] > cap).sum())


def test_failures_are_reported_apart_and_bias_toward_short(durations):
    plain = SETUP.run(durations, max_staleness=2)
    r = SETUP.run(durations, max_staleness=2, failure_mtbf=500.0)
    fails = [e for e in r["events"] if e[0] == "fail"]
    assert r["failed"] == len(fails) > 0 and r["trained"] == 20 * 64
    assert r["failed_duration"] > plain["trained_duration"] > r["trained_duration"]
    never = SETUP.run(durations, max_staleness=2, failure_mtbf=1e15)
    assert never["failed"] == 0 and never["throughput"] == plain["throughput"]


def test_harmonic_and_exponential_step_time():
    assert harmonic(1) == 1.0 and math.isclose(harmonic(4), 25 / 12)
    # synchronous step = slowest episode + train + sync, exactly
    r = simulate_pipeline(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 1.0, 1.0]), 4, 4, 10.0, 1.0, steps=2)
    assert r["time"] == (4 + 11) + (5 + 11)
    m, b, steps = 96.0, 64, 200
    d = exponential_durations(b * steps, m, torch.Generator().manual_seed(0))
    step = simulate_pipeline(d, b, b, 60.0, 10.0, steps=steps, keep_events=False)["time"] / steps
    assert abs(step - (m * harmonic(b) + 70.0)) < 0.05 * step  # exercise 1: E[max] = m H_B ~ m ln B


def test_runs_at_scale_on_a_million_durations():
    d = torch.rand(1 << 20, generator=torch.Generator().manual_seed(0)) * 200.0
    r = simulate_pipeline(d, 2048, 2048, 60.0, 10.0, max_staleness=2, steps=20, keep_events=False)
    assert r["trained"] == 20 * 2048 and r["started"] <= 22 * 2048 and r["staleness_max"] >= 2


# ----------------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(n_slots=0), "n_slots"),
        (dict(batch_size=0), "batch_size"),
        (dict(steps=0), "steps"),
        (dict(train_time=-1.0), "train_time"),
        (dict(sync_time=-0.5), "sync_time"),
        (dict(sync_time=math.inf), "sync_time"),
        (dict(max_staleness=-1), "max_staleness"),
        (dict(consume_max_staleness=-1), "consume_max_staleness"),
        (dict(timeout=0.0), "timeout"),
        (dict(failure_mtbf=-5.0), "failure_mtbf"),
        (dict(n_slots=2.5), "n_slots"),
    ],
)
def test_bad_settings_name_the_argument(kwargs, name):
    base = dict(n_slots=4, batch_size=4, train_time=1.0, sync_time=1.0, steps=2)
    with pytest.raises(ValueError, match=name):
        simulate_pipeline(torch.ones(100), **{**base, **kwargs})


@pytest.mark.parametrize(
    ("durs", "pattern"),
    [
        (torch.tensor([1.0, float("nan"), 2.0]), r"durations must be finite; durations\[1\] is nan"),
        (torch.tensor([1.0, -2.0]), r"durations must be >= 0"),
        (torch.ones(3, 3), r"durations must be 1-D"),
        (torch.tensor([1.0, float("inf")]), r"durations must be finite"),
    ],
)
def test_bad_durations(durs, pattern):
    with pytest.raises(ValueError, match=pattern):
        simulate_pipeline(durs, 2, 2, 1.0, 1.0, steps=1)


def test_too_few_durations_says_how_many():
    with pytest.raises(ValueError, match=r"more than the 10 given .* at most 24 episodes"):
        simulate_pipeline(torch.ones(10), 4, 4, 1.0, 1.0, max_staleness=2, steps=4)
    with pytest.raises(ValueError, match=r"durations: the run needs more than the 10 given"):
        simulate_pipeline(torch.ones(10), 4, 4, 1.0, 1.0, max_staleness=2, steps=4, failure_mtbf=3.0)
    assert simulate_pipeline(torch.ones(24), 4, 4, 1.0, 1.0, max_staleness=2, steps=4)["trained"] == 16


def test_duration_model_bad_input():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="mean_turns"):
        agent_episode_durations(4, gen, mean_turns=1)
    with pytest.raises(ValueError, match="tokens_per_turn"):
        agent_episode_durations(4, gen, tokens_per_turn=(600, 100))


# ----------------------------------------------------------------------------------------------------------
# Command line


def test_cli_bad_input_is_a_usage_error(capsys):
    for argv, text in [
        (["--slots", "0"], "--slots"),
        (["--sync-time", "-1"], "--sync-time"),
        (["--n-durations", "100", "--steps", "5"], "durations"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert text in capsys.readouterr().err


def test_cli_single_run(capsys):
    assert main(["--single", "--max-staleness", "2", "--consume-max-staleness", "3", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "staleness histogram" in out and "discarded (too stale)" in out


def test_cli_writes_figures(tmp_path, capsys):
    argv = ["--n-durations", "4096", "--steps", "3", "--etas", "0", "1", "2", "--plot", str(tmp_path)]
    assert main(argv) == 0
    for stem in ("timelines", "staleness_throughput"):
        for ext in ("png", "svg"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 1000
    assert "timeline, synchronous" in capsys.readouterr().out


def test_import_is_light():
    code = (
        "import sys, lrl_lab.sim, lrl_lab.experiments.estimators; "
        "assert not {'transformers', 'matplotlib', 'lightning'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_simulator_does_not_import_the_experiments():
    """lrl_lab.sim is the library the experiments use; importing it (command line included) pulls none of them in."""
    code = (
        "import sys, lrl_lab.sim, lrl_lab.sim.cli; "
        "assert not [m for m in sys.modules if m.startswith('lrl_lab.experiments')], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
