"""The first `python train.py` on a fresh machine, timed: an empty base cache, so the shipped base is the only
way not to build one. Prints the seconds of each run and their ratio to the 40 s target.

    python bench/bench_first_run.py            # three first runs, each with its own empty cache

The whole command is timed, as a user sees it: interpreter start, imports, the base, training, evaluation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lrl.cli import OneLineParser

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 40.0


def first_run() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LRL_CACHE": str(Path(tmp) / "cache")}
        cmd = [sys.executable, "train.py", "--progress", "false", "--log-dir", str(Path(tmp) / "runs")]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"train.py failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
        built = "building the RL base" in proc.stderr + proc.stdout
        print(f"  {seconds:6.1f} s   {'base built' if built else 'shipped base'}", flush=True)
        return seconds


def main(argv=None) -> int:
    p = OneLineParser(
        prog="bench_first_run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats} is not allowed; it must be at least 1")
    print(f"first `python train.py` with an empty cache ({os.cpu_count()} CPU cores):")
    times = [first_run() for _ in range(args.repeats)]
    med = statistics.median(times)
    print(f"median {med:.1f} s; ratio to the {TARGET_S:.0f} s target: {med / TARGET_S:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
