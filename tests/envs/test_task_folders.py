"""codefix task folders that cannot be used are refused before the run, in one line that names the file: strict
JSON, bounded calls and expectations, candidates that are regular files of a bounded size (a folder, a link to
nothing, a FIFO: refused, never a traceback or a hang); an expected exception a test can mean is judged right."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers import FAST, one_clear_line, train

from lrl.envs.codefix import load_tasks
from lrl.envs.codefix.folder import TaskFolderError
from lrl.envs.codefix.pool import EnvPool
from lrl.envs.codefix.sandbox.harness import Limits

GOOD = "def double(x):\n    return 2 * x\n"
WRONG = "def double(x):\n    return 0\n"
CALLS = ["double(2)", "double(21)"]


def write_task(folder: Path, name: str, split: str) -> Path:
    d = folder / name
    (d / "candidates").mkdir(parents=True)
    (d / "task.json").write_text(
        json.dumps({"calls": CALLS, "expect": [{"value": 4}, {"value": 42}], "split": split})
    )
    (d / "solution.py").write_text(WRONG)
    (d / "candidates" / "1.py").write_text(GOOD)
    (d / "candidates" / "2.py").write_text(WRONG)
    return d


def meta(text: str):
    return lambda d: ((d / "task.json").write_text(text), d / "task.json")[1]


def replace_candidate(how):
    def breakage(d: Path) -> Path:
        path = d / "candidates" / "1.py"
        path.unlink()
        how(path)
        return path

    return breakage


CALLS_JSON = json.dumps(CALLS)
CASES = {
    "NaN in expect": (meta(f'{{"calls": {CALLS_JSON}, "expect": [{{"value": NaN}}, {{"value": 42}}], "split": "heldout"}}'),
                      "NaN"),
    "Infinity in expect": (meta(f'{{"calls": {CALLS_JSON}, "expect": [{{"value": 4}}, {{"value": -Infinity}}], '
                                '"split": "heldout"}'), "Infinity"),
    "a key twice": (meta(f'{{"calls": {CALLS_JSON}, "expect": [{{"value": 4}}, {{"value": 42}}], "split": "train", '
                         '"split": "heldout"}'), 'the key "split" twice'),
    "a call of a million characters": (meta(json.dumps({"calls": ["double(" + "1+" * 500_000 + "1)", CALLS[1]],
                                                        "expect": [{"value": 4}, {"value": 42}], "split": "heldout"})),
                                       "calls[0] is 1000009 characters"),
    "a call nested thousands deep": (meta(json.dumps({"calls": ["double(" + "-" * 5000 + "1)", CALLS[1]],
                                                      "expect": [{"value": 4}, {"value": 42}], "split": "heldout"})),
                                     "calls[0]"),
    "an expectation nested thousands deep": (meta(f'{{"calls": {CALLS_JSON}, "expect": [{{"value": {"[" * 5000}'
                                                  f'{"]" * 5000}}}, {{"value": 42}}], "split": "heldout"}}'),
                                             "nested more than"),
    "a number of 5,000 digits": (meta(f'{{"calls": {CALLS_JSON}, "expect": [{{"value": {"7" * 5000}}}, {{"value": 42}}],'
                                      ' "split": "heldout"}'), "digits"),
    "an exception no test means": (meta(json.dumps({"calls": CALLS, "expect": [{"raises": "print"}, {"value": 42}],
                                                    "split": "heldout"})), "expect[0]"),
    "a candidate that is a folder": (replace_candidate(lambda p: p.mkdir()), "a folder"),
    "a candidate that is a link to nothing": (replace_candidate(lambda p: p.symlink_to(p.parent / "gone.py")),
                                              "a link to nothing"),
    "a candidate that is a FIFO": (replace_candidate(lambda p: os.mkfifo(p)), "not a regular file"),
    "a candidate of 2 MiB": (replace_candidate(lambda p: p.write_text("x = 1\n" * (350 << 10))), "bytes"),
    "a task.json that is a FIFO": (lambda d: ((d / "task.json").unlink(), os.mkfifo(d / "task.json"),
                                              d / "task.json")[2], "not a regular file"),
    "a shipped module that is not UTF-8": (lambda d: ((d / "solution.py").write_bytes(b"x = '\xff'\n"),
                                                      d / "solution.py")[1], "not UTF-8"),
}  # fmt: skip


@pytest.mark.timeout(120)  # a FIFO read without care hangs: fail, do not wait for the suite's limit
@pytest.mark.parametrize("case", list(CASES))
def test_a_task_folder_that_cannot_be_used_is_one_line_naming_the_file_and_exit_2(tmp_path, case):
    breakage, needle = CASES[case]
    tasks = tmp_path / "tasks"
    write_task(tasks, "a", "train")
    path = breakage(write_task(tasks, "b", "heldout"))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(
        20_000
    )  # as torch's compiler or hypothesis may have: the bounds must not depend on it
    try:
        with pytest.raises(TaskFolderError) as err:
            load_tasks(tasks)
    finally:
        sys.setrecursionlimit(limit)
    assert needle in str(err.value) and str(path) in str(err.value), str(err.value)[:300]
    out = train("--env", "codefix", "--codefix-tasks", str(tasks), *FAST, "--log-dir", str(tmp_path / "r"))
    one_clear_line(out, 2, "codefix_tasks", str(path), needle)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[:2000]
    assert len(out.stderr) < 1000, out.stderr[:2000]  # the line names the problem; it does not echo the input


def test_linked_and_large_enough_files_are_still_read(tmp_path):
    tasks = tmp_path / "tasks"
    write_task(tasks, "a", "train")
    d = write_task(tasks, "b", "heldout")
    (tmp_path / "elsewhere.py").write_text(GOOD)
    (d / "candidates" / "1.py").unlink()
    (d / "candidates" / "1.py").symlink_to(tmp_path / "elsewhere.py")  # a link to a regular file is one
    long_call = (
        "double(sum([" + ", ".join(["1"] * 1000) + "]))"
    )  # 3,012 characters, shallow: within the bounds
    (d / "task.json").write_text(json.dumps({"calls": [long_call, CALLS[1]], "expect": [{"value": 2000},
                                             {"value": 42}], "split": "heldout"}))  # fmt: skip
    task = load_tasks(tasks)[1]
    assert task.candidates[0] == GOOD and task.calls[0] == long_call


@pytest.mark.xdist_group("codefix")
def test_an_expected_keyboard_interrupt_or_system_exit_met_by_the_right_candidate_passes():
    pool = EnvPool(1, "auto", Limits(wall_seconds=2.0, cpu_seconds=2), retries=0)
    try:
        for name in ("KeyboardInterrupt", "SystemExit"):
            source = f"def stop():\n    raise {name}\n"
            verdict, _, _ = pool.run({"solution.py": source}, "solution", ["stop()"], [{"raises": name}])
            assert verdict.kind == "passed", (name, verdict)
            wrong, _, _ = pool.run({"solution.py": "def stop():\n    return 0\n"}, "solution", ["stop()"],
                                   [{"raises": name}])  # fmt: skip
            assert wrong.kind == "failed", (name, wrong)
    finally:
        pool.close()
