"""decide keeps every run and pools only like with like: what makes a run is in its record, runs of another setting
are named and left out, a damaged line is named and skipped, bad input is one line and exit 2 before any run, and a
signal ends the runs in flight at once and keeps every finished one."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import without_counts

from lrl_lab.experiments import records
from lrl_lab.experiments.decide import main, parse_rows

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--", "--env", "tinyagent", "--max-steps", "1"]


def record(row, seed, greedy, flags="", **more):
    return {"row": row, "flags": flags, "seed": seed, "greedy_first": 0.0, "greedy": greedy, "sampled": greedy,
            "reward": greedy, "mismatch": 0.0, "over_cap": 0.0, "wall": 60.0, **more}  # fmt: skip


def write(path, runs, end="\n"):
    path.write_text("".join(json.dumps(r) + "\n" for r in runs[:-1]) + json.dumps(runs[-1]) + end)
    return path


def test_a_row_of_other_flags_already_in_the_folder_is_refused_not_pooled(tmp_path, capsys):
    write(tmp_path / "results.jsonl", [record("a", 0, 0.5, flags="--sampler lagged --lag 2")])
    code = main(["--rows", "a=", "--seeds", "2", "--samples", "0", "--out", str(tmp_path), *TINY])
    err = capsys.readouterr().err
    assert code == 2
    assert "holds row 'a' seed 0 made otherwise: row flags '--sampler lagged --lag 2' (the row's: '')" in err
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 1  # nothing ran


def test_a_run_of_other_shared_flags_is_refused_by_its_settings(tmp_path, capsys):
    from lrl.arguments import parse_args
    from lrl_lab.experiments.decide import run_argv

    other = records.settings(parse_args(run_argv(["--env", "tinyagent", "--max-steps", "2"], "", 0, 1)))
    write(tmp_path / "results.jsonl", [record("a", 0, 0.5, shared_flags="--env tinyagent --max-steps 2",
                                              settings=other)])  # fmt: skip
    code = main(
        ["--rows", "a=", "--seeds", "1", "--threads", "1", "--samples", "0", "--out", str(tmp_path), *TINY]
    )
    assert code == 2
    assert "seed 0 made otherwise: max_steps 2 (the row's: 1)" in capsys.readouterr().err


def test_runs_of_two_machines_in_one_file_pool_one_setting_and_name_the_rest(tmp_path, capsys):
    here = [record("a", s, 0.1, machine="M1") for s in range(5)]
    there = [record("a", s, 0.9, machine="M2") for s in range(3)]
    path = write(tmp_path / "results.jsonl", here + there)
    assert main(["--from-results", str(path), "--metric", "greedy"]) == 0
    out = capsys.readouterr().out
    assert "| a | 5 | 0.100 ± 0.000 | 0.100 ± 0.000 |" in without_counts(out)  # M1's five, none of M2's
    assert "- row 'a': 3 run(s) left out" in out and "machine M2 (the row's: M1)" in out


def test_runs_of_other_training_code_are_neither_pooled_in_a_row_nor_paired_across_rows(tmp_path, capsys):
    base = [record("base", s, 0.2, code="c0de") for s in range(4)]
    row = [record("b", s, 0.5, code="c0de") for s in range(3)] + [record("b", 3, 0.9, code="ed17")]
    old = [record("b", s, 0.7, code="0ld0") for s in (0, 1)]  # the row's fewer runs of other code
    path = write(tmp_path / "results.jsonl", base + row + old)
    assert main(["--from-results", str(path), "--metric", "greedy", "--baseline", "base"]) == 0
    out = capsys.readouterr().out
    # row b pools its most numerous code (c0de's 3 seeds); the others are named
    assert "| b | 3 | 0.500 ± 0.000 |" in without_counts(out)
    assert "code ed17 (the row's: c0de)" in out and "code 0ld0 (the row's: c0de)" in out
    # the difference from base pairs those three seeds, all of one code
    assert "| b | 3 | 0.300 ± 0.000 |" in without_counts(out)
    assert records.difference(record("b", 0, 0.1, code="ed17"), record("b", 0, 0.1, code="c0de")).startswith(
        "code"
    )


def test_a_seed_whose_two_rows_ran_other_code_is_not_paired_and_said_so():
    from lrl_lab.experiments.decide_tables import markdown

    runs = [record("base", s, 0.2, code="c0de") for s in range(3)]
    runs += [
        record("b", 0, 0.5, code="c0de"),
        record("b", 1, 0.5, code="c0de"),
        record("b", 2, 0.9, code="ed17"),
    ]
    text = markdown(runs, ["base", "b"], "base", 0.1, "greedy")
    assert "| b | 2 | 0.300 ± 0.000 |" in without_counts(text)  # seeds 0 and 1: seed 2's two runs are of other code
    assert (
        "- b - base: seed(s) 2 not paired: their runs were made by other training code (ed17 and c0de)"
        in text
    )


def test_a_line_whose_row_flags_differ_from_the_rows_is_left_out_and_named(tmp_path, capsys):
    runs = [record("lag 8", s, 0.2, flags="--sampler lagged --lag 8") for s in range(3)]
    runs.append(record("lag 8", 3, 0.9, flags="--lag 2 --sampler lagged"))
    path = write(tmp_path / "results.jsonl", runs)
    assert (
        main(["--from-results", str(path), "--rows", "lag 8=--lag 8 --sampler lagged", "--metric", "greedy"])
        == 0
    )
    out = capsys.readouterr().out  # the same options in another order are the same row
    assert "| lag 8 | 3 | 0.200" in without_counts(out)
    assert "seed 3 (row flags '--lag 2 --sampler lagged', not '--lag 8 --sampler lagged')" in out


def test_a_seed_run_twice_in_one_setting_counts_once_and_the_earlier_is_named(tmp_path, capsys):
    path = write(tmp_path / "results.jsonl", [record("a", 0, 0.1), record("a", 1, 0.3), record("a", 0, 0.5)])
    assert main(["--from-results", str(path), "--metric", "greedy"]) == 0
    out = capsys.readouterr().out
    assert "| a | 2 | 0.400" in without_counts(out) and "seed 0 (an earlier run of the same seed and setting)" in out


def test_a_label_given_twice_is_refused(capsys):
    with pytest.raises(ValueError, match="the label 'a' is given twice"):
        parse_rows(["a=", "a=--sampler lagged --lag 2"])
    with pytest.raises(ValueError, match="'on-policy' is given twice"):
        parse_rows(["core", "fast"])
    with pytest.raises(SystemExit) as stop:
        main(["--rows", "a=", "a=--sampler lagged --lag 2", "--from-results", "x.jsonl"])
    assert stop.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_damaged_or_cut_line_is_named_and_skipped_and_the_next_record_starts_a_line_of_its_own(
    tmp_path, capsys
):
    path = tmp_path / "results.jsonl"
    good = [record("a", 0, 0.2), record("a", 1, 0.4)]
    path.write_text(json.dumps(good[0]) + "\n{not json\n" + json.dumps(good[1]) + "\n" + '{"row": "a", "se')
    assert main(["--from-results", str(path), "--metric", "greedy"]) == 0
    said = capsys.readouterr()
    assert "| a | 2 | 0.300" in without_counts(said.out)
    damaged = [line for line in said.err.splitlines() if "skipped" in line]
    assert len(damaged) == 2 and f"{path}:2: not a record" in damaged[0] and "cut short" in damaged[1]
    records.append(path, record("a", 2, 0.6))  # after a line cut short: a fresh line, the cut one left alone
    runs, damaged = records.read(path)
    assert [r["seed"] for r in runs] == [0, 1, 2] and len(damaged) == 2
    no_newline = write(tmp_path / "whole.jsonl", good, end="")  # a whole last record without its newline
    records.append(no_newline, record("a", 2, 0.6))
    assert [r["seed"] for r in records.read(no_newline)[0]] == [0, 1, 2]


@pytest.mark.parametrize("make", ["a file", "under /proc", "in /proc"])
def test_an_out_that_cannot_hold_the_results_is_one_line_before_any_run(tmp_path, capsys, make):
    out = {"a file": tmp_path / "f", "under /proc": Path("/proc/lrl-no/such"), "in /proc": Path("/proc")}[
        make
    ]
    if make == "a file":
        out.write_text("mine")
    code = main(["--rows", "a=", "--seeds", "1", "--samples", "0", "--out", str(out), *TINY])
    said = capsys.readouterr()
    assert code == 2 and "started" not in said.out
    (line, last) = said.err.strip().splitlines()
    assert line.startswith(f"decide: --out {out}: ") and "nothing was run" in last
    assert make != "a file" or out.read_text() == "mine"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--first-seed", "2147483647", "--seeds", "2"], "seeds run from 2147483647 to 2147483648"),
        (["--first-seed", "-1"], "train.py takes seeds 0 to"),
        (["--seeds", "1000000000"], "--seeds 1000000000: at most 10000"),
        (["--effect", "nan"], "--effect nan"),
        (["--effect", "-0.1"], "--effect -0.1"),
        (["--learned", "inf"], "--learned inf"),
        (["--from-results", "/no/such.jsonl"], "/no/such.jsonl does not exist"),
        (["--from-results", "/tmp"], "/tmp is not a file"),
        (["--from-results", "EMPTY"], "holds no run"),
        (["--from-results", "GOOD", "--plot", "/proc/lrl.png"], "--plot /proc: cannot write there"),
        (["--from-results", "GOOD", "--plot", "FOLDER.png"], "a folder; name the figure's file"),
        (["--from-results", "GOOD", "--plot", "x.gif"], "must end in .png"),
        (["--from-results", "GOOD", "--baseline", "b"], "--baseline: 'b' is not one of the rows"),
        (["--rows", "=--lag 2"], "has no label"),
        (["--samples", "1000000"], "--samples 1000000: at most 1000"),
        (["--out", ""], "--out: an empty path"),
    ],
)
def test_bad_input_to_the_harness_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    (tmp_path / "empty.jsonl").write_text("")
    write(tmp_path / "good.jsonl", [record("a", 0, 0.2)])
    (tmp_path / "FOLDER.png").mkdir()
    names = {"EMPTY": "empty.jsonl", "GOOD": "good.jsonl", "FOLDER.png": "FOLDER.png"}
    argv = [str(tmp_path / names[a]) if a in names else a for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as stop:
        main([*argv, *out, *TINY])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.early
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)]
)  # SIGTERM takes the same path as SIGINT (runner.stop_on_signals): 38 s on 2 cores, out of the default run
def test_a_signal_ends_the_runs_in_flight_at_once_and_keeps_the_finished_ones(tmp_path, signum):
    """One run finishes while the other is inside a step of five minutes; the signal then ends the command in
    seconds, in one line, with the finished run kept and the other one to run again."""
    step_file = tmp_path / "in-the-long-step"
    plugins = os.pathsep.join([str(ROOT / "tests" / "plugins"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, LRL_TEST_STEP_FILE=str(step_file), LRL_TEST_STEP_SECONDS="300", PYTHONPATH=plugins)
    argv = [sys.executable, "-m", "lrl_lab.experiments.decide", "--rows", "quick=",
            "slow=--plugins long_step --callbacks long_step", "--seeds", "1", "--jobs", "2", "--threads", "1",
            "--samples", "0", "--out", str(tmp_path), "--", "--env", "tinyagent", "--max-steps", "2", "--tasks-per-step",
            "2", "--episodes-per-task", "4", "--eval-episodes", "1", "--eval-at-start", "false"]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    results = tmp_path / "results.jsonl"
    deadline = time.monotonic() + 240
    while not (step_file.exists() and results.exists() and results.read_text().endswith("\n")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    sent = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 20  # not the 300 s the slow run's step would have taken
    assert proc.returncode == 128 + signum, err
    lines = [line for line in err.splitlines() if line.startswith("decide:")]  # the runs' own lines aside
    assert len(lines) == 1 and lines[0].startswith("decide: stopped by SIG"), err
    assert "1 run(s) of this command finished and are kept" in lines[0] and "1 in flight ended" in lines[0]
    assert "Traceback" not in out + err and "leaked" not in err
    (kept,) = records.read(results)[0]
    assert (kept["row"], kept["seed"]) == ("quick", 0)


@pytest.mark.parametrize(
    "row, says",
    [
        ("a=--seed 5", "--seed is set for every run by --first-seed and --seeds"),
        ("a=--threads=4", "--threads is set for every run by --threads"),
        ("a=--system-prompt 'unclosed", "its flags do not parse (No closing quotation)"),
    ],
)
def test_row_flags_decide_would_override_or_cannot_split_are_refused_before_any_run(
    tmp_path, capsys, row, says
):
    code = main(["--rows", row, "--seeds", "1", "--samples", "0", "--out", str(tmp_path / "out"), *TINY])
    err = capsys.readouterr().err
    assert code == 2 and f"decide: row 'a' ({row[2:]}): {says}" in err and "nothing was run" in err
    assert not (tmp_path / "out").exists()


def test_a_quoted_row_flag_reaches_the_run_as_one_word():
    from lrl_lab.experiments.decide import run_argv

    argv = run_argv(["--env", "tinyagent"], "--system-prompt 'two words'", 0, 1)
    assert argv[2:4] == ["--system-prompt", "two words"]
