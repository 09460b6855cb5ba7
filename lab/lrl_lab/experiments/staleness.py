"""The staleness experiment: train with a behavior policy k updates old, with and without correction, over
seeds; mean and standard error of each row, as markdown, JSON and a plot.

    python -m lrl_lab.experiments.staleness                  # TinyAgent: lags 0 2 4 8, TIS at 4 and 8, MIS at 8, FP8
    python -m lrl_lab.experiments.staleness --seeds 10 --lr 5e-4 2e-3 -- --lr-schedule constant
    python -m lrl_lab.experiments.staleness --async-bounds 1 2 4 --async-only --jobs 1   # real async rows, lag 0 beside
    python -m lrl_lab.experiments.staleness --grid --lags 0 4 8 --levels token sequence geometric \\
        --sampler engine -- --env review                 # every correction at every level and lag, any env

Flags after ``--`` go to every run (any train.py flag). Each run reports its held-out pass rate, the training
reward by quarter of the run, the mismatch, the correction's activity (tokens over the cap, episodes whose
sequence-level ratio is over the cap or outside the MIS band), the generated tokens per episode, the held-out
pass rate on the shorter and the longer half of the held-out tasks, and the seconds of training it took to
reach a training reward of REWARD_TARGET.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from lrl.cli import OneLineParser
from lrl_lab.experiments.inputs import ERRORS, InputError, outputs, read_results
from lrl_lab.experiments.staleness_report import METRICS, REWARD_TARGET, markdown, plot, summarize

__all__ = [
    "METRICS",
    "REWARD_TARGET",
    "grid_rows",
    "main",
    "markdown",
    "one_run",
    "plot",
    "summarize",
    "time_to",
]

STALE_ROWS = [
    ("lagged", 0, "none", "token"),
    ("lagged", 2, "none", "token"),
    ("lagged", 4, "none", "token"),
    ("lagged", 8, "none", "token"),
    ("lagged", 4, "tis", "token"),
    ("lagged", 8, "tis", "token"),
    ("lagged", 8, "mis", "token"),
]
FP8_ROWS = [("fp8", 0, "none", "token"), ("fp8", 0, "tis", "token")]


def grid_rows(sampler: str, lags: list[int], corrections: list[str], levels: list[str]) -> list[tuple]:
    """One uncorrected row per lag, and each correction at each level for every lag above 0 (at lag 0 the
    sampler's weights are the trainer's, so every correction's weights are 1)."""
    rows = [(sampler, lag, "none", "token") for lag in lags]
    rows += [
        (sampler, lag, c, lvl)
        for lag in lags
        if lag > 0
        for c in corrections
        if c != "none"
        for lvl in levels
    ]
    return rows


def time_to(history: list[dict], target: float, window: int = 3) -> float:
    """Seconds of training (sampling, scoring, updates, the step KL, syncs) until the running mean of train/reward over
    `window` steps first reaches `target`; nan if it never does."""
    elapsed, rewards = 0.0, []
    for h in history:
        elapsed += sum(h.get(f"time/{k}", 0.0) for k in ("sample", "old_logp", "update", "shift", "sync"))
        rewards.append(h["train/reward"])
        if len(rewards) >= window and sum(rewards[-window:]) / window >= target:
            return elapsed
    return float("nan")


HISTORY_KEYS = (
    "train/reward",
    "train/reads",
    "train/invalid",
    "train/entropy",
    "train/step_kl",
    "train/clip_frac",
    "train/grad_norm",
    "train/reverted",
    "mismatch/abs_mean",
    "mismatch/over_cap",
    "offpolicy/masked",
)  # the per-step metrics a run keeps in results.json, for lrl_lab.experiments.staleness_causes_report


def one_run(args: tuple) -> dict:
    """Train one (row, lr, seed) cell with the shared flags -> its summary numbers, its per-step history
    (HISTORY_KEYS), its held-out evaluations and where its ratios leave the MIS band (band_probe)."""
    (sampler, lag, correction, level), lr, seed, steps, flags, eval_every = args
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from lrl.arguments import parse_args
    from lrl.callbacks import build_callbacks
    from lrl.evaluation import evaluate
    from lrl.run import build_run, fit
    from lrl_lab.experiments.band_probe import BandProbe, totals

    row = [
        "--sampler",
        sampler,
        "--correction",
        correction,
        "--lr",
        str(lr),
        "--seed",
        str(seed),
        "--max-steps",
        str(steps),
        "--eval-every",
        str(eval_every),
        "--threads",
        "1",
        "--progress",
        "false",
    ]
    if sampler == "async":  # real staleness: a rollout worker beside the trainer, `lag` is the bound
        row[1] = "onpolicy"
        row += ["--pipeline", "async", "--rollout-workers", "1", "--max-staleness", str(lag)]
    elif lag:
        row += ["--lag", str(lag)]
    row += ["--level", level] if correction != "none" else []
    cfg = parse_args([*flags, *row])
    probe = BandProbe()
    run = build_run(cfg, callbacks=[*build_callbacks(cfg), probe], logger=False)
    result = fit(run)
    hist = run.module.history
    mean = lambda key: sum(h.get(key, 0.0) for h in hist) / len(hist)  # noqa: E731
    quarter = max(len(hist) // 4, 1)
    out = {
        f"w{i}": sum(h["train/reward"] for h in hist[i * quarter : (i + 1) * quarter]) / quarter
        for i in range(4)
    }
    per_task = evaluate(
        run.policy, run.spec, None, cfg.eval_episodes, cfg.seed + 10_000, cfg.temperature, True
    )
    by_length = sorted(per_task["tasks"].values(), key=lambda t: t["action_tokens"])
    half = len(by_length) // 2
    out.update(
        heldout=result.pass_rate,
        mismatch=mean("mismatch/abs_mean"),
        over_cap=mean("mismatch/over_cap"),
        seq_over_cap=mean("offpolicy/seq_over_cap"),
        seq_outside_band=mean("offpolicy/seq_outside_band"),
        clip_frac=mean("train/clip_frac"),
        action_tokens=mean("train/action_tokens"),
        heldout_short=sum(t["pass_rate"] for t in by_length[:half]) / max(half, 1),
        heldout_long=sum(t["pass_rate"] for t in by_length[half:]) / max(len(by_length) - half, 1),
        time_to_target=time_to(hist, REWARD_TARGET),
        **{f"env_{m}": result.metrics[m] for m in run.spec.metrics},
        heldout_invalid=result.invalid,
    )
    band = totals(probe.steps)
    out.update(
        below_band=band["below"] / max(band["tokens"], 1.0),
        above_band=band["above"] / max(band["tokens"], 1.0),
    )
    return {
        "sampler": sampler,
        "lag": lag,
        "correction": correction,
        "level": level,
        "lr": lr,
        "seed": seed,
        **out,
        "history": [{"step": h["step"], **{k: h[k] for k in HISTORY_KEYS if k in h}} for h in hist],
        "evals": [
            {k: e[k] for k in ("step", "pass_rate", "invalid", *run.spec.metrics)} for e in run.module.evals
        ],
        "band": probe.steps,
    }


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m lrl_lab.experiments.staleness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, default=5, help="seeds per row (default 5)")
    p.add_argument(
        "--lr", type=float, nargs="+", default=None, help="learning rates to sweep (default: train.py's lr)"
    )
    p.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    p.add_argument(
        "--eval-every", type=int, default=None, help="held-out evaluation every N steps (default: at the end)"
    )
    p.add_argument("--no-fp8", action="store_true", help="skip the two FP8 rows of the default table")
    p.add_argument(
        "--level",
        default="token",
        choices=("token", "sequence", "geometric"),
        help="ratio the TIS/MIS rows of the default table correct with",
    )
    p.add_argument(
        "--grid", action="store_true", help="rows: every lag x correction x level (see --lags ...)"
    )
    p.add_argument("--lags", type=int, nargs="+", default=[0, 4, 8], help="grid: lags (default 0 4 8)")
    p.add_argument("--corrections", nargs="+", default=["none", "tis", "mis"], help="grid: corrections")
    p.add_argument("--levels", nargs="+", default=["token", "sequence", "geometric"], help="grid: levels")
    p.add_argument("--sampler", default="lagged", help="grid: the sampler of every row (default lagged)")
    p.add_argument(
        "--async-bounds",
        type=int,
        nargs="+",
        default=[],
        help="add real async rows (one rollout worker) at these staleness bounds, without and with TIS",
    )
    p.add_argument(
        "--async-only", action="store_true", help="with --async-bounds: only lag 0 and the async rows"
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (1 thread each)")
    p.add_argument(
        "--out", default="results/staleness", help="directory for table.md, causes.md, results.json, plot"
    )
    p.add_argument(
        "--from-results",
        metavar="JSON",
        help="run nothing: write the tables of the rows, seeds and lrs given from this results.json",
    )
    p.add_argument("flags", nargs="*", help="train.py flags for every run, after --")
    args = p.parse_args(argv)
    if args.lr is None:
        from lrl.config import Config

        args.lr = [Config().lr]
    eval_every = args.steps if args.eval_every is None else args.eval_every
    if args.seeds < 1 or args.steps < 4 or args.jobs < 1 or any(lr <= 0 for lr in args.lr):
        p.error("--seeds and --jobs must be >= 1, --steps >= 4, every --lr > 0")
    if eval_every < 1:
        p.error("--eval-every must be >= 1")
    if args.grid:
        rows = grid_rows(args.sampler, args.lags, args.corrections, args.levels)
    else:
        rows = [(s, lag, c, args.level if c != "none" else "token") for s, lag, c, _ in STALE_ROWS]
        rows += [] if args.no_fp8 else FP8_ROWS
    if args.async_only:
        rows = [r for r in rows if r[:3] == ("lagged", 0, "none")]
    rows += [("async", b, c, "token") for b in args.async_bounds for c in ("none", "tis")]
    out = Path(args.out)
    for problem in outputs(("--out", args.out, "dir")):
        p.error(problem)
    if args.from_results:
        try:
            results = read_results(
                args.from_results, list, "the results.json of an earlier run of this command"
            )
            check_results(args.from_results, results)
        except ERRORS as err:
            p.error(str(err))
        write_tables(results, rows, args, out, "")
        return 0
    from lrl.arguments import parse_args
    from lrl.config import ConfigError
    from lrl.envs import make_env

    try:
        spec = make_env(parse_args(args.flags))
    except ConfigError as err:
        p.error(str(err))
    if spec.warm_start is not None:
        spec.warm_start()  # build the cache once, before the workers
    cells = [
        (row, lr, seed, args.steps, args.flags, eval_every)
        for lr in args.lr
        for row in rows
        for seed in range(args.seeds)
    ]
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    results = []
    # spawned, not forked: a fork after torch has started its thread pool can hang in the child's first product
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, r in enumerate(pool.map(one_run, cells), 1):
            results.append(r)
            (out / "results.json").write_text(json.dumps(results, indent=1))  # progress survives a crash
            print(
                f"[{i}/{len(cells)}] {r['sampler']} lag {r['lag']} {r['correction']} {r['level']} lr {r['lr']:g} "
                f"seed {r['seed']}: held-out {r['heldout']:.3f} mismatch {r['mismatch']:.3f} "
                f"({time.time() - start:.0f} s)",
                flush=True,
            )
    wall = f"\nWall time: {time.time() - start:.0f} s for {len(cells)} runs ({args.jobs} in parallel).\n"
    write_tables(results, rows, args, out, wall)
    return 0


def check_results(path: str, results: list) -> None:
    """Every row of an earlier results.json holds what the tables read (InputError naming the file)."""
    keys = ("sampler", "lag", "correction", "level", "lr", "seed", "evals", *METRICS)
    for i, r in enumerate(results):
        missing = [k for k in keys if not isinstance(r, dict) or k not in r]
        if missing:
            raise InputError(
                f"{path}: result {i} has no {', '.join(missing[:3])} (a results.json of this command)"
            )
        bad = [m for m in METRICS if isinstance(r[m], bool) or not isinstance(r[m], (int, float))]
        if bad:  # NaN is a number here: a target not reached
            raise InputError(f"{path}: result {i} has {bad[0]} {json.dumps(r[bad[0]])[:30]}, not a number")


def write_tables(results: list[dict], rows: list[tuple], args, out: Path, wall: str) -> None:
    """table.md (the rows), causes.md (lrl_lab.experiments.staleness_causes_report) and the plot, printed too."""
    from lrl_lab.experiments.staleness_causes_report import causes

    out.mkdir(parents=True, exist_ok=True)
    table = markdown(results, rows, args.lr, args.seeds, args.steps, args.flags) + wall
    (out / "table.md").write_text(table)
    analysis = causes(results, rows, args.lr)
    (out / "causes.md").write_text(analysis)
    plot(results, rows, args.lr, out / "staleness.png")
    print(table)
    print(analysis)
    print(f"wrote {out / 'table.md'}, {out / 'causes.md'}, {out / 'results.json'}, {out / 'staleness.png'}")


if __name__ == "__main__":
    raise SystemExit(main())
