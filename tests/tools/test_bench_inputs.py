"""The bench scripts check what they are given before their costly work (unpacking a tree, loading a real model,
starting runs): a bad option is one line on stderr and exit status 2, and a run that ends before its first step
ends the bench instead of leaving it waiting."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench_module(name: str):
    """bench/<name>.py imported as a module (its main not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_work(monkeypatch, module, *names: str) -> None:
    """Each of the module's functions `names` fails the test if called: a refusal must come before them."""

    def started(*args, **kwargs):
        raise AssertionError("the bench started its work before its inputs were checked")

    for name in names:
        monkeypatch.setattr(module, name, started)


def refused(main, argv: list[str], capsys, *needles: str) -> str:
    """`main(argv)` ends with status 2 and one line on stderr holding every needle, printing nothing else."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2, (stop.value.code, err[-2000:])
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err[-2000:]
    assert not out, out  # not even the machine's line: nothing began
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# -- bench_recipe_speed.py ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--ref", "nosuchcommit"], ("--ref", "'nosuchcommit' is not a commit")),
        (["--ref", "HEAD~100000"], ("--ref", "HEAD~100000")),
        (["--ref", ""], ("--ref",)),
        (["--steps", "0"], ("--steps: 0",)),
        (["--steps", "-1"], ("--steps: -1",)),
        (["--seed", "-5"], ("seed: -5",)),
        (["--", "--lr", "nan"], ("train.py flags", "lr: nan")),
        (["--", "--loss", "pg", "--dual-clip", "3"], ("dual_clip: 3.0 is not used with loss: pg",)),
        (["--", "--no-such-flag"], ("no-such-flag",)),
    ],
)
def test_recipe_speed_refuses_bad_input_before_it_unpacks_or_runs(monkeypatch, capsys, argv, needles):
    bench = bench_module("bench_recipe_speed")
    no_work(monkeypatch, bench, "unpack", "start")
    refused(bench.main, argv, capsys, *needles)


def test_recipe_speed_reads_a_ref_as_a_commit_never_as_an_option_of_git(monkeypatch, capsys, tmp_path):
    bench = bench_module("bench_recipe_speed")
    no_work(monkeypatch, bench, "unpack", "start")
    refused(bench.main, [f"--ref=--output={tmp_path / 'written'}"], capsys, "--ref")
    assert not (tmp_path / "written").exists()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert bench.commit_of("HEAD") == head.stdout.strip()


def test_recipe_speed_ends_when_a_run_ends_before_its_first_step(monkeypatch, capsys):
    """A run its tree refuses (a flag the earlier commit does not know) exits before it connects to its gate: the
    bench says so and stops, where it waited for the connection forever."""
    bench = bench_module("bench_recipe_speed")
    monkeypatch.setattr(bench, "unpack", lambda commit, into: into)

    def refused_run(tree, socket, flags, log):
        return subprocess.Popen([sys.executable, "-c", "print('train.py: error: a flag'); raise SystemExit(2)"],
                                stdout=log.open("w"), stderr=subprocess.STDOUT)  # fmt: skip

    monkeypatch.setattr(bench, "start", refused_run)
    ended = []

    def run():
        try:
            bench.main(["--ref", "HEAD", "--steps", "1", "--", "--env", "tinyagent"])
        except SystemExit as stop:
            ended.append(stop.code)

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "the bench still waits for a run that has ended"
    assert ended and "a run ended early" in str(ended[0]) and "before its first step" in str(ended[0]), ended
    assert "train.py: error: a flag" in capsys.readouterr().out  # the run's own log, shown
