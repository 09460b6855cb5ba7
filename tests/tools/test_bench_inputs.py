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


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    """bench/ on the path, as for a script run from there: the benches import each other (bench_real_model)."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))


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

    for name in names:  # a module's own function, or one it imports when it runs (a dotted path)
        if "." in name:
            monkeypatch.setattr(name, started)
        else:
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
        (["--", "--loss", "pg", "--dual-clip", "3"], ("dual_clip: 3.0 is not used", "pg")),
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


# -- every other bench: bad numbers, missing files and models, bad revisions ----------------------------------
RUN = ["lrl.run.build_run"]  # the benches that run train.py's run in their own process
MODEL = ["lrl_lab.tools.mismatch.load_model", "lrl.policy.load_policy", "lrl.models.resolve_model"]
SANDBOX = ["boxes", "baseline_harness", "lrl.envs.codefix.sandbox.harness.adopt_orphans"]
PIPELINE = ["run", "backends_main", "slotted_main"]
BAD = [
    ("bench_proximal", ["--steps", "0"], ("--steps: 0",), RUN),
    ("bench_proximal", ["--steps", "1"], ("--steps: 1", "at least 2"), RUN),
    ("bench_proximal", ["--", "--loss", "pg", "--dual-clip", "3"], ("train.py flags", "dual_clip"), RUN),
    ("bench_proximal", ["--", "--eps-low", "nan"], ("train.py flags", "eps_low: nan"), RUN),
    ("profile_step", ["--steps", "0"], ("--steps",), RUN),
    ("profile_step", ["--eval-episodes", "-1"], ("--eval-episodes", "-1"), RUN),
    ("profile_step", ["--", "--precision", "fp17"], ("train.py flags", "precision: 'fp17'"), RUN),
    ("bench_sandbox", ["--runs", "0"], ("--runs: 0",), SANDBOX),
    ("bench_sandbox", ["--baseline", "nosuchrev"], ("--baseline", "'nosuchrev' is not a commit"), SANDBOX),
    ("bench_sandbox", ["--baseline=--output=x"], ("--baseline",), SANDBOX),
    ("bench_engine", ["--prompts", "0"], ("--prompts",), ["build_tokenizer"]),
    ("bench_engine", ["--new-tokens", "-1"], ("--new-tokens",), ["build_tokenizer"]),
    ("bench_engine", ["--repeats", "0"], ("--repeats",), ["build_tokenizer"]),
    ("bench_engine", ["--threads", "0"], ("--threads",), ["build_tokenizer"]),
    ("bench_engine", ["--layers", "0"], ("--layers: 0",), ["build_tokenizer"]),
    ("bench_engine", ["--hidden", "6"], ("--hidden: 6",), ["build_tokenizer"]),
    ("bench_engine", ["--shape", "nosuch"], ("--shape", "'nosuch'"), ["build_tokenizer"]),
    ("bench_engine", ["--device", "nosuch"], ("--device", "'nosuch'"), ["build_tokenizer"]),
    ("bench_sampling", ["--rows", "0"], ("--rows",), ["step_costs"]),
    ("bench_sampling", ["--repeats", "0"], ("--repeats",), ["step_costs"]),
    ("bench_callbacks", ["--steps", "0"], ("--steps",), ["one_arm"]),
    ("bench_callbacks", ["--warmup", "-1"], ("--warmup: -1",), ["one_arm"]),
    ("bench_callbacks", ["--steps", "3", "--warmup", "3"], ("--warmup: 3", "[0, 2]"), ["one_arm"]),
    ("compare_histories", ["/no/such/before", "/no/such/after"], ("BEFORE", "/no/such/before"), ["compare"]),
    ("runs_table", ["x=/no/such/runs/*"], ("x: no run folder matches",), ["one_run"]),
    ("runs_table", ["x=/tmp", "--learned", "nan"], ("--learned: nan",), ["one_run"]),
    ("fp16_gradients", ["--model", "/no/such/model"], ("--model", "/no/such/model"), MODEL),
    ("fp16_gradients", ["--scales", "1", "0"], ("--scales: 0",), MODEL),
    ("fp16_gradients", ["--scales", "nan"], ("--scales: nan",), MODEL),
    ("fp16_gradients", ["--rows", "0"], ("--rows",), MODEL),
    ("fp16_gradients", ["--layers", "0"], ("--layers",), MODEL),  # 0 was read as no cut: the whole model ran
    ("fp16_gradients", ["--tokens", "1"], ("--tokens",), MODEL),
    ("bench_simulate", ["--steps", "0"], ("--steps",), ["draw_pool"]),
    ("bench_simulate", ["--slots", "64", "0"], ("--slots",), ["draw_pool"]),
    ("bench_simulate", ["--n-durations", "0"], ("--n-durations",), ["draw_pool"]),
    ("bench_simulate", ["--window-steps", "nan"], ("--window-steps: nan",), ["draw_pool"]),
    ("bench_vs_trl", ["--model", "/no/such/model"], ("--model", "/no/such/model"), MODEL),
    ("bench_vs_trl", ["--steps", "0"], ("--steps",), MODEL),
    ("bench_vs_trl", ["--lr", "nan"], ("--lr",), MODEL),
    ("profile_decode", ["--model", "/no/such/model"], ("--model", "/no/such/model"), MODEL),
    ("bench_real_model", ["--model", "/no/such/model"], ("--model", "/no/such/model"), MODEL),
    ("bench_real_model", ["--batches", "1", "0"], ("--batches",), MODEL),
    ("bench_first_run", ["--repeats", "0"], ("--repeats: 0",), ["first_run"]),
    ("bench_pipeline", ["--repeats", "0"], ("--repeats: 0",), PIPELINE),
    ("bench_pipeline", ["--steps", "3"], ("--steps: 3", "at least 4"), PIPELINE),
    ("bench_vllm", ["--repeats", "0"], ("--repeats",), ["episodes_rows", "generation_rows", "sync_ms"]),
]


@pytest.mark.parametrize("script, argv, needles, blocked", BAD, ids=[f"{b[0]} {' '.join(b[1])}" for b in BAD])
def test_a_bench_refuses_bad_input_before_its_work(monkeypatch, capsys, script, argv, needles, blocked):
    bench = bench_module(script)
    no_work(monkeypatch, bench, *blocked)
    refused(bench.main, argv, capsys, *needles)


def test_a_folder_that_holds_no_model_is_one_line(monkeypatch, capsys, tmp_path):
    bench = bench_module("profile_decode")
    refused(bench.main, ["--model", str(tmp_path)], capsys, "--model", str(tmp_path))


def test_a_baseline_from_before_the_sandbox_is_refused(monkeypatch, capsys):
    bench = bench_module("bench_sandbox")
    no_work(monkeypatch, bench, *SANDBOX)
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True).stdout.split()[0]  # fmt: skip
    refused(bench.main, ["--baseline", first], capsys, "--baseline", "has no lrl/envs/codefix/sandbox")


def test_compare_histories_refuses_a_before_folder_with_nothing_to_compare(capsys, tmp_path):
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    bench = bench_module("compare_histories")
    refused(bench.main, [str(tmp_path / "before"), str(tmp_path / "after")], capsys, "BEFORE", "no history")
