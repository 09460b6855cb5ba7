"""The asynchronous pipeline measured, and the simulator's prediction of it checked against the measurement.

    python -m lrl_lab.experiments.pipeline --staleness 0 1 2 4 --repeats 3 --json results/pipeline/pipeline.json

For each repeat (seed), a synchronous run and, for every staleness bound ETA, ``python train.py --pipeline async
--max-staleness ETA`` with one rollout worker beside the trainer, each process on one torch thread. The
simulator (:func:`lrl_lab.sim.simulate_pipeline`) then predicts each async run from measured quantities only:

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
import os
import subprocess
import time
from pathlib import Path

from lrl.cli import OneLineParser
from lrl.pipeline.policies import DEFAULT_POLICY, STALE_POLICIES, is_default, takes_patience
from lrl_lab.experiments.calibrate import (
    SKIP,
    async_train_time,
    co_run_slowdown,
    compare,
    handoff,
    steps_per_s,
    sync_train_time,
)
from lrl_lab.experiments.inputs import (
    ERRORS,
    InputError,
    numbers,
    outputs,
    predict_from,
    read_history,
    read_results,
)
from lrl_lab.experiments.pipeline_report import markdown, plot
from lrl_lab.experiments.stats import mean, mean_se, median
from lrl_lab.experiments.workload import RUN_FLAGS, train_command
from lrl_lab.sim.checks import patience_problems


def name_of(kind: str, eta: int, repeat: int) -> str:
    return f"{kind}{'' if kind == 'sync' else eta}-r{repeat}"


def stored(kind: str, eta: int, repeat: int, out: Path) -> dict:
    """A run of an earlier invocation, from its history file."""
    name = name_of(kind, eta, repeat)
    history = read_history(out / "histories" / f"{name}.jsonl")
    return {"name": name, "kind": kind, "eta": eta, "repeat": repeat, "history": history, "wall_s": 0.0}


def run_once(kind: str, eta: int, repeat: int, args, out: Path) -> dict:
    """One train.py run (kind "sync" or "async") -> its history lines and wall time."""
    name = name_of(kind, eta, repeat)
    history = out / "histories" / f"{name}.jsonl"
    history.parent.mkdir(parents=True, exist_ok=True)
    if history.exists():
        history.unlink()  # a file of this experiment's own, rewritten on every run of it
    cmd = train_command(*RUN_FLAGS, "--max-steps", str(args.steps), "--seed", str(repeat))
    cmd += ["--log-dir", str(out / "runs"), "--run-name", name, "--history-file", str(history)]
    if kind == "async":
        cmd += ["--pipeline", "async", "--rollout-workers", "1", "--max-staleness", str(eta)]
        cmd += ["--partial-rollouts", args.partial]
    cmd += args.flags
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
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


def summarise(runs: list[dict], etas: list[int], steps: int, co: dict) -> list[dict]:
    """One row per bound: measured (median and mean over repeats) against predicted."""
    by = {(r["kind"], r["eta"], r["repeat"]): r for r in runs}
    repeats = sorted({r["repeat"] for r in runs})
    sync = [steps_per_s([h["time/end"] for h in by[("sync", 0, k)]["history"]]) for k in repeats]
    handoffs = {k: handoff(by[("async", 0, k)]) for k in repeats}
    async_train = {k: async_train_time(by[("async", 0, k)]) for k in repeats}
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
            others = [j for j in repeats if j != k] or [k]  # not from the run predicted
            sync_time = mean([handoffs[j] for j in others])
            train = sync_train_time(by[("sync", 0, k)])
            cell = compare(by[("async", eta, k)], train, sync_time, co["slowdown"], steps)
            # the same prediction with the trainer's time from the other repeats' bound-0 async runs
            train = mean([async_train[j] for j in others])
            cell["predicted_async_cal"] = compare(
                by[("async", eta, k)], train, sync_time, co["slowdown"], steps
            )["predicted"]
            cells.append(cell)
        row = {"staleness_bound": eta}
        names = {
            "measured": "measured_steps_per_s",
            "predicted": "predicted_steps_per_s",
            "predicted_no_contention": "predicted_steps_per_s_no_contention",
            "predicted_async_cal": "predicted_steps_per_s_async_calibrated",
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
        measured = row["measured_steps_per_s_median"]
        row["rate_error_async_calibrated"] = row["predicted_steps_per_s_async_calibrated"] / measured - 1
        row["speedup_over_sync"] = row["measured_steps_per_s"] / mean(sync)
        row["per_repeat"] = cells
        rows.append(row)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m lrl_lab.experiments.pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--staleness",
        type=int,
        nargs="+",
        default=[0, 1, 2, 4],
        help="bounds to run (0 is required: it calibrates)",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per bound, seeds 0 .. N-1 (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="with --designs: seeds FIRST .. FIRST+N-1")
    p.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    p.add_argument(
        "--partial", choices=("drain", "interrupt"), default="drain", help="partial rollouts (default drain)"
    )
    p.add_argument(
        "--designs",
        choices=("chapter",),
        default=None,
        help="run the chapter's five designs with slow tools instead (lrl_lab.experiments.designs)",
    )
    p.add_argument(
        "--staleness-drop",
        choices=("true", "false"),
        default="true",
        help="with --designs: the consumer-side drop (false: the throttle alone, the chapter's setting)",
    )
    p.add_argument(
        "--stale-policy",
        choices=STALE_POLICIES,
        default=DEFAULT_POLICY,
        help="with --designs: train.py --stale-policy of the async designs (runs go to a folder of their own)",
    )
    p.add_argument(
        "--take-patience",
        type=float,
        default=None,
        metavar="S",
        help="with --designs --stale-policy ordered: train.py --take-patience (runs go to a folder of their own, "
        "...-ordered-wS)",
    )
    p.add_argument(
        "--take-patience-steps",
        type=float,
        default=None,
        metavar="K",
        help="with --designs --stale-policy ordered: train.py --take-patience-steps (the patience in trainer steps; "
        "runs go to ...-ordered-wKx)",
    )
    p.add_argument(
        "--env",
        choices=("tinyagent", "codefix"),
        default="tinyagent",
        help="with --designs (and --compare-policies): TinyAgent with drawn tool latencies, or codefix's real "
        "sandboxed test runs",
    )
    p.add_argument(
        "--slots", type=int, default=None, help="with --designs: slots of the rollout engine (default 64)"
    )
    p.add_argument(
        "--freeze-policy",
        choices=("true", "false"),
        default="false",
        help="with --designs: a fixed workload (train.py --freeze-policy): the designs compared on one policy "
        "(with --compare-policies: the runs made so)",
    )
    p.add_argument(
        "--only",
        nargs="+",
        default=None,
        metavar="DESIGN",
        help="with --designs: run these designs only (synchronous, drain1, partial1, partial2, drain4)",
    )
    p.add_argument(
        "--predict-from",
        default=None,
        metavar="FILE",
        help="with --designs: predict from this calibration (lrl_lab.experiments.engine_cost's JSON), not the runs; "
        "{seed} in the name takes each run's own seed's calibration",
    )
    p.add_argument(
        "--out", default=None, help="folder for runs, histories, table.md, plot (default results/pipeline)"
    )
    p.add_argument("--json", default=None, help="also write the rows here (default OUT/pipeline.json)")
    p.add_argument(
        "--report", action="store_true", help="no runs: rebuild the table and plot from OUT's histories"
    )
    p.add_argument(
        "--compare-policies",
        action="store_true",
        help="no runs: the staleness policies' runs of async bound 1, partial (--designs chapter --stale-policy P), "
        "as one table and a figure of throughput against waste (results/designs/policies.md, policies.png)",
    )
    p.add_argument("flags", nargs="*", help="train.py flags for every run, after --")
    return p


def check_designs(args, p: argparse.ArgumentParser) -> None:
    """--designs' options, by train.py's rules where train.py has them, and --predict-from's calibrations (every
    seed's a run will use), before any run."""
    if not is_default(args.stale_policy) and not args.staleness_drop:
        p.error("--stale-policy applies to the hard bound: it cannot go with --staleness-drop false")
    if args.take_patience is not None and args.take_patience_steps is not None:
        p.error("--take-patience-steps applies to --stale-policy ordered, instead of --take-patience")
    patience = [args.take_patience] if args.take_patience is not None else None
    steps = [args.take_patience_steps] if args.take_patience_steps is not None else None
    for problem in patience_problems(patience, steps, takes_patience(args.stale_policy), "--stale-policy"):
        p.error(problem)
    if args.slots is not None and args.slots < 1:
        p.error("--slots must be at least 1")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    seeds = range(args.first_seed, args.first_seed + args.repeats) if not args.report else []
    for problem in predict_from(args.predict_from, seeds):
        p.error(problem)


def stored_runs(plan: list, out: Path, json_path: Path) -> tuple[dict, list[dict]]:
    """--report: the co-run measurement and the runs an earlier invocation stored -> (co_run, runs)."""
    payload = read_results(json_path, dict, "the rows and co-run slowdown of an earlier run of this command")
    co = payload.get("co_run")
    if not isinstance(co, dict) or not isinstance(co.get("slowdown"), (int, float)) or not co["slowdown"] > 0:
        raise InputError(f"{json_path}: no co_run slowdown (the file an earlier run of this command wrote)")
    runs = [stored(kind, eta, k, out) for kind, eta, k in plan]
    for run in runs:
        numbers(out / "histories" / f"{run['name']}.jsonl", run["history"], ("time/end",))
    return co, runs


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    for problem in outputs(("--out", args.out, "dir"), ("--json", args.json, "file")):
        p.error(problem)
    try:
        if args.compare_policies:
            from lrl_lab.experiments import policies

            for problem in predict_from(
                args.predict_from if "{seed}" not in (args.predict_from or "") else None, []
            ):
                p.error(problem)
            return policies.main(
                Path(args.out) if args.out else policies.ROOT,
                predict_from=args.predict_from,
                env=args.env,
                frozen=args.freeze_policy == "true",
            )
        if args.designs:
            from lrl_lab.experiments import designs

            args.staleness_drop = args.staleness_drop == "true"
            args.freeze_policy = args.freeze_policy == "true"
            check_designs(args, p)
            return designs.main(args, args.flags)
        return staleness_bounds(args, p)
    except ERRORS as err:
        p.error(str(err))


def staleness_bounds(args, p: argparse.ArgumentParser) -> int:
    """The staleness bounds measured and predicted (the command without --designs)."""
    args.out = args.out or "results/pipeline"
    if 0 not in args.staleness:
        p.error("--staleness must include 0: the bound-0 run calibrates the simulator")
    if args.steps <= SKIP + 2:
        p.error(f"--steps must be above {SKIP + 2}")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    etas = sorted(set(args.staleness))
    out = Path(args.out)
    json_path = Path(args.json) if args.json else out / "pipeline.json"
    plan = [("sync", 0, k) for k in range(args.repeats)] + [
        ("async", e, k) for k in range(args.repeats) for e in etas
    ]
    if args.report:
        co, runs = stored_runs(plan, out, json_path)
    else:
        out.mkdir(parents=True, exist_ok=True)
        print("measuring the co-run slowdown ...", flush=True)
        co = co_run_slowdown()
        print(f"  {co['slowdown']:.2f}x", flush=True)
        runs = []
        for i, (kind, eta, k) in enumerate(plan, 1):
            run = run_once(kind, eta, k, args, out)
            runs.append(run)
            rate = steps_per_s([h["time/end"] for h in run["history"]])
            print(f"[{i}/{len(plan)}] {run['name']}: {rate:.3f} steps/s ({run['wall_s']:.0f} s)", flush=True)
    rows = summarise(runs, etas, args.steps, co)
    note = (
        f"`python -m lrl_lab.experiments.pipeline --staleness {' '.join(map(str, etas))} --repeats {args.repeats} "
        f"--steps {args.steps} --partial {args.partial}`; one rollout worker, {os.cpu_count()} CPU cores; "
        "mean ± standard error over repeats."
    )
    text = markdown(rows, co, note)
    (out / "table.md").write_text(text)
    payload = {"rows": rows, "co_run": co, "command": note}
    json_path.write_text(json.dumps(payload, indent=1))
    plot(rows, out / "pipeline.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
