"""bench/gpu_table.sh, the GPU's table, run on the CPU (``ACCELERATOR=cpu``) on TinyAgent: the shell around decide
passes a quoted ``LABEL=FLAGS`` row whole, writes the runs and their tables to ``OUT``, says so and exits 124 when
its deadline stops the runs, and a second call goes on from the results file instead of running its runs again."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def gpu_table(out: Path, seconds: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERATOR": "cpu", "OUT": str(out), "SEEDS": "1", "JOBS": "1", "THREADS": "1",
           "SAMPLES": "1", "ROWS": '"lag 1=--sampler lagged --lag 1"', "GPU_TABLE_SECONDS": str(seconds),
           "FLAGS": "--env tinyagent --max-steps 2 --tasks-per-step 2 --episodes-per-task 2"}  # fmt: skip
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_table.sh")], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def test_the_gpu_table_runs_its_rows_on_the_cpu_stops_at_its_deadline_and_goes_on(tmp_path):
    out = tmp_path / "table"
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
