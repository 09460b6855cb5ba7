"""Async against sync on this machine, with repeats and error bars, and the same projected to 64 rollout workers.

    python bench/bench_pipeline.py                 # 3 repeats of sync, async (bound 1) and async --deterministic
    python bench/bench_pipeline.py --repeats 5 --steps 40

Part 1 runs ``python train.py`` (evaluation and checkpoints off, one torch thread per process) and prints steps per
second, mean ± standard error over repeats, and each mode's ratio to sync; the deterministic row is what the
logical clock costs against free-running async. Part 2 measures, on one thread, the seconds a rollout worker
takes to generate one group of episodes on its own (the base policy on the train tasks), and gives those
durations, with the synchronous run's training time per step, to the simulator (`lrl.sim`) for 64 workers with
one group per job: steps per second at staleness bounds 0 (synchronous), 1, 2 and 4. The projection holds the
trainer's time fixed (one trainer, as here); it is a model, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from lrl.experiments.pipeline import RUN_FLAGS  # noqa: E402  the same train.py flags as the experiment
from lrl.experiments.stats import mean_se  # noqa: E402
from lrl.experiments.calibrate import SKIP, steps_per_s  # noqa: E402

MODES = {
    "sync": [],
    "async, bound 1": ["--pipeline", "async", "--max-staleness", "1"],
    "async, bound 1, deterministic": [
        "--pipeline",
        "async",
        "--max-staleness",
        "1",
        "--deterministic",
        "true",
    ],
}


def run(flags: list[str], seed: int, steps: int) -> tuple[float, list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        history = Path(tmp) / "h.jsonl"
        cmd = [sys.executable, "train.py", *RUN_FLAGS, *flags, "--seed", str(seed), "--max-steps", str(steps)]
        cmd += ["--log-dir", str(Path(tmp) / "runs"), "--history-file", str(history)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-600:]}")
        lines = [json.loads(x) for x in history.read_text().splitlines() if x.strip()]
    return steps_per_s([h["time/end"] for h in lines]), lines


def group_durations(n: int, seed: int = 0) -> list[float]:
    """Seconds to generate one group (episodes_per_task episodes of one task) alone on one thread, n groups."""
    import torch

    torch.set_num_threads(1)
    from lrl.arguments import parse_args
    from lrl.envs import make_env
    from lrl.rollout import Rollout
    from lrl.run import load_model, run_tokenizer
    from samplers import make_sampler

    cfg = parse_args(["--seed", str(seed)])
    tok = run_tokenizer(cfg)
    spec = make_env(cfg, tok)
    policy = (load_model(cfg, spec.tok) or spec.warm_start()).eval()  # the run's base, as train.py starts
    sampler = make_sampler(cfg, spec.tok)
    sampler.setup(policy, 0)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        task = spec.train_tasks[i % len(spec.train_tasks)]
        start = time.perf_counter()
        rollout = Rollout(sampler.decoder(), spec, [], gen, sampler.sampling, 0)
        rollout.add([task] * cfg.episodes_per_task)
        while not rollout.done:
            rollout.advance()
        out.append(time.perf_counter() - start)
    return out, cfg.tasks_per_step


def project(
    durations: list[float], groups_per_step: int, train_time: float, workers: int = 64, steps: int = 200
):
    import torch

    from lrl.sim import simulate_pipeline

    rows = {}
    for eta in (0, 1, 2, 4):
        need = (steps + eta) * groups_per_step
        d = torch.tensor([durations[i % len(durations)] for i in range(need)], dtype=torch.float64)
        r = simulate_pipeline(d, workers, groups_per_step, train_time, 0.0, max_staleness=eta, steps=steps)
        rows[eta] = (steps / r["time"], r["staleness_mean"], r["gen_util"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    train_times = []
    for k in range(args.repeats):
        for mode, flags in MODES.items():
            rate, lines = run(flags, k, args.steps)
            rates[mode].append(rate)
            if mode == "sync":
                ends = [h["time/end"] for h in lines]
                train_times += [b - a - h["time/sample"] for a, b, h in zip(ends, ends[1:], lines[1:])][SKIP:]
            print(f"  repeat {k} {mode}: {rate:.3f} steps/s", flush=True)
    sync_mu = statistics.fmean(rates["sync"])
    print("\nsteps per second on this machine (mean ± SE over repeats):")
    for mode, xs in rates.items():
        mu, se = mean_se(xs)
        print(f"  {mode:32s} {mu:.3f} ± {se:.3f}   ratio to sync {mu / sync_mu:.2f}")
    det, free = statistics.fmean(rates[list(MODES)[2]]), statistics.fmean(rates[list(MODES)[1]])
    print(f"  the logical clock costs {100 * (1 - det / free):.1f}% of free-running async throughput")

    durations, groups = group_durations(64)
    train_time = statistics.fmean(train_times)
    print(
        f"\none group alone on one thread: mean {statistics.fmean(durations):.3f} s, max {max(durations):.3f} s "
        f"({len(durations)} groups); trainer {train_time:.3f} s per step"
    )
    print("projected to 64 rollout workers, one group per job, by the simulator:")
    rows = project(durations, groups, train_time)
    for eta, (rate, st, util) in rows.items():
        name = "synchronous (bound 0)" if eta == 0 else f"async, bound {eta}"
        print(
            f"  {name:24s} {rate:.3f} steps/s  x{rate / rows[0][0]:.2f}  staleness {st:.2f}  worker use {util:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
