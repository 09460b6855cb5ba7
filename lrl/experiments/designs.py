"""The chapter's five pipeline designs run for real on TinyAgent with slow, long-tailed tools, and the pipeline
simulator calibrated from each run and checked against it.

    python -m lrl.experiments.pipeline --designs chapter --repeats 3 --json results/designs/hard.json
    python -m lrl.experiments.pipeline --designs chapter --repeats 3 --staleness-drop false --json FILE
    python -m lrl.experiments.pipeline --designs chapter --report --json FILE   # the table again

Every run is ``python train.py`` with 64 slots in one rollout engine, 8 tasks x 8 episodes a step, and every
environment step delayed by ``--tool-latency lognormal:0.3:1.0`` (median 0.3 s, sigma 1: the chapter's duration
model has a log-normal tool latency with sigma 1; two tool calls an episode make a mean of about 1 s and a 99th
percentile of about 4.5 s, so a synchronous step waits for a straggler several times the mean). The designs:

- synchronous: ``--pipeline sync --slots 64``: the batch generated concurrently, then trained;
- one step ahead, drain: ``--pipeline async --max-staleness 1 --partial-rollouts drain``;
- async, bound 1 / 2, partial: ``--max-staleness 1`` / ``2`` with ``--partial-rollouts interrupt``;
- async, bound 4, drain: ``--max-staleness 4 --partial-rollouts drain``.

The simulator (:func:`lrl.sim.board.simulate_board`, the pipeline as lrl runs it) predicts each run from what was
measured in that run only: the wall time of every episode in the order they started (``time/finished_seconds``;
episodes still in flight at the end are drawn again from the measured ones, in order), the trainer's seconds per
step outside waiting for data, and the workers' weight-load time. Nothing is fitted to the predicted quantities.

Measured and predicted quantities are taken the same way: episodes per second are the episodes trained after
step ``SKIP`` over the wall time from the end of step ``SKIP`` to the last; slot utilisation is the summed wall
time of the episodes that ended in that window over slots x window; staleness is per trained token.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import time
from pathlib import Path

from lrl.experiments.inputs import read_history
from lrl.experiments.stats import mean_se, median
from lrl.experiments.workload import (
    DESIGN_FLAGS,
    DESIGNS,
    GROUP,
    GROUPS,
    LATENCY,
    RUN_FLAGS,
    SKIP,
    SLOTS,
    STEPS,
    durations,
    switch_seconds,
    train_command,
    trainer_seconds,
)
from lrl.pipeline.policies import DEFAULT_POLICY, takes_patience
from lrl.sim.board import Steps  # a patience in trainer steps

CODEFIX_STEPS = 12  # codefix steps cost seconds of real test runs; its policy has learned by about step 5
CODEFIX_FLAGS = [  # the same shape on real tools: no drawn latency, every test and submit a sandboxed run
    "--env", "codefix", "--slots", str(SLOTS), "--tasks-per-step", str(GROUPS), "--episodes-per-task", str(GROUP),
    "--max-steps", str(CODEFIX_STEPS), *RUN_FLAGS,
]  # fmt: skip


SHORT = {  # --only's names of the designs
    "synchronous": "synchronous",
    "drain1": "one step ahead, drain",
    "partial1": "async eta=1, partial",
    "partial2": "async eta=2, partial",
    "drain4": "async eta=4, drain",
}


def file_name(design: str) -> str:
    return design.replace(" ", "_").replace(",", "").replace("=", "")


def steps_of(env: str) -> int:
    return CODEFIX_STEPS if env == "codefix" else STEPS


def run_flags(
    design: str,
    repeat: int,
    drop: bool,
    env: str = "tinyagent",
    slots: int = SLOTS,
    frozen: bool = False,
    policy: str = DEFAULT_POLICY,
) -> list[str]:
    spec = DESIGNS[design]
    base = CODEFIX_FLAGS if env == "codefix" else DESIGN_FLAGS
    flags = [*base, *spec["flags"], "--seed", str(repeat), "--slots", str(slots)]
    if not spec.get("sync"):
        flags += ["--staleness-drop", "true" if drop else "false"]
        if policy != DEFAULT_POLICY:
            name, wait = split_policy(policy)
            flags += ["--stale-policy", name]
            if wait is not None:
                flags += ["--take-patience-steps" if isinstance(wait, Steps) else "--take-patience", f"{wait:g}"]
    if frozen:
        flags += ["--freeze-policy", "true"]
    return flags


def run_once(
    design: str,
    repeat: int,
    drop: bool,
    out: Path,
    extra: list[str],
    env: str = "tinyagent",
    slots: int = SLOTS,
    frozen: bool = False,
    policy: str = "drop",
) -> dict:
    """One train.py run of a design -> {design, repeat, history, wall_s}; an earlier run's history is reused."""
    name = f"{file_name(design)}-r{repeat}"
    history = out / "histories" / f"{name}.jsonl"
    history.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if not history.exists():
        tmp = history.with_suffix(".partial")
        tmp.unlink(missing_ok=True)
        cmd = train_command(*run_flags(design, repeat, drop, env, slots, frozen, policy), *extra)
        cmd += ["--log-dir", str(out / "runs"), "--run-name", name, "--history-file", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: train.py exited {done.returncode}: {done.stderr.strip()[-800:]}")
        tmp.rename(history)
    lines = [json.loads(x) for x in history.read_text().splitlines() if x.strip()]
    return {
        "design": design,
        "repeat": repeat,
        "history": lines,
        "wall_s": time.time() - start,
        "steps": len(lines),
        "slots": slots,
        "run_dir": str(out / "runs" / name),
    }


def final_pass_rate(run: dict) -> float:
    """The held-out pass rate a run logged last (its evaluation at the end), from its TensorBoard events;
    nan where it logged none."""
    folder = run.get("run_dir")
    files = sorted(Path(folder).glob("version_*/events.out.tfevents.*")) if folder else []
    if not files:
        return math.nan
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(files[-1]), size_guidance={"scalars": 0})
    events.Reload()
    if "val/pass_rate" not in events.Tags()["scalars"]:
        return math.nan
    return float(events.Scalars("val/pass_rate")[-1].value)


def token_hist(history: list[dict]) -> list[float]:
    """Trained tokens per staleness, normalised."""
    counts: list[int] = []
    for h in history:
        for k, c in enumerate(h.get("staleness_counts") or [_sync_tokens(h)]):
            counts.extend([0] * (k + 1 - len(counts)))
            counts[k] += c
    total = sum(counts)
    return [c / total for c in counts] if total else []


def _sync_tokens(h: dict) -> int:
    """A synchronous step's trained tokens (all of staleness 0)."""
    return int(round(h["train/action_tokens"] * GROUP * GROUPS))


def measured(run: dict) -> dict:
    h = run["history"]
    ends = [x["time/end"] for x in h]
    window = ends[-1] - ends[SKIP]
    trained = sum(len(x.get("trained_ids", [])) or GROUP * GROUPS for x in h[SKIP + 1 :])
    finished = [s for x in h[SKIP + 1 :] for _, s in x.get("time/finished_seconds", [])]
    trained_s = [s for x in h for s in x.get("time/episode_seconds", [])] or durations(h)
    hist = token_hist(h)
    return {
        "episodes_per_s": trained / window,
        "slot_util": sum(finished) / (run.get("slots", SLOTS) * window),
        "staleness_mean": sum(k * p for k, p in enumerate(hist)),
        "staleness_max": max(k for k, p in enumerate(hist) if p > 0),
        "staleness_hist": hist,
        "trained_duration": statistics.fmean(trained_s),
        "launched_duration": statistics.fmean(durations(h)),
        "dropped": int(sum(x.get("pipeline/dropped", 0) for x in h)),
        "pass_rate": final_pass_rate(run),
        **waste(h),
    }


def waste(history: list[dict]) -> dict:
    """A run's action tokens over all its steps: decoded, wasted (decoded, never trained), masked, and the
    episodes aborted (zeros where the run logged none: the synchronous stream wastes nothing)."""
    total = lambda key: sum(x.get(key, 0.0) for x in history)  # noqa: E731
    decoded = total("pipeline/decoded_tokens")
    return {
        "decoded_tokens": decoded,
        "wasted_tokens": total("pipeline/wasted_tokens"),
        "masked_tokens": total("pipeline/masked_tokens"),
        "aborted": int(total("pipeline/aborted")),
        "cut": int(total("pipeline/cut")),
        "wasted_share": total("pipeline/wasted_tokens") / decoded if decoded else 0.0,
    }


def waste_sources(history: list[dict], group: int = GROUP) -> dict:
    """Where a run's waste could come from, against its trainer's pace (the mean seconds between step ends, P):
    the share of its finished episodes that lasted longer than P and than 2P (an episode whose action was decoded
    early in a version's reign has about P, at most about 2P, to be trained within bound 1), and the share of the
    finished episodes' action tokens that are in a group whose slowest finished episode lasted longer than 2P
    (its siblings wait for it). Episodes stopped in flight (abort, cut) never finish and are not counted."""
    ends = [x["time/end"] for x in history if "time/end" in x]
    if len(ends) < 2:
        return {
            "period_s": math.nan,
            "over_1p": math.nan,
            "over_2p": math.nan,
            "group_over_2p_tokens": math.nan,
        }
    period = (ends[-1] - ends[0]) / (len(ends) - 1)
    seconds = {int(i): s for x in history for i, s in x.get("time/finished_seconds", [])}
    tokens = {
        int(i): sum(t[0] for t in (e["turns"] if isinstance(e, dict) else e))
        for x in history
        for i, e in x.get("time/finished_turns", [])
    }
    slowest: dict[int, float] = {}
    for i, s in seconds.items():
        slowest[i // group] = max(slowest.get(i // group, 0.0), s)
    n = len(seconds)
    total = sum(tokens.values())
    late = sum(t for i, t in tokens.items() if slowest.get(i // group, 0.0) > 2 * period)
    return {
        "period_s": period,
        "over_1p": sum(s > period for s in seconds.values()) / n if n else math.nan,
        "over_2p": sum(s > 2 * period for s in seconds.values()) / n if n else math.nan,
        "group_over_2p_tokens": late / total if total else math.nan,
    }


def window_rate(sim: dict) -> float:
    """A simulation's trained episodes per second, taken as a run's are: after step SKIP, to the last step."""
    ends = sim["step_ends"]
    return sum(sim["step_trained"][SKIP + 1 :]) / (ends[-1] - ends[SKIP])


def split_policy(label: str) -> tuple[str, float | None]:
    """A policy as this experiment names it -> (lrl's --stale-policy, its patience): ``ordered@1.2`` is
    ``ordered`` with a patience of 1.2 s, ``ordered@1x`` one of a trainer step (a :class:`Steps`); any other name
    has none."""
    name, _, wait = label.partition("@")
    if not wait:
        return name, None
    steps = wait.endswith("x")
    try:
        value = float(wait[:-1] if steps else wait)
    except ValueError:
        value = math.nan
    if not takes_patience(name) or not value >= 0 or not math.isfinite(value):
        raise SystemExit(
            f"policy {label!r}: only ordered takes a patience, in seconds >= 0 (ordered@1.2) or in trainer steps "
            "(ordered@1x)"
        )
    return name, Steps(value) if steps else value


def patience_text(wait: float) -> str:
    """A patience as a folder or label writes it: ``1.2`` (seconds) or ``1x`` (trainer steps)."""
    return f"{wait:g}x" if isinstance(wait, Steps) else f"{wait:g}"


def shown(label: str) -> str:
    """A policy label as tables and figures show it: ``ordered@1.2`` is ``ordered, 1.2 s``, ``ordered@1x``
    ``ordered, 1 step``."""
    name, wait = split_policy(label)
    if wait is None:
        return name
    if isinstance(wait, Steps):
        return f"{name}, {wait:g} step" + ("" if wait == 1 else "s")
    return f"{name}, {wait:g} s"


def sim_policy(label: str) -> dict:
    """The simulator's arguments of a policy label (lrl.sim.board.simulate_board: policy, patience, or
    patience_steps)."""
    name, wait = split_policy(label)
    if isinstance(wait, Steps):
        return {"policy": name, "patience_steps": float(wait)}
    return {"policy": name, "patience": math.inf if wait is None else wait}


def predicted(run: dict, drop: bool, policy: str = "drop") -> dict:
    """The simulator's prediction of a run from the run's own measured durations, trainer time and loads."""
    from lrl.sim.board import simulate_board

    spec = DESIGNS[run["design"]]
    h = run["history"]
    sync = bool(spec.get("sync"))
    sim = simulate_board(
        durations(h),
        run.get("slots", SLOTS),
        GROUP,
        GROUPS,
        trainer_seconds(h, sync),
        switch_seconds(h),
        spec["eta"],
        spec["interrupt"],
        run.get("steps") or len(h),
        drop=drop,
        sync_before=sync,
        **sim_policy(policy),
    )
    return {
        "episodes_per_s": window_rate(sim),
        "slot_util": sim["slot_util"],
        "staleness_mean": sim["staleness_mean"],
        "staleness_max": sim["staleness_max"],
        "staleness_hist": sim["staleness_hist"],
        "trained_duration": sim["trained_duration"],
        "dropped": sim["dropped"],
        "aborted": sim["aborted"],
        "cut": sim["cut"],
        "wasted_share": sim["wasted_tokens"] / max(sim["decoded_tokens"], 1e-9),  # episodes as equal units
        "inputs": {
            "durations": len(durations(h)),
            "train_s": trainer_seconds(h, sync),
            "switch_s": switch_seconds(h),
        },
    }


def load_calibration(path) -> dict:
    """A calibration file (lrl.experiments.engine_cost with --run) -> its parts, checked (lrl.sim.calibration;
    TraceError naming the file)."""
    from lrl.sim import calibration

    cal = calibration.read(str(path))
    if cal.get("tool_servers"):  # a pool of tool servers: a call's time is a tool's own run, the wait simulated
        for part in cal["runs"]:
            part["turns"] = with_service(part["turns"], part.get("tool_service") or [])
    return cal


def calibration_of(predict_from: str | None):
    """`--predict-from`: None, one calibration, or with ``{seed}`` in the name a function of a run's seed."""
    if not predict_from:
        return None
    if "{seed}" not in predict_from:
        return load_calibration(predict_from)
    cache: dict = {}

    def of_seed(seed: int) -> dict:
        if seed not in cache:
            path = Path(predict_from.format(seed=seed))
            if not path.is_file():
                raise SystemExit(f"--predict-from: no calibration for seed {seed} ({path})")
            cache[seed] = load_calibration(path)
        return cache[seed]

    return of_seed


def with_service(turns: list, service: list[float]) -> list:
    """`turns` with each tool wait replaced by the next of `service` (the tools' own run seconds, in the order
    logged, from the first again when they run out): a recorded wait includes the queue for a server."""
    if not service:
        raise SystemExit("a calibration with tool_servers needs its runs' tool_service (env/tool_times)")
    out, k = [], 0
    for episode in turns:
        parts = episode["turns"] if isinstance(episode, dict) else episode
        new = []
        for turn in parts:
            if float(turn[1]) > 0:
                new.append([turn[0], service[k % len(service)], *turn[2:]])
                k += 1
            else:
                new.append(list(turn))
        out.append({**episode, "turns": new} if isinstance(episode, dict) else new)
    return out


def predicted_from(run: dict, drop: bool, cal: dict, policy: str = "drop") -> dict:
    """The load model's prediction of a run from a calibration only: the engine curve and co-run slowdown of the
    benchmark, the trainer's seconds and the workload's turns of each calibration run (the prediction is the mean
    over them; staleness max the largest). Nothing of `run` enters but its configuration (design, slots,
    steps)."""
    from lrl.sim.board import simulate_board
    from lrl.sim.calibration import co_run_of, engine_of

    spec = DESIGNS[run["design"]]
    sync = bool(spec.get("sync"))
    curve = engine_of("the calibration", cal)
    slow = co_run_of(cal) if not sync else 1.0  # sync: the trainer has the cores alone
    switch_s = float(cal["engine"].get("switch_s", 0.0))
    servers = cal.get("tool_servers")  # None: tools at once; else turns of service times
    sims = []
    for part in cal["runs"]:
        sim = simulate_board(
            None,
            run.get("slots", SLOTS),
            GROUP,
            GROUPS,
            float(part["train_s"]) * slow,
            switch_s,
            spec["eta"],
            spec["interrupt"],
            run.get("steps") or len(run["history"]),
            drop=drop,
            sync_before=sync,
            turns=part["turns"],
            engine=curve,
            co_run=slow,
            **sim_policy(policy),
            tool_servers=servers,
        )
        sim["episodes_per_s"] = window_rate(sim)
        sims.append(sim)
    mean = lambda key: statistics.fmean(s[key] for s in sims)  # noqa: E731
    width = max(len(s["staleness_hist"]) for s in sims)
    hist = [statistics.fmean(s["staleness_hist"][k] if k < len(s["staleness_hist"]) else 0.0 for s in sims)
            for k in range(width)]  # fmt: skip
    return {
        "episodes_per_s": mean("episodes_per_s"),
        "slot_util": mean("slot_util"),
        "staleness_mean": mean("staleness_mean"),
        "staleness_max": max(s["staleness_max"] for s in sims),
        "staleness_hist": hist,
        "trained_duration": mean("trained_duration"),
        "dropped": round(mean("dropped")),
        "aborted": round(mean("aborted")),
        "cut": round(mean("cut")),
        "wasted_share": statistics.fmean(s["wasted_tokens"] / max(s["decoded_tokens"], 1e-9) for s in sims),
        "per_calibration_run": [s["episodes_per_s"] for s in sims],
        "inputs": {"runs": len(sims), "switch_s": switch_s, "co_run": slow},
    }


def real_tool_table(runs: list[dict]) -> str:
    """Per design, medians over repeats: episodes/s beside tool calls/s, and the policy's tests per episode.

    On real tools an episode's cost is the policy's own choice (how many candidates it tests), so designs that
    train different policies differ in episodes/s for that reason too: sandboxed runs per second, over the same
    window, is the pipeline's throughput with the policy's choice taken out."""
    rows = ["| design | episodes/s | sandboxed runs/s | tests per episode (last step) | timeouts | repeats |"]
    rows.append("|---|---|---|---|---|---|")
    sync = None
    for design in DESIGNS:
        mine = [r for r in runs if r["design"] == design]
        if not mine:
            continue
        eps, calls, tests, timeouts = [], [], [], []
        for r in mine:
            h = r["history"]
            window = h[-1]["time/end"] - h[SKIP]["time/end"]
            eps.append(measured(r)["episodes_per_s"])
            calls.append(sum(x.get("env/sandbox_runs", 0.0) for x in h[SKIP + 1 :]) / window)
            tests.append(h[-1].get("train/tests", 0.0))
            timeouts.append(sum(x.get("env/verdict_timeout", 0.0) for x in h))
        sync = sync or median(calls)
        rows.append(
            f"| {design} | {median(eps):.2f} ({min(eps):.2f}-{max(eps):.2f}) | {median(calls):.1f} "
            f"({median(calls) / sync:.2f}x sync) | {median(tests):.2f} ({min(tests):.2f}-{max(tests):.2f}) | "
            f"{median(timeouts):.0f} | {len(mine)} |"
        )
    return "\n".join(rows) + "\n"


def tool_time_plot(times: list[float], path: Path) -> None:
    """Histogram of the real tool calls' times beside as many draws of the slow-tool workload's lognormal."""
    import math
    import random

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    median_s, sigma = (float(x) for x in LATENCY.split(":")[1:])
    rng = random.Random(0)
    drawn = [median_s * math.exp(sigma * rng.gauss(0, 1)) for _ in times]
    bins = [10 ** (k / 10) for k in range(-20, 11)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.hist(times, bins=bins, alpha=0.75, label=f"codefix: {len(times)} sandboxed test runs, measured")
    ax.hist(drawn, bins=bins, alpha=0.5, label=f"{LATENCY}: as many draws")
    ax.set_xscale("log")
    ax.set_xlabel("tool call (s)")
    ax.set_ylabel("calls")
    ax.legend(fontsize=8)
    ax.set_title("Real tool times against the drawn lognormal", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tool_time_table(times: list[float]) -> str:
    """The real tool calls' time distribution beside the drawn lognormal of the slow-tool workload."""
    import math

    ordered = sorted(times)
    q = lambda p: ordered[min(int(p * len(ordered)), len(ordered) - 1)]  # noqa: E731
    z = {0.5: 0.0, 0.95: 1.6449, 0.99: 2.3263}
    median, sigma = (float(x) for x in LATENCY.split(":")[1:])
    rows = ["| tool time (s) | p50 | p95 | p99 | p99 / p50 | mean |", "|---|---|---|---|---|---|"]
    rows.append(
        f"| codefix, measured ({len(times)} sandboxed runs) | {q(0.5):.3f} | {q(0.95):.3f} | {q(0.99):.3f} | "
        f"{q(0.99) / q(0.5):.1f} | {statistics.fmean(times):.3f} |"
    )
    drawn = {p: median * math.exp(sigma * z[p]) for p in z}
    rows.append(
        f"| {LATENCY}, drawn | {drawn[0.5]:.3f} | {drawn[0.95]:.3f} | {drawn[0.99]:.3f} | "
        f"{drawn[0.99] / drawn[0.5]:.1f} | {median * math.exp(sigma**2 / 2):.3f} |"
    )
    return "\n".join(rows) + "\n"


def total_variation(p: list[float], q: list[float]) -> float:
    n = max(len(p), len(q))
    p = p + [0.0] * (n - len(p))
    q = q + [0.0] * (n - len(q))
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q))


def pass_rates(rates: list[float]) -> dict:
    """Held-out pass rate at the end over the repeats that logged one: mean, its standard error, how many."""
    rates = [r for r in rates if r == r]
    mu, se = mean_se(rates) if rates else (math.nan, math.nan)
    return {"measured_pass_rate": mu, "measured_pass_rate_se": se, "pass_rate_repeats": len(rates)}


def summarise(runs: list[dict], drop: bool, cal=None, policy: str = "drop") -> list[dict]:
    """One object per design: medians over repeats of what was measured and what was predicted (from the
    calibration `cal` by the load model; without one, from each run's own episode times by the duration model,
    the way this experiment was first checked, kept beside it as ``inrun_*``). `cal` may also be a function of
    a run's repeat (its seed) that returns its calibration."""
    rows = []
    for design in DESIGNS:
        mine = [r for r in runs if r["design"] == design]
        if not mine:
            continue
        m = [measured(r) for r in mine]
        pol = "drop" if DESIGNS[design].get("sync") else policy
        inrun = [predicted(r, drop, pol) for r in mine]
        calibration = cal if callable(cal) or cal is None else (lambda _r, c=cal: c)
        p = [predicted_from(r, drop, calibration(r["repeat"]), pol) for r in mine] if cal is not None else inrun
        rows.append(
            {
                "design": design,
                "staleness_drop": drop,
                "stale_policy": "-" if DESIGNS[design].get("sync") else pol,
                "repeats": len(mine),
                "measured_episodes_per_s": median([x["episodes_per_s"] for x in m]),
                "predicted_episodes_per_s": median([x["episodes_per_s"] for x in p]),
                "measured_slot_util": median([x["slot_util"] for x in m]),
                "predicted_slot_util": median([x["slot_util"] for x in p]),
                "measured_staleness_mean": median([x["staleness_mean"] for x in m]),
                "predicted_staleness_mean": median([x["staleness_mean"] for x in p]),
                "measured_staleness_max": max(x["staleness_max"] for x in m),
                "predicted_staleness_max": max(x["staleness_max"] for x in p),
                "staleness_tv": median(
                    [total_variation(a["staleness_hist"], b["staleness_hist"]) for a, b in zip(m, p)]
                ),
                "measured_trained_duration": median([x["trained_duration"] for x in m]),
                "predicted_trained_duration": median([x["trained_duration"] for x in p]),
                "measured_launched_duration": median([x["launched_duration"] for x in m]),
                "predicted_from": "calibration" if cal is not None else "the run itself",
                "inrun_episodes_per_s": median([x["episodes_per_s"] for x in inrun]),
                "inrun_slot_util": median([x["slot_util"] for x in inrun]),
                "measured_dropped": sum(x["dropped"] for x in m),
                "predicted_dropped": sum(x["dropped"] for x in p),
                "measured_aborted": sum(x["aborted"] for x in m),
                "predicted_aborted": sum(x["aborted"] for x in p),
                "measured_cut": sum(x["cut"] for x in m),
                "predicted_cut": sum(x["cut"] for x in p),
                "measured_wasted_share": median([x["wasted_share"] for x in m]),
                **pass_rates([x["pass_rate"] for x in m]),
                "predicted_wasted_share": median([x.get("wasted_share", math.nan) for x in p]),
                "per_repeat": [
                    {"measured": {k: v for k, v in a.items() if k != "staleness_hist"}, "predicted": b}
                    for a, b in zip(m, p)
                ],
            }
        )
    return rows


def load_runs(out: Path, chosen: list[str], slots: int = SLOTS) -> list[dict]:
    """The runs an experiment folder holds (its histories), of the designs `chosen`."""
    runs = []
    for path in sorted((out / "histories").glob("*.jsonl")):
        design = next(d for d in DESIGNS if path.name.startswith(file_name(d)))
        if design not in chosen:
            continue
        lines = read_history(path)
        runs.append(
            {
                "design": design,
                "repeat": int(path.stem.rsplit("-r", 1)[1]),
                "history": lines,
                "steps": len(lines),
                "slots": slots,
                "run_dir": str(out / "runs" / path.stem),
            }
        )
    return runs


def env_prefix(env: str) -> str:
    """What the folders of an environment's runs begin with (``results/designs/<prefix>hard...``)."""
    return "codefix-" if env == "codefix" else ""


def run_folder(
    env: str = "tinyagent",
    drop: bool = True,
    frozen: bool = False,
    slots: int = SLOTS,
    policy: str = DEFAULT_POLICY,
) -> str:
    """The folder name under results/designs of a setting's runs: ``[codefix-]hard|throttle[-frozen][-sN][-P]``."""
    name = env_prefix(env) + ("hard" if drop else "throttle") + ("-frozen" if frozen else "")
    name += f"-s{slots}" if slots != SLOTS else ""
    if policy == DEFAULT_POLICY:
        return name
    base, wait = split_policy(policy)
    return name + f"-{base}" + (f"-w{patience_text(wait)}" if wait is not None else "")


def main(args, extra: list[str]) -> int:
    """``python -m lrl.experiments.pipeline --designs chapter``: run (or reuse), summarise, report."""
    from lrl.experiments.designs_report import markdown, plot, projection

    drop = args.staleness_drop
    env = getattr(args, "env", "tinyagent")
    slots = args.slots or SLOTS
    frozen = bool(getattr(args, "freeze_policy", False))
    policy = getattr(args, "stale_policy", "drop")
    if getattr(args, "take_patience", None) is not None:
        policy = f"{policy}@{args.take_patience:g}"  # ordered with a patience: a folder of its own
    if getattr(args, "take_patience_steps", None) is not None:
        policy = f"{policy}@{args.take_patience_steps:g}x"  # in trainer steps
    out = Path(args.out or f"results/designs/{run_folder(env, drop, frozen, slots, policy)}")
    only = [SHORT.get(x, x) for x in (getattr(args, "only", None) or [])]
    unknown = [x for x in only if x not in DESIGNS]
    if unknown:
        raise SystemExit(f"--only: unknown design(s) {unknown}; choose from {sorted(SHORT)}")
    chosen = [d for d in DESIGNS if not only or d in only]
    runs = []
    if not args.report:
        first = getattr(args, "first_seed", 0)
        for repeat in range(first, first + args.repeats):
            for design in chosen:
                run = run_once(design, repeat, drop, out, extra, env, slots, frozen, policy)
                runs.append(run)
                print(
                    f"  {design:24s} repeat {repeat}: {measured(run)['episodes_per_s']:.2f} episodes/s",
                    flush=True,
                )
    else:
        runs = load_runs(out, chosen, slots)
    # one calibration, or one per seed ({seed} in the name: the same frozen policy at another size)
    cal = calibration_of(getattr(args, "predict_from", None))
    rows = summarise(runs, drop, cal, policy)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    times = [t for r in runs for x in r["history"] for t in x.get("env/tool_times", [])]
    if times:
        table += "\n" + real_tool_table(runs) + "\n" + tool_time_table(times)
        tool_time_plot(times, out / "tool_times.png")
    print(table)
    (out / "table.md").write_text(table)
    plot(rows, out / "designs.png")
    print(projection(runs))
    print(f"wrote {out / 'table.md'}, {out / 'designs.png'}" + (f", {args.json}" if args.json else ""))
    return 0
