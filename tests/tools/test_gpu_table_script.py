"""bench/gpu_table.sh, the GPU's table, run on the CPU (``ACCELERATOR=cpu``) on TinyAgent: the shell around decide
passes a quoted ``LABEL=FLAGS`` row whole, writes the runs and their tables to ``OUT`` (a folder whose name has a
space too), says so and exits 124 when its deadline stops the runs, and a second call goes on from the results file
instead of running its runs again. What it cannot use (an ``OUT`` that cannot be a folder, rows that do not split
into words, a deadline that is none) stops it with one line before anything runs, and the text of ``ROWS`` and
``FLAGS`` is only ever split into words, never run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gpu_table(out: Path, seconds: int | str, **changes: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERATOR": "cpu", "OUT": str(out), "SEEDS": "1", "JOBS": "1", "THREADS": "1",
           "SAMPLES": "1", "ROWS": '"lag 1=--sampler lagged --lag 1"', "GPU_TABLE_SECONDS": str(seconds),
           "FLAGS": "--env tinyagent --max-steps 2 --tasks-per-step 2 --episodes-per-task 2", **changes}  # fmt: skip
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_table.sh")], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


@pytest.mark.slow  # 35 s on 2 cores: the GPU script's rows run on the CPU, out of the default run
def test_the_gpu_table_runs_its_rows_on_the_cpu_stops_at_its_deadline_and_goes_on(tmp_path):
    out = tmp_path / "the table"  # a space in OUT: one word still
    stopped = gpu_table(out, 1)  # a second: the runs cannot finish
    assert stopped.returncode == 124, stopped.stderr[-2000:]
    assert "stopped at the deadline; run the same command again to go on" in stopped.stdout
    assert not (out / "results.jsonl").exists()

    done = gpu_table(out, 500)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["row"], r["seed"], r["flags"]) for r in runs] == [("lag 1", 0, "--sampler lagged --lag 1")]
    table = (out / "table.md").read_text()
    assert "| lag 1 | 1 |" in table and table in done.stdout

    again = gpu_table(out, 500)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "0 runs to do (1 already in" in again.stdout
    assert len((out / "results.jsonl").read_text().splitlines()) == 1


def refused(out: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit status 2, one line on stderr holding every needle, and nothing run (no decide, no table)."""
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_table.sh: "), out.stderr[-2000:]
    assert not out.stdout, out.stdout[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_an_out_that_cannot_be_a_folder_stops_the_gpu_table_before_anything_runs(tmp_path):
    (tmp_path / "a file").write_text("")
    for out in (tmp_path / "a file", tmp_path / "a file" / "table", Path("/proc/no/table")):
        refused(gpu_table(out, 500), "OUT", str(out))
    assert (tmp_path / "a file").read_text() == ""


@pytest.mark.parametrize(
    "changes, needles",
    [
        ({"ROWS": '"lag 1=--sampler lagged'}, ("ROWS", "No closing quotation")),
        ({"ROWS": "  "}, ("ROWS", "holds no row")),
        ({"FLAGS": "--env 'tinyagent"}, ("FLAGS", "No closing quotation")),
        ({"GPU_TABLE_SECONDS": "0"}, ("GPU_TABLE_SECONDS", "'0'")),  # timeout 0 is no deadline at all
        ({"GPU_TABLE_SECONDS": "-5"}, ("GPU_TABLE_SECONDS", "'-5'")),
        ({"GPU_TABLE_SECONDS": "soon"}, ("GPU_TABLE_SECONDS", "'soon'")),
    ],
)
def test_rows_flags_or_a_deadline_it_cannot_use_stop_it_before_anything_runs(tmp_path, changes, needles):
    out = tmp_path / "table"
    refused(gpu_table(out, 500, **changes), *needles)
    assert not out.exists()


def test_the_text_of_rows_and_flags_is_split_into_words_never_run(tmp_path):
    """A $(...) or a backquote in ROWS or FLAGS is text: it reaches decide as part of a word (whose check of the row
    refuses it, before any run), and no command in it runs."""
    ran = tmp_path / "ran"
    rows = f'"x=--run-name $(touch {ran}-1)" "y=--run-name `touch {ran}-2`"'
    out = gpu_table(tmp_path / "table", 500, ROWS=rows, FLAGS=f"--env tinyagent --run-name $(touch {ran}-3)")
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"$(touch {ran}-1)" in out.stderr and "nothing was run" in out.stderr, out.stderr[-2000:]
    assert not list(tmp_path.glob("ran*")), "a command in ROWS or FLAGS ran"
