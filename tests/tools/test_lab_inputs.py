"""The lab's commands check every file and shared option they are given before any run, each refusal one line
and exit status 2 (never a traceback, never after minutes of runs); what one lab command writes, the next takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FAST, train

from lrl_lab.experiments import (
    designs,
    designs_predict,
    engine_cost,
    occupancy,
    pipeline,
    scaling,
    seeds,
    staleness,
)
from lrl_lab.sim import cli as sim


def no_runs(monkeypatch):
    """Every way a lab command starts work, replaced by a failure: a refusal must come before any of them."""

    def started(*args, **kwargs):
        raise AssertionError("a run started before the inputs were checked")

    for target in ("lrl_lab.experiments.pipeline.run_once", "lrl_lab.experiments.pipeline.co_run_slowdown",
                   "lrl_lab.experiments.designs.run_once", "lrl_lab.experiments.engine_cost.engine_curve",
                   "lrl_lab.experiments.calibrate.co_run_slowdown", "lrl_lab.sim.turns.plan_turns",
                   "lrl_lab.sim.planner.plan_rows", "lrl_lab.experiments.staleness.write_tables",
                   "lrl_lab.experiments.scaling.measure", "lrl_lab.experiments.occupancy.decomposition"):  # fmt: skip
        monkeypatch.setattr(target, started)


def refused(main, argv: list[str], capsys, *needles: str) -> str:
    """`main(argv)` ends with status 2 and one line on stderr holding every needle -> that line."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, (code, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for needle in needles:
        assert needle in err, (needle, err)
    return lines[0]


def calibration(**changes) -> dict:
    """A calibration as engine_cost writes it (engine part, co-run slowdown, one run), with `changes` applied
    (a value None removes the key; "runs.KEY" changes the run)."""
    run = {"file": "h.jsonl", "turns": [[[4, 0.1], [3, 0.0]], [[5, 0.2]]], "train_s": 0.3,
           "trainer_measured": "alone (synchronous run)", "steps": 6, "skip": 2}  # fmt: skip
    cal = {"engine": {"points": [[1, 0.01], [4, 0.02]], "counts": [5, 5], "switch_s": 0.01},
           "co_run": {"alone_s": 1.0, "together_s": 1.2, "slowdown": 1.2}, "runs": [run]}  # fmt: skip
    for key, value in changes.items():
        where, key = (run, key[5:]) if key.startswith("runs.") else (cal, key)
        if value is None:
            where.pop(key)
        else:
            where[key] = value
    return cal


def write(tmp_path: Path, name: str, content) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# -- python -m lrl_lab.experiments.pipeline ------------------------------------------------------------------
@pytest.mark.parametrize(
    "case, content, needle",
    [
        ("not JSON", "this is not a calibration\n", "not JSON"),
        ("a key missing", calibration(runs=None), "runs"),
        ("an engine curve of NaN", '{"engine": {"points": [[1, NaN]]}, "co_run": {"slowdown": 1.0}, "runs": []}',
         "NaN"),
        ("a run without turns", calibration(**{"runs.turns": None}), "turns"),
    ],
)  # fmt: skip
def test_pipeline_predict_from_is_read_before_any_run(tmp_path, monkeypatch, capsys, case, content, needle):
    no_runs(monkeypatch)
    path = write(tmp_path, "cal.json", content)
    argv = ["--designs", "chapter", "--predict-from", path, "--out", str(tmp_path / "out"), "--repeats", "1"]
    refused(pipeline.main, argv, capsys, path, needle)


def test_pipeline_per_seed_calibrations_are_all_read_before_any_run(tmp_path, monkeypatch, capsys):
    no_runs(monkeypatch)
    write(tmp_path, "cal-r0.json", calibration())
    write(tmp_path, "cal-r1.json", calibration(co_run=None))
    pattern = str(tmp_path / "cal-r{seed}.json")
    argv = [
        "--designs",
        "chapter",
        "--predict-from",
        pattern,
        "--out",
        str(tmp_path / "out"),
        "--repeats",
        "3",
    ]
    refused(pipeline.main, argv, capsys, "cal-r1.json", "co_run")
    write(tmp_path, "cal-r1.json", calibration())
    refused(pipeline.main, argv, capsys, "no calibration for seed 2")


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--stale-policy", "ordered", "--take-patience", "1e308"], "between -1e308 and 1e308"),
        (["--stale-policy", "ordered", "--take-patience", "-1"], ">= 0"),
        (["--stale-policy", "ordered", "--take-patience", "nan"], "take-patience"),
        (["--stale-policy", "ordered", "--take-patience-steps", "inf"], "take-patience-steps"),
        (["--take-patience", "1"], "--stale-policy ordered"),
        (["--json", "FOLDER"], "is a folder"),
        (["--out", "FILE"], "is a file"),
    ],
)
def test_pipeline_options_follow_train_py_and_outputs_are_checked_first(
    tmp_path, monkeypatch, capsys, extra, needle
):
    no_runs(monkeypatch)
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("x")
    extra = [str(tmp_path / x) if x in ("FOLDER", "FILE") else x for x in extra]
    out = [] if "--out" in extra else ["--out", str(tmp_path / "out")]
    refused(pipeline.main, ["--designs", "chapter", "--repeats", "1", *out, *extra], capsys, needle)


def test_pipeline_report_reads_its_files_as_one_line(tmp_path, monkeypatch, capsys):
    no_runs(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    write(out, "pipeline.json", "{not json")
    refused(
        pipeline.main, ["--report", "--out", str(out), "--repeats", "1"], capsys, "pipeline.json", "not JSON"
    )
    write(out, "pipeline.json", {"rows": [], "co_run": {"slowdown": 1.1}})
    refused(
        pipeline.main, ["--report", "--out", str(out), "--repeats", "1"], capsys, "sync-r0.jsonl", "missing"
    )


# -- python -m lrl_lab.experiments.engine_cost ---------------------------------------------------------------
@pytest.mark.parametrize(
    "case, content, needle",
    [
        ("not JSON", "garbage\n", "not JSON"),
        ("not objects", "[1, 2]\n[3]\n", "not a JSON object"),
        ("a history of another kind", '{"step": 0, "time/end": 1.0, "time/sample": 0.5}\n' * 6, "finished_turns"),
        ("empty", "", "no steps"),
        ("a calibration", json.dumps(calibration()) + "\n", "finished_turns"),
        ("too few steps", '{"time/end": 1.0, "time/sample": 0.5, "time/finished_turns": [[0, [[4, 0.1]]]]}\n',
         "steps"),
        ("nulls where times are", '{"time/end": null, "time/sample": 0.5, "time/finished_turns": [[0, [[4, 0.1]]]]}\n'
         * 6, "time/end"),
    ],
)  # fmt: skip
def test_engine_cost_run_that_is_not_a_usable_history_is_one_line_before_timing(
    tmp_path, monkeypatch, capsys, case, content, needle
):
    no_runs(monkeypatch)
    history = write(tmp_path, "h.jsonl", content)
    engine = write(tmp_path, "engine.json", {k: v for k, v in calibration().items() if k != "runs"})
    argv = ["--engine", engine, "--run", history, "--json", str(tmp_path / "cal.json")]
    refused(engine_cost.main, argv, capsys, history, needle)
    argv = ["--run", history, "--json", str(tmp_path / "cal.json")]  # without --engine: before the timing
    refused(engine_cost.main, argv, capsys, history, needle)


@pytest.mark.parametrize(
    "content, needle",
    [("{", "not JSON"), (json.dumps({"co_run": {"slowdown": 1.0}}), "engine"),
     (json.dumps({"engine": calibration()["engine"]}), "co_run")],
)  # fmt: skip
def test_engine_cost_engine_file_and_json_output_are_checked_first(
    tmp_path, monkeypatch, capsys, content, needle
):
    no_runs(monkeypatch)
    engine = write(tmp_path, "engine.json", content)
    refused(
        engine_cost.main, ["--engine", engine, "--json", str(tmp_path / "cal.json")], capsys, engine, needle
    )
    (tmp_path / "folder").mkdir()
    refused(engine_cost.main, ["--json", str(tmp_path / "folder")], capsys, "--json", "is a folder")


# -- python -m lrl_lab.sim -------------------------------------------------------------------------------------
@pytest.mark.timeout(120)  # a NaN trainer time once made the simulation loop for ever
@pytest.mark.parametrize(
    "case, changes, needle",
    [
        ("no engine", {"engine": None}, "engine"),
        ("no co_run", {"co_run": None}, "co_run"),
        ("no runs", {"runs": None}, "runs"),
        ("empty runs", {"runs": []}, "runs"),
        ("no train_s", {"runs.train_s": None}, "train_s"),
        ("a negative train_s", {"runs.train_s": -1.0}, "train_s"),
        ("a NaN train_s", {"runs.train_s": "NaN"}, "NaN"),
        ("a slowdown of zero", {"co_run": {"slowdown": 0}}, "co_run"),
    ],
)
def test_sim_calibration_that_cannot_be_used_is_one_line(
    tmp_path, monkeypatch, capsys, case, changes, needle
):
    no_runs(monkeypatch)
    nan = changes.get("runs.train_s") == "NaN"
    text = json.dumps(calibration(**({"runs.train_s": 12345.5} if nan else changes)))
    path = write(tmp_path, "cal.json", text.replace("12345.5", "NaN") if nan else text)
    refused(
        sim.main,
        ["--trace", path, "--plan-slots", "4", "--bounds", "1", "--steps", "3"],
        capsys,
        path,
        needle,
    )


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--policies", "ordered", "--take-patience", "-1"], ">= 0"),
        (["--policies", "ordered", "--take-patience", "nan"], "take-patience"),
        (["--policies", "ordered", "--take-patience", "1e308"], "between -1e308 and 1e308"),
        (["--policies", "drop", "--take-patience", "1"], "--policies ordered"),
        (["--take-patience-steps", "1"], "--policies ordered"),
        (["--json", "FOLDER"], "is a folder"),
        (["--plot", "FILE"], "is a file"),
        (["--engine-step", "nan", "0"], "--engine-step"),
    ],
)
def test_sim_options_follow_train_py_and_outputs_are_checked_first(
    tmp_path, monkeypatch, capsys, extra, needle
):
    no_runs(monkeypatch)
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("x")
    extra = [str(tmp_path / x) if x in ("FOLDER", "FILE") else x for x in extra]
    path = write(tmp_path, "cal.json", calibration())
    refused(sim.main, ["--trace", path, "--plan-slots", "4", "--steps", "3", *extra], capsys, needle)


# -- the other lab commands --------------------------------------------------------------------------------
def test_occupancy_staleness_seeds_and_scaling_check_their_files_first(tmp_path, monkeypatch, capsys):
    no_runs(monkeypatch)
    cal = write(tmp_path, "cal.json", calibration())
    bad = write(tmp_path, "bad.json", "{")
    runs = tmp_path / "runs"
    (runs / "histories").mkdir(parents=True)
    write(runs / "histories", f"{designs.file_name(designs.SHORT['partial2'])}-r0.jsonl", "{")
    refused(occupancy.main, ["--runs", str(runs), "--predict-from", bad], capsys, bad, "not JSON")
    refused(occupancy.main, ["--runs", str(tmp_path / "nowhere"), "--predict-from", cal], capsys, "nowhere")
    refused(occupancy.main, ["--runs", str(runs), "--predict-from", cal], capsys, "-r0.jsonl", "not JSON")
    refused(occupancy.main, ["--runs", str(runs), "--predict-from", cal, "--png", str(runs)], capsys, "--png")
    refused(staleness.main, ["--from-results", bad], capsys, bad, "not JSON")
    refused(staleness.main, ["--from-results", write(tmp_path, "r.json", {"a": 1})], capsys, "r.json", "list")
    refused(staleness.main, ["--out", cal, "--seeds", "1"], capsys, "--out", "is a file")
    refused(seeds.main, ["--out", cal, "--seeds", "1"], capsys, "--out", "is a file")
    refused(scaling.main, ["--out", cal], capsys, "--out", "is a file")
    refused(scaling.main, ["--report", "--out", str(tmp_path / "nowhere")], capsys, "no measured histories")


# -- what one lab command writes, the next takes -------------------------------------------------------------
def test_a_calibration_engine_cost_writes_from_a_real_run_is_taken_by_the_simulator_and_the_designs(
    tmp_path, capsys
):
    history = tmp_path / "h.jsonl"
    out = train(*FAST, "--max-steps", "5", "--slots", "4", "--history-file", str(history),
                "--log-dir", str(tmp_path / "r"))  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    # the engine part of an earlier calibration, whose co-run slowdown came out below 1 (measurement noise)
    engine = write(tmp_path, "engine.json", {"engine": calibration()["engine"],
                                             "co_run": {"alone_s": 1.0, "together_s": 0.84, "slowdown": 0.84}})  # fmt: skip
    cal = tmp_path / "cal.json"
    assert engine_cost.main(["--engine", engine, "--run", str(history), "--json", str(cal)]) == 0
    assert json.loads(cal.read_text())["co_run"]["slowdown"] == 0.84  # written as measured
    capsys.readouterr()
    plan = tmp_path / "plan.json"
    argv = ["--trace", str(cal), "--plan-slots", "4", "--bounds", "1", "--steps", "3", "--json", str(plan)]
    assert sim.main(argv) == 0, capsys.readouterr().err
    assert json.loads(plan.read_text())["rows"]
    run = {"design": designs.SHORT["partial2"], "history": [], "steps": 6, "slots": 4}
    predicted = designs_predict.predicted_from(run, True, designs_predict.calibration_of(str(cal)))
    assert predicted["episodes_per_s"] > 0


def test_train_py_states_its_rule_for_a_float_too_large(tmp_path):
    out = train(*FAST, "--pipeline", "async", "--stale-policy", "ordered", "--take-patience", "1e308",
                "--log-dir", str(tmp_path / "r"))  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert (
        "take_patience: 1e+308 is not allowed; it must be a finite number strictly between -1e308 and 1e308"
        in (out.stderr)
    ), out.stderr
