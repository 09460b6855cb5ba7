"""The asynchronous pipeline measured, and the simulator's prediction of it checked against the measurement.

    python -m lrl.experiments.pipeline --staleness 0 1 2 4 --repeats 3 --json results/pipeline/pipeline.json

For each repeat (seed), a synchronous run and, for every staleness bound ETA, ``python train.py --pipeline async
--max-staleness ETA`` with one rollout worker beside the trainer, each process on one torch thread. The
simulator (:func:`lrl.sim.simulate_pipeline`) then predicts each async run from measured quantities only:

- a job of the simulator is one *unit*, the worker's share of one batch (here the whole batch): ``n_slots`` is
  the number of workers and ``batch_size`` the units per step (both 1); the durations are the run's measured
  unit generation times (``time/group_seconds``), in order, the input the simulator takes;
- ``train_time`` is the synchronous run's seconds per step outside sampling (its ``time/end`` and
  ``time/sample`` logs), multiplied, when generation and training overlap (ETA >= 1), by the co-run slowdown:
  a fixed workload timed alone and as two concurrent processes on this machine;
- ``sync_time`` is the hand-off (what a bound-0 async run's trainer waited beyond the unit's generation:
  publishing, messages, the worker's weight load), taken from the other repeats' bound-0 runs.

Measured steps per second come from each step's ``time/end`` in the run's history (step ``SKIP`` to the last),
predicted ones from the simulator's step ends the same way. A batch's staleness is that of its oldest token
(every episode's first token is generated on the version its unit started with), which is what the simulator
predicts per step; the token-staleness histograms weight each step by its trained tokens. Flags after ``--`` go
to every run.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

SKIP = 2  # steps left out of the rate: the first steps include starting the workers and warming caches
RUN_FLAGS = [
    "--eval-every",
    "100000",
    "--eval-at-start",
    "false",
    "--eval-episodes",
    "1",
    "--checkpoint-every",
    "0",
    "--progress",
    "false",
    "--threads",
    "1",
]


def run_once(kind: str, eta: int, repeat: int, args, out: Path) -> dict:
    """One train.py run (kind "sync" or "async") -> its history lines and wall time."""
    name = f"{kind}{'' if kind == 'sync' else eta}-r{repeat}"
    history = out / "histories" / f"{name}.jsonl"
    history.parent.mkdir(parents=True, exist_ok=True)
    if history.exists():
        history.unlink()  # a file of this experiment's own, rewritten on every run of it
    cmd = [sys.executable, "train.py", *RUN_FLAGS, "--max-steps", str(args.steps), "--seed", str(repeat)]
    cmd += ["--log-dir", str(out / "runs"), "--run-name", name, "--history-file", str(history)]
    if kind == "async":
        cmd += ["--pipeline", "async", "--rollout-workers", "1", "--max-staleness", str(eta)]
        cmd += ["--partial-rollouts", args.partial]
    cmd += args.flags
    start = time.time()
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    lines = [json.loads(x) for x in history.read_text().splitlines() if x.strip()]
    return {
        "name": name,
        "kind": kind,
        "eta": eta,
        "repeat": repeat,
        "history": lines,
        "wall_s": time.time() - start,
    }


def steps_per_s(ends: list[float]) -> float:
    """Steps per second between the end of step SKIP and the end of the last step."""
    return (len(ends) - 1 - SKIP) / (ends[-1] - ends[SKIP])


def unit_staleness(history: list[dict]) -> list[int]:
    """The staleness of each step's batch: that of its oldest trained token."""
    return [max((k for k, c in enumerate(h.get("staleness_counts", [])) if c), default=0) for h in history]


def token_staleness_mean(history: list[dict]) -> float:
    counts: list[int] = []
    for h in history:
        for k, c in enumerate(h.get("staleness_counts", [])):
            counts.extend([0] * (k + 1 - len(counts)))
            counts[k] += c
    n = sum(counts)
    return sum(k * c for k, c in enumerate(counts)) / n if n else float("nan")


def sync_train_time(run: dict) -> float:
    """The trainer's seconds per step outside sampling, from a synchronous run's logs (step SKIP on)."""
    h = run["history"]
    ends = [x["time/end"] for x in h]
    return mean([b - a - x["time/sample"] for a, b, x in zip(ends, ends[1:], h[1:])][SKIP:])


def handoff(run: dict) -> float:
    """A bound-0 async run's hand-off: what the trainer waited beyond the unit's generation (publishing the
    weights, messages, the worker's weight load), seconds per step."""
    h = run["history"]
    return max(mean([x["pipeline/trainer_wait"] - max(x["time/group_seconds"]) for x in h][SKIP:]), 0.0)


def simulate(durations: list[float], train_time: float, sync_time: float, eta: int, steps: int) -> dict:
    """The simulator with one worker and one unit per step -> step ends, per-step staleness, histogram."""
    import torch

    from lrl.sim import simulate_pipeline

    need = steps + eta + 1
    units = (durations * (need // len(durations) + 1))[:need]  # the run's own units first, in order
    result = simulate_pipeline(
        torch.tensor(units, dtype=torch.float64),
        n_slots=1,
        batch_size=1,
        train_time=train_time,
        sync_time=sync_time,
        max_staleness=eta,
        interrupt=True,  # the trainer never waits for the worker to finish before it publishes
        steps=steps,
    )
    ends = [e[3] for e in result["events"] if e[0] == "sync"]
    started = [e[4] for e in result["events"] if e[0] == "gen"]  # one unit per step, trained in this order
    return {"steps_per_s": steps_per_s(ends), "staleness": [k - started[k] for k in range(steps)]}


def _work(n: int) -> float:
    """A fixed piece of work like a rollout worker's: many small forwards of a tiny transformer, one thread."""
    import torch

    torch.set_num_threads(1)
    from lrl.envs.tinyagent import build_tokenizer
    from lrl.policy import make_policy

    model = make_policy(build_tokenizer()).eval()
    ids = torch.randint(0, 40, (64, 24))
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(n):
            model(input_ids=ids)
    return time.perf_counter() - start


def co_run_slowdown(n: int = 60) -> dict:
    """Seconds of one fixed workload alone and as two concurrent processes -> their ratio."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        alone = pool.apply(_work, (n,))
    with ctx.Pool(2) as pool:
        pair = pool.map(_work, [n, n])
    return {"alone_s": alone, "together_s": sum(pair) / 2, "slowdown": sum(pair) / 2 / alone}


def histogram(values: list[int], weights: list[float]) -> list[float]:
    out = [0.0] * (max(values) + 1)
    for v, w in zip(values, weights):
        out[v] += w / sum(weights)
    return out


def total_variation(p: list[float], q: list[float]) -> float:
    n = max(len(p), len(q))
    p, q = p + [0.0] * (n - len(p)), q + [0.0] * (n - len(q))
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q))


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def mean_se(xs: list[float]) -> tuple[float, float]:
    mu = mean(xs)
    if len(xs) < 2:
        return mu, float("nan")
    return mu, math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def compare(run: dict, train_time: float, sync_time: float, slowdown: float, steps: int) -> dict:
    """One async run against the simulator's prediction of it."""
    h = run["history"]
    eta = run["eta"]
    units = [max(x["time/group_seconds"]) for x in h]  # the measured durations: the simulator's input
    factor = slowdown if eta > 0 else 1.0  # at bound 0 nothing overlaps, so the trainer has its core alone
    pred = simulate(units, train_time * factor, sync_time, eta, steps)
    ideal = simulate(units, train_time, sync_time, eta, steps)
    measured = unit_staleness(h)
    tokens = [float(sum(x.get("staleness_counts", []))) for x in h]
    episodes = [float(len(x.get("trained_ids", []))) for x in h]
    rate = steps_per_s([x["time/end"] for x in h])
    return {
        "measured": rate,
        "predicted": pred["steps_per_s"],
        "predicted_no_contention": ideal["steps_per_s"],
        "episodes_measured": rate * mean(episodes),
        "episodes_predicted": pred["steps_per_s"] * mean(episodes),
        "st_mean": mean(measured),
        "st_pred": mean(pred["staleness"]),
        "st_max": max(measured),
        "st_pred_max": max(pred["staleness"]),
        "tv": total_variation(histogram(measured, tokens), histogram(pred["staleness"], tokens)),
        "token_st": token_staleness_mean(h),
        "dropped": sum(len(x.get("dropped_ids", [])) for x in h),
    }


def summarise(runs: list[dict], etas: list[int], steps: int, co: dict) -> list[dict]:
    """One row per bound: measured (median and mean over repeats) against predicted."""
    by = {(r["kind"], r["eta"], r["repeat"]): r for r in runs}
    repeats = sorted({r["repeat"] for r in runs})
    sync = [steps_per_s([h["time/end"] for h in by[("sync", 0, k)]["history"]]) for k in repeats]
    handoffs = {k: handoff(by[("async", 0, k)]) for k in repeats}
    rows = [
        {
            "staleness_bound": "sync",
            "measured_steps_per_s": mean_se(sync)[0],
            "measured_steps_per_s_se": mean_se(sync)[1],
        }
    ]
    for eta in etas:
        cells = []
        for k in repeats:
            others = [handoffs[j] for j in repeats if j != k] or [handoffs[k]]  # not from the run predicted
            train = sync_train_time(by[("sync", 0, k)])
            cells.append(compare(by[("async", eta, k)], train, mean(others), co["slowdown"], steps))
        row = {"staleness_bound": eta}
        names = {
            "measured": "measured_steps_per_s",
            "predicted": "predicted_steps_per_s",
            "predicted_no_contention": "predicted_steps_per_s_no_contention",
            "episodes_measured": "measured_episodes_per_s",
            "episodes_predicted": "predicted_episodes_per_s",
            "st_mean": "measured_staleness_mean",
            "st_pred": "predicted_staleness_mean",
            "tv": "staleness_tv",
            "token_st": "measured_token_staleness_mean",
        }
        for key, name in names.items():
            row[name], row[name + "_se"] = mean_se([c[key] for c in cells])
        row["measured_steps_per_s_median"] = median([c["measured"] for c in cells])
        row["measured_staleness_max"] = max(c["st_max"] for c in cells)
        row["predicted_staleness_max"] = max(c["st_pred_max"] for c in cells)
        row["dropped_episodes"] = sum(c["dropped"] for c in cells)
        row["rate_error"] = row["predicted_steps_per_s"] / row["measured_steps_per_s_median"] - 1
        row["speedup_over_sync"] = row["measured_steps_per_s"] / mean(sync)
        row["per_repeat"] = cells
        rows.append(row)
    return rows


def markdown(rows: list[dict], co: dict, note: str) -> str:
    head = [
        "pipeline",
        "steps/s measured (median; mean ± SE)",
        "steps/s predicted",
        "error vs median",
        "predicted without core sharing",
        "episodes/s measured / predicted",
        "mean staleness measured / predicted",
        "max staleness measured / predicted",
        "TV, token staleness",
        "dropped",
    ]
    lines = [note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    s = rows[0]
    lines.append(
        f"| sync | {s['measured_steps_per_s']:.3f} ± {s['measured_steps_per_s_se']:.3f} |" + " |" * 8
    )
    for r in rows[1:]:
        cells = [
            f"async, bound {r['staleness_bound']}",
            f"{r['measured_steps_per_s_median']:.3f}; {r['measured_steps_per_s']:.3f} ± {r['measured_steps_per_s_se']:.3f}",
            f"{r['predicted_steps_per_s']:.3f}",
            f"{100 * r['rate_error']:+.1f}%",
            f"{r['predicted_steps_per_s_no_contention']:.3f}",
            f"{r['measured_episodes_per_s']:.1f} / {r['predicted_episodes_per_s']:.1f}",
            f"{r['measured_staleness_mean']:.2f} / {r['predicted_staleness_mean']:.2f}",
            f"{r['measured_staleness_max']} / {r['predicted_staleness_max']}",
            f"{r['staleness_tv']:.3f}",
            f"{r['dropped_episodes']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Co-run slowdown: one fixed workload took {co['alone_s']:.2f} s alone and {co['together_s']:.2f} s as one of "
        f"two concurrent processes ({co['slowdown']:.2f}x).",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = rows[1:]
    x = [r["staleness_bound"] for r in a]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    ax = axes[0]
    ax.errorbar(
        x,
        [r["measured_steps_per_s"] for r in a],
        [2 * r["measured_steps_per_s_se"] for r in a],
        marker="o",
        capsize=3,
        label="measured",
    )
    ax.plot(x, [r["predicted_steps_per_s"] for r in a], marker="s", ls="--", label="simulator")
    ax.plot(
        x,
        [r["predicted_steps_per_s_no_contention"] for r in a],
        marker="^",
        ls=":",
        label="simulator, no core sharing",
    )
    ax.axhline(rows[0]["measured_steps_per_s"], color="gray", lw=1, label="sync")
    ax.set(xlabel="staleness bound", ylabel="training steps per second", title="throughput")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[1]
    ax.errorbar(
        x,
        [r["measured_staleness_mean"] for r in a],
        [2 * r["measured_staleness_mean_se"] for r in a],
        marker="o",
        capsize=3,
        label="measured (per batch)",
    )
    ax.plot(x, [r["predicted_staleness_mean"] for r in a], marker="s", ls="--", label="simulator")
    ax.plot(
        x, [r["measured_token_staleness_mean"] for r in a], marker="x", ls=":", label="measured (per token)"
    )
    ax.set(xlabel="staleness bound", ylabel="mean staleness (versions)", title="staleness")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--staleness",
        type=int,
        nargs="+",
        default=[0, 1, 2, 4],
        help="bounds to run (0 is required: it calibrates)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per bound, seeds 0 .. N-1 (default 3)")
    p.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    p.add_argument(
        "--partial", choices=("drain", "interrupt"), default="drain", help="partial rollouts (default drain)"
    )
    p.add_argument("--out", default="results/pipeline", help="folder for runs, histories, table.md, plot")
    p.add_argument("--json", default=None, help="also write the rows here (default OUT/pipeline.json)")
    p.add_argument("flags", nargs="*", help="train.py flags for every run, after --")
    args = p.parse_args(argv)
    if 0 not in args.staleness:
        p.error("--staleness must include 0: the bound-0 run calibrates the simulator")
    if args.steps <= SKIP + 2:
        p.error(f"--steps must be above {SKIP + 2}")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    etas = sorted(set(args.staleness))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("measuring the co-run slowdown ...", flush=True)
    co = co_run_slowdown()
    print(f"  {co['slowdown']:.2f}x", flush=True)
    plan = [("sync", 0, k) for k in range(args.repeats)] + [
        ("async", e, k) for k in range(args.repeats) for e in etas
    ]
    runs = []
    for i, (kind, eta, k) in enumerate(plan, 1):
        run = run_once(kind, eta, k, args, out)
        runs.append(run)
        rate = steps_per_s([h["time/end"] for h in run["history"]])
        print(f"[{i}/{len(plan)}] {run['name']}: {rate:.3f} steps/s ({run['wall_s']:.0f} s)", flush=True)
    rows = summarise(runs, etas, args.steps, co)
    note = (
        f"`python -m lrl.experiments.pipeline --staleness {' '.join(map(str, etas))} --repeats {args.repeats} "
        f"--steps {args.steps} --partial {args.partial}`; one rollout worker, {os.cpu_count()} CPU cores; "
        "mean ± standard error over repeats."
    )
    text = markdown(rows, co, note)
    (out / "table.md").write_text(text)
    payload = {"rows": rows, "co_run": co, "command": note}
    (Path(args.json) if args.json else out / "pipeline.json").write_text(json.dumps(payload, indent=1))
    plot(rows, out / "pipeline.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
