"""The chapter's five pipeline designs run for real on TinyAgent with slow, long-tailed tools, and the pipeline
simulator calibrated from each run and checked against it.

    python -m lrl_lab.experiments.pipeline --designs chapter --repeats 3 --json results/designs/hard.json
    python -m lrl_lab.experiments.pipeline --designs chapter --repeats 3 --staleness-drop false --json FILE
    python -m lrl_lab.experiments.pipeline --designs chapter --report --json FILE   # the table again

Every run is ``python train.py`` with 64 slots in one rollout engine, 8 tasks x 8 episodes a step, and every
environment step delayed by ``--tool-latency lognormal:0.3:1.0`` (median 0.3 s, sigma 1: the chapter's duration
model has a log-normal tool latency with sigma 1; two tool calls an episode make a mean of about 1 s and a 99th
percentile of about 4.5 s, so a synchronous step waits for a straggler several times the mean). The designs:

- synchronous: ``--pipeline sync --slots 64``: the batch generated concurrently, then trained;
- one step ahead, drain: ``--pipeline async --max-staleness 1 --partial-rollouts drain``;
- async, bound 1 / 2, partial: ``--max-staleness 1`` / ``2`` with ``--partial-rollouts interrupt``;
- async, bound 4, drain: ``--max-staleness 4 --partial-rollouts drain``.

The simulator (:func:`lrl_lab.sim.board.simulate_board`, the pipeline as lrl runs it) predicts each run from what was
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

from lrl.pipeline.policies import DEFAULT_POLICY, is_default
from lrl_lab.experiments.designs_predict import calibration_of, predicted, predicted_from
from lrl_lab.experiments.inputs import read_history
from lrl_lab.experiments.labels import run_folder, split_policy
from lrl_lab.experiments.stats import mean_se, median
from lrl_lab.experiments.workload import (
    DESIGN_FLAGS,
    DESIGNS,
    GROUP,
    GROUPS,
    RUN_FLAGS,
    SKIP,
    SLOTS,
    STEPS,
    durations,
    train_command,
)
from lrl_lab.sim.board import Steps  # a patience in trainer steps

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
        if not is_default(policy):
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
    policy: str = DEFAULT_POLICY,
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


def summarise(runs: list[dict], drop: bool, cal=None, policy: str = DEFAULT_POLICY) -> list[dict]:
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
        pol = DEFAULT_POLICY if DESIGNS[design].get("sync") else policy
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


def main(args, extra: list[str]) -> int:
    """``python -m lrl_lab.experiments.pipeline --designs chapter``: run (or reuse), summarise, report."""
    from lrl_lab.experiments.designs_report import markdown, plot, projection, tool_time_plot, tool_time_table

    drop = args.staleness_drop
    env = getattr(args, "env", "tinyagent")
    slots = args.slots or SLOTS
    frozen = bool(getattr(args, "freeze_policy", False))
    policy = getattr(args, "stale_policy", DEFAULT_POLICY)
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
