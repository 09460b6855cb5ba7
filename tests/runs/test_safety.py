"""Nothing a user points lrl at is destroyed, every run owns its files, every failure is one clear line.

Every path here is made inside a temporary folder; a FIFO stands for a device (the tests run as root and must
never touch a real one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import quick_cfg
from helpers import FAST, train, train_process

from lrl.checkpoint import read_history
from lrl.config import ConfigError
from lrl.policy import save_policy
from lrl.run import build_run, fit
from lrl.runs import check_output, clean_stale_temporaries

ROOT = Path(__file__).resolve().parents[2]
def one_clear_line(out, code: int, *needles: str) -> None:
    assert out.returncode == code, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr[-2000:])


# -- 1. the history file is appended to, never replaced ---------------------------------------------------
def test_history_file_keeps_its_content(tmp_path, model_dir):
    earlier = '{"step": 0, "run": "an earlier run"}\n'
    history = tmp_path / "history.jsonl"
    history.write_text(earlier)
    link = tmp_path / "link.jsonl"
    link.symlink_to(history)
    out = train(
        *FAST, "--model", str(model_dir), "--log-dir", str(tmp_path / "runs"), "--history-file", str(link)
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = history.read_text()
    assert text.startswith(earlier) and len(text.splitlines()) == 3  # the earlier line, then one per step
    assert link.is_symlink() and [h["step"] for h in read_history(link)] == [0, 1]
    notes = (
        tmp_path / "notes.txt"
    )  # a file that is not a history is left alone (tests/runs/test_hostile_inputs.py)
    notes.write_text("keep\n")
    out = train(
        *FAST, "--model", str(model_dir), "--log-dir", str(tmp_path / "runs"), "--history-file", str(notes)
    )
    one_clear_line(out, 2, "history_file", "not an lrl history")
    assert notes.read_text() == "keep\n"


# -- 2. runs in one log dir own their files; concurrent runs too; both resume ------------------------------
def test_two_runs_in_one_log_dir_keep_separate_files_and_both_resume(tmp_path, model_dir):
    logs = str(tmp_path / "runs")
    a = ["--model", str(model_dir), "--log-dir", logs, "--checkpoint-every", "2", *FAST]
    b = [*a, "--sampler", "lagged", "--lag", "1"]
    assert train(*a, "--max-steps", "4").returncode == 0
    assert train(*b).returncode == 0
    versions = sorted(p.name for p in (tmp_path / "runs" / "lrl").iterdir())
    assert versions == ["version_0", "version_1"]
    for v in versions:
        assert (tmp_path / "runs" / "lrl" / v / "checkpoints" / "last.ckpt").is_file()
        assert list((tmp_path / "runs" / "lrl" / v).glob("events.out.tfevents.*"))
    # the newest run (B's) was written with other settings: --resume last with A's is an error, not a skip
    refused = train(*a, "--max-steps", "6", "--resume", "last")
    one_clear_line(refused, 2, f"{logs}/lrl/version_1/checkpoints/last.ckpt", "other settings", "sampler")
    resumed = train(*a, "--max-steps", "6", "--resume", f"{logs}/lrl/version_0")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from step 4 of {logs}/lrl/version_0/checkpoints/last.ckpt" in resumed.stdout
    resumed_b = train(*b, "--max-steps", "3", "--resume", "last")
    assert f"resumed from step 2 of {logs}/lrl/version_1" in resumed_b.stdout


@pytest.mark.slow
def test_runs_started_at_the_same_time_never_share_a_folder(tmp_path, model_dir):
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "--model",
        str(model_dir),
        "--log-dir",
        str(tmp_path / "runs"),
        "--checkpoint-every",
        "1",
        *FAST,
    ]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1000:] for o in outs]
    folders = {
        line.split("started fresh in ")[1]
        for o, _ in outs
        for line in o.splitlines()
        if "started fresh" in line
    }
    assert len(folders) == 2
    for folder in folders:
        events = list(Path(folder).glob("events.out.tfevents.*"))
        assert len(events) == 1 and (Path(folder) / "checkpoints" / "last.ckpt").is_file()


# -- 3. --resume says what it did, and refuses what it cannot resume ---------------------------------------
def test_resume_of_a_folder_without_a_checkpoint_is_an_error(tmp_path, model_dir):
    (tmp_path / "empty").mkdir()
    out = train(
        *FAST,
        "--model",
        str(model_dir),
        "--log-dir",
        str(tmp_path / "runs"),
        "--resume",
        str(tmp_path / "empty"),
    )
    one_clear_line(out, 2, "is a folder without a checkpoint")
    fresh = train(*FAST, "--model", str(model_dir), "--log-dir", str(tmp_path / "runs"), "--resume", "last")
    assert "resume last: no run of" in fresh.stdout and "started fresh in" in fresh.stdout


def test_resume_last_over_an_unreadable_checkpoint_is_an_error_not_a_fresh_start(tmp_path, model_dir):
    import fcntl

    runs = tmp_path / "runs" / "lrl"
    for version in (0, 1):
        (runs / f"version_{version}" / "checkpoints").mkdir(parents=True)
        (runs / f"version_{version}" / "checkpoints" / "last.ckpt").write_bytes(os.urandom(512))
    held = os.open(runs / "version_1" / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # version_1 is a live run's: left to it
    try:
        out = train(*FAST, "--model", str(model_dir), "--log-dir", str(tmp_path / "runs"), "--resume", "last")
    finally:
        os.close(held)
    one_clear_line(out, 2, f"{runs}/version_0/checkpoints/last.ckpt", "cannot be read as an lrl checkpoint")
    assert "started fresh" not in out.stdout and sorted(p.name for p in runs.iterdir()) == [
        "version_0",
        "version_1",
    ]


def test_resume_refuses_a_max_steps_below_the_checkpoint(tmp_path, format_policy):
    cfg = dict(max_steps=3, checkpoint_every=3, log_dir=str(tmp_path), threads=1)
    fit(build_run(quick_cfg(**cfg), logger=False, policy=format_policy))
    with pytest.raises(ConfigError, match=r"max_steps: 2 is below the step of the checkpoint it resumes \(3"):
        build_run(quick_cfg(**{**cfg, "max_steps": 2}, resume="last"), logger=False, policy=format_policy)


# -- 4. a killed and resumed run is one TensorBoard run, equal to the uninterrupted one -------------------
def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        t: [(e.step, e.value) for e in acc.Scalars(t)]
        for t in acc.Tags()["scalars"]
        if not t.startswith("time/")
    }


@pytest.mark.slow
def test_sigkill_and_resume_write_one_tensorboard_run_equal_to_the_uninterrupted_one(tmp_path, model_dir):
    args = [
        "--model",
        str(model_dir),
        *FAST,
        "--max-steps",
        "6",
        "--checkpoint-every",
        "2",
        "--eval-every",
        "3",
    ]
    whole = train(*args, "--log-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0
    logs, history = tmp_path / "cut", tmp_path / "cut.jsonl"
    killed = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *args,
            "--log-dir",
            str(logs),
            "--history-file",
            str(history),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and killed.poll() is None:
        if history.exists() and len(history.read_text().splitlines()) >= 4:  # past the step-2 checkpoint
            break
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    resumed = train_process(*args, "--log-dir", str(logs), "--history-file", str(history), "--resume", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    folders = list((logs / "lrl").iterdir())
    assert [f.name for f in folders] == ["version_0"]  # the resumed run wrote into the killed run's folder
    a, b = scalars(tmp_path / "whole" / "lrl" / "version_0"), scalars(folders[0])
    assert a.keys() == b.keys()
    for tag in a:  # one point per step, running means included, bit for bit (an empty bin's NaN included)
        assert [(s, repr(v)) for s, v in a[tag]] == [(s, repr(v)) for s, v in b[tag]], tag


# -- 5. bounded work; SIGTERM and Ctrl-C stop promptly with a checkpoint and the command to continue -------
@pytest.mark.parametrize(
    "flags, option",
    [
        (["--episodes-per-task", "100000", "--max-steps", "1"], "episodes_per_task"),
        (["--eval-episodes", "10000000"], "eval_episodes"),
    ],
)
def test_work_that_does_not_fit_in_memory_is_refused_before_anything_is_built(tmp_path, flags, option):
    out = train(*flags, "--log-dir", str(tmp_path / "runs"))
    one_clear_line(out, 2, f"{option}:", "GiB", "available")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "signum, code", [pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow), (signal.SIGINT, 130)]
)
@pytest.mark.early
def test_a_signal_stops_the_run_with_a_checkpoint_and_the_command_to_continue(
    tmp_path, model_dir, signum, code
):
    history = tmp_path / "h.jsonl"
    args = [
        *FAST,
        "--model",
        str(model_dir),
        "--max-steps",
        "200",
        "--checkpoint-every",
        "50",
        "--log-dir",
        str(tmp_path / "runs"),
        "--history-file",
        str(history),
    ]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not (history.exists() and len(history.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    sent = time.time()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert time.time() - sent < 10 and proc.returncode == code, err[-2000:]
    assert "Traceback" not in err and f"stopped by {signal.Signals(signum).name} after step" in err
    assert "continue with: python train.py" in err and "--resume" in err
    ckpt = tmp_path / "runs" / "lrl" / "version_0" / "checkpoints" / "last.ckpt"
    steps = len(read_history(history))
    assert torch.load(ckpt, weights_only=True)["global_step"] == steps  # the last step, not the last interval


# -- 6. every bad path and model is one line and exit 2 ------------------------------------------------
def test_bad_paths_are_one_line_each(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to_fifo").symlink_to(tmp_path / "fifo")
    (tmp_path / "adir").mkdir()
    cases = [
        (["--log-dir", str(tmp_path / "afile")], "log_dir: ", "is a file; it must be a folder"),
        (["--log-dir", str(tmp_path / "afile" / "below")], "log_dir: ", "cannot be created"),
        (["--checkpoint-dir", str(tmp_path / "afile")], "checkpoint_dir: ", "is a file"),
        (["--history-file", str(tmp_path / "adir")], "history_file: ", "is a folder; it must be a file"),
        (["--history-file", str(tmp_path / "to_fifo")], "history_file: ", "is a pipe or socket"),
        (["--log-dir", ""], "log_dir: an empty value is not allowed", ""),
        (["--max-steps", "99999999999999999999999"], "max_steps: ", "is not allowed"),
    ]
    for flags, *needles in cases:
        one_clear_line(train(*flags), 2, *[n for n in needles if n])
    assert check_output("log_dir", "/proc/x", "dir")  # the real ones are refused by name, nothing is written
    monkeypatch.setattr("lrl.runs.VIRTUAL", (str(tmp_path / "kernel"),))  # stands for /proc, /sys, /dev
    assert "a kernel file system" in check_output("log_dir", str(tmp_path / "kernel" / "x"), "dir")[0]


def broken_models(tmp_path: Path, tok, format_policy) -> dict[str, tuple[Path, str]]:
    from transformers import BertConfig, BertModel

    out = {}
    truncated = tmp_path / "truncated"
    save_policy(format_policy, tok, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out["truncated"] = (truncated, "the weights cannot be loaded")
    small = tmp_path / "small_vocab"
    save_policy(format_policy, tok, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 10}))
    out["vocab_size 10"] = (small, "the weights cannot be loaded")
    nan = tmp_path / "nan"
    poisoned = type(format_policy)(format_policy.config)
    poisoned.load_state_dict(format_policy.state_dict())
    with torch.no_grad():
        poisoned.get_input_embeddings().weight.fill_(float("nan"))
    save_policy(poisoned, tok, nan)
    out["nan"] = (nan, "hold NaN or inf")
    bert = tmp_path / "bert"
    BertModel(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    ).save_pretrained(bert)
    tok.save(bert)
    out["bert"] = (bert, "is not a causal LM")
    return out


def test_models_that_cannot_be_trained_are_one_line_each(tmp_path, tok, format_policy):
    import contextlib
    import io

    from lrl_lab.tools.mismatch import main as mismatch

    for name, (path, needle) in broken_models(tmp_path, tok, format_policy).items():
        one_clear_line(train("--model", str(path), *FAST), 2, "model", needle)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = mismatch(["--model", str(path), "--new-tokens", "2"])
        assert code == 2 and needle in err.getvalue() and "Traceback" not in err.getvalue(), name


def test_tools_refuse_bad_output_paths_and_find_runs(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    out = subprocess.run(
        [sys.executable, "-m", "lrl_lab.sim", "--plot", str(tmp_path / "fifo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_clear_line(out, 2, "--plot", "is a pipe or socket")
    out = subprocess.run(
        [sys.executable, "-m", "lrl_lab.tools.plot_run", str(tmp_path / "nonexistent")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_clear_line(out, 2, "does not exist")


# -- 9, 10. runs that cannot learn say so; leftovers of killed writes are cleaned -------------------------
@pytest.mark.parametrize("flags", [["--episodes-per-task", "1"], ["--temperature", "100"]])
def test_a_run_that_never_learns_says_so(tmp_path, model_dir, flags):
    out = train("--model", str(model_dir), *FAST, "--log-dir", str(tmp_path), *flags)
    assert out.returncode == 4, out.stderr[-2000:]
    assert "2 skipped" in out.stdout and "nothing was learned" in out.stderr and "Traceback" not in out.stderr


def test_temporary_files_of_a_killed_checkpoint_write_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".last.ckpt.{dead.pid}.abc123.tmp"
    live = tmp_path / f".last.ckpt.{os.getpid()}.def456.tmp"
    stale.write_bytes(b"half")
    live.write_bytes(b"being written")
    assert clean_stale_temporaries(tmp_path) == [stale]
    assert not stale.exists() and live.exists()


# -- the fuzz: every path option, every kind of path: a clear error or a working run --------------------
KINDS = [
    "missing",
    "missing_parents",
    "file",
    "dir",
    "empty_dir",
    "link_to_file",
    "link_to_dir",
    "link_to_fifo",
    "broken_link",
    "fifo",
    "under_a_file",
]
OPTIONS = [
    "--log-dir",
    "--checkpoint-dir",
    "--history-file",
    "--resume",
    "--model",
    "--tokenizer",
    "--config",
]


def make_path(root: Path, kind: str) -> Path:
    """A path of the given kind inside `root` (a FIFO stands for a device)."""
    (root / "target_file").write_text("keep: 1\n")
    (root / "target_dir").mkdir()
    (root / "target_dir" / "inside.txt").write_text("keep")
    os.mkfifo(root / "target_fifo")
    p = root / "the_path"
    if kind == "missing_parents":
        return root / "a" / "b" / "the_path"
    if kind == "file":
        p.write_text("keep\n")
    elif kind in ("dir", "empty_dir"):
        p.mkdir()
        if kind == "dir":
            (p / "inside.txt").write_text("keep")
    elif kind.startswith("link_to_"):
        p.symlink_to(root / f"target_{kind[8:]}")
    elif kind == "broken_link":
        p.symlink_to(root / "nowhere")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "under_a_file":
        return root / "target_file" / "child"
    return p


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = ("link", os.readlink(p))
        elif p.is_fifo():
            out[key] = ("fifo",)
        elif p.is_file():
            out[key] = ("file", p.read_bytes())
        elif p.is_dir():
            out[key] = ("dir",)
    return out


def test_every_path_option_gives_a_clear_error_or_a_working_run(model_dir, tmp_path):
    import shutil
    import tempfile

    from hypothesis import given, settings
    from hypothesis import strategies as st

    micro = [
        "--max-steps",
        "1",
        "--tasks-per-step",
        "2",
        "--episodes-per-task",
        "2",
        "--minibatches",
        "1",
        "--eval-episodes",
        "1",
        "--eval-every",
        "1000",
        "--eval-at-start",
        "false",
        "--progress",
        "false",
        "--monitor-mismatch",
        "false",
        "--monitor-staleness",
        "false",
        "--monitor-timing",
        "false",
        "--monitor-jumps",
        "false",
        "--health-check",
        "false",
        "--threads",
        "1",
    ]

    @settings(max_examples=22, deadline=None)
    @given(option=st.sampled_from(OPTIONS), kind=st.sampled_from(KINDS))
    def one(option, kind):
        root = Path(
            tempfile.mkdtemp(prefix="lrl-fuzz-", dir=tmp_path)
        )  # one folder per example, removed after
        try:
            check(root, option, kind)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def check(root, option, kind):
        path = make_path(root, kind)
        before = snapshot(root)
        args = [*micro, "--log-dir", str(root / "runs"), option, str(path)]
        if option != "--model":
            args += ["--model", str(model_dir)]
        done = train(*args)
        # 4: the micro run's one step had no group with contrast between its episodes (chance, with 2 x 2
        # episodes): a clean exit of its own, not what this test is about
        learned_nothing = done.returncode == 4 and "train.py: nothing was learned" in done.stderr
        assert done.returncode in (0, 2) or learned_nothing, (option, kind, done.stderr[-1500:])
        assert "Traceback" not in done.stderr, (option, kind, done.stderr[-1500:])
        if done.returncode == 2:
            assert done.stderr.count("\n") == 1 and done.stderr.startswith("train.py: error: "), done.stderr
        after = snapshot(root)
        appended = {path, path.resolve()} if option == "--history-file" else set()
        for key, value in before.items():  # nothing the user had was changed or removed...
            if root / key in appended and value[0] == "file":  # ...but for the history file, appended to
                assert after[key][0] == "file" and after[key][1].startswith(value[1]), (option, kind, key)
            else:
                assert after.get(key) == value, (option, kind, key)
        allowed = [
            root / "runs",
            path,
            path.resolve(),
        ]  # ...new files only in the run folder or where the user said
        for key in set(after) - set(before):
            new = root / key
            made_parent = after[key] == ("dir",) and new in path.parents  # mkdir -p of the path asked for
            assert made_parent or any(new == a or a in new.parents for a in allowed), (option, kind, key)

    one()
