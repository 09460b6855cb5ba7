"""The pipeline simulator calibrated from real runs: what a run's history says, and the simulator's prediction of it.

Used by ``python -m lrl_lab.experiments.pipeline`` (docs/results/pipeline.md). It lives with the experiments, not in
``lrl_lab.sim``, because it reads training-run histories and times a policy workload; the simulator needs only torch.
A run is a dict with its ``eta`` (the staleness bound) and its ``history`` (the lines of its ``--history-file``).
The simulator's job is one *unit*, a rollout worker's share of one batch, so one worker and one unit per step are
``n_slots=1, batch_size=1``.
"""

from __future__ import annotations

import multiprocessing as mp
import time

from lrl_lab.experiments.stats import mean

SKIP = 2  # steps left out of a rate: the first steps include starting the workers and warming caches


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


def _time_outside(run: dict, key: str) -> float:
    """Mean seconds per step (step SKIP on) between step ends, less the step's `key` (its time getting data)."""
    h = run["history"]
    ends = [x["time/end"] for x in h]
    return mean([b - a - x[key] for a, b, x in zip(ends, ends[1:], h[1:])][SKIP:])


def sync_train_time(run: dict) -> float:
    """The trainer's seconds per step outside sampling, from a synchronous run's logs."""
    return _time_outside(run, "time/sample")


def async_train_time(run: dict) -> float:
    """The trainer's seconds per step outside waiting for data, from an async run's logs."""
    return _time_outside(run, "pipeline/trainer_wait")


def handoff(run: dict) -> float:
    """A bound-0 async run's hand-off: what the trainer waited beyond the unit's generation (publishing the
    weights, messages, the worker's weight load), seconds per step."""
    h = run["history"]
    return max(mean([x["pipeline/trainer_wait"] - max(x["time/group_seconds"]) for x in h][SKIP:]), 0.0)


def simulate(durations: list[float], train_time: float, sync_time: float, eta: int, steps: int) -> dict:
    """The simulator with one worker and one unit per step -> step ends, per-step staleness, histogram."""
    import torch

    from lrl_lab.sim import simulate_pipeline

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
