"""Rows of a training experiment on paired seeds, with 95% intervals and paired differences that can decide a claim.

    python -m lrl_lab.experiments.decide --rows core --seeds 8 --jobs 2         # the chapter's rows on the calc recipe
    python -m lrl_lab.experiments.decide --rows "on-policy=" "lag 4=--sampler lagged --lag 4" --seeds 5
    python -m lrl_lab.experiments.decide --rows core --seeds 3 --effect 0.1     # a pilot: the spread sizes the seeds
    python -m lrl_lab.experiments.decide --from-results results/decide/results.jsonl   # the tables again, no run

A row is a label and the train.py flags that make it (``LABEL=FLAGS``, or a preset: ``core``, ``wider``, ``fast``);
the flags after ``--`` go to every run (default ``--env calc``). Every run is seeded ``--seed S --paired-streams
true``: every row of one seed trains on the same problems in the same order and draws the same uniforms, so the
difference between two rows on one seed holds less noise than the difference between two seeds (the sampler's
own draws differ where its distribution does). Each run reports its held-out pass rate greedy at its first and last
evaluation, its held-out pass rate sampled (``--samples`` episodes a problem at the run's training temperature,
after training: a finer measure than one greedy answer a problem, which saturates on an easy task and drowns in
noise on 64), its mean training reward over the run, the mismatch, the share over the TIS cap, the steps skipped,
the batches redrawn (``--redraw-flat``) and its wall time (model loading included; the evaluation after it not),
and step by step its reward, skipped flag, action tokens, mismatch, loss, gradient norm, the clip by the sign of the
advantage, what each mask dropped and phase times (decide_tables.step_figures); which
held-out problems each evaluation passed, so that a pass rate can be read by kind of problem (calc's plain questions
and stories), in a table of its own; and where it ran: the machine, the arithmetic, torch and lrl's commit. One
seed computes other numbers on another processor (bf16 where it is native, fp32 elsewhere), so a results file keeps
one machine's runs: the command refuses to add runs of another, and the tables name where their runs come from.

Runs go ``--jobs`` at a time, each with ``--threads`` torch threads; each finished run is appended to
``results.jsonl`` in ``--out``, and the command started again skips the runs the file holds, so a crash costs one
run. Before any run, every row is checked as its runs would be (flags, model, environment, memory plan) and so is
``--jobs`` of the costliest side by side against the machine's memory (a lagged sampler keeps lag + 1 copies of the
weights: about 12 GiB a run for SmolLM2 at lag 8); a problem is named and nothing runs. A run that fails later (a
step that diverges) is named in one line and the others go on, and so is a run the kernel kills, with advice to
lower ``--jobs``. Each run has a process of its own, which ends with it. The tables (``table.md``, headed by the
``--from-results`` command that prints them again with the same options): each row's mean with its 95% interval
(Student's t over seeds); each row's paired difference from the baseline row (``--baseline``, default the first)
over the seeds both have, with its interval and the seeds a difference of ``--effect`` would need to be seen (80%
power, at the spread measured); and each claim of the chapter whose rows were run: "holds", "does not hold", or "not
decided at this power". Where runs part into those that learn and those that do not (a real model's often do), the
mean hides it: each row also counts its runs that gained ``--learned`` held-out greedy (Wilson's 95% interval), and
each paired difference the seeds where only one of the two rows learned (McNemar's exact p). ``--stretches ROW``
adds that row's runs between each two held-out evaluations: the change of the pass rate beside the mean mismatch and
gradient norm of the same steps (from the step records), which shows whether a run's decline came with its mismatch.
The figure (``plot.png`` beside ``table.md``; ``--plot PATH`` with ``--from-results``) shows the same: each row's runs
with their mean and interval, and each paired difference with its interval, in colour where it lies wholly on one
side of 0.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from itertools import accumulate
from pathlib import Path

from lrl.cli import OneLineParser
from lrl.pipeline.backends.spawn import die_with_parent
from lrl_lab.experiments.decide_plot import FORMATS, figure_line
from lrl_lab.experiments.decide_tables import METRICS, by_row, markdown, provenance_lines, stretches_table

PRESETS = {
    "core": {
        "on-policy": "",
        "lag 8": "--sampler lagged --lag 8",
        "lag 8, TIS": "--sampler lagged --lag 8 --correction tis",
        "FP8": "--sampler fp8",
        "FP8, TIS": "--sampler fp8 --correction tis",
        "FP8, MIS": "--sampler fp8 --correction mis",
    },
    "wider": {
        "lag 4": "--sampler lagged --lag 4",
        "lag 4, TIS": "--sampler lagged --lag 4 --correction tis",
        "lag 8, MIS": "--sampler lagged --lag 8 --correction mis",
    },
    "fast": {"on-policy": "", "lag 8": "--sampler lagged --lag 8"},  # a pilot's two rows
}


# -- one run ------------------------------------------------------------------------------------------------------
def one_run(cell: tuple) -> dict:
    """Train one (row, seed) with the shared flags -> its figures (the module docstring lists them)."""
    label, row_flags, seed, flags, samples, threads = cell
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from lrl.arguments import parse_args
    from lrl.evaluation import evaluate
    from lrl.precision import autocast
    from lrl.run import build_run, fit
    from lrl.streams import EVALUATION, stream_seed
    from lrl_lab.experiments.decide_tables import measured_mean, step_figures

    start = time.time()
    cfg = parse_args(run_argv(flags, row_flags, seed, threads))
    run = build_run(cfg, logger=False, callbacks=None)
    result = fit(run)
    wall = time.time() - start
    sampled, sampled_tasks = float("nan"), {}
    if samples:
        with autocast(run.module.precision):
            held = evaluate(
                run.policy, run.spec, None, samples, stream_seed(seed, EVALUATION) + 1, cfg.temperature, per_task=True
            )
        sampled, sampled_tasks = held["pass_rate"], {t: s["pass_rate"] for t, s in held["tasks"].items()}
    kinds: dict[str, list[int]] = {}  # the held-out problems by kind (the environment's, where its tasks name one)
    for task in run.spec.heldout_tasks:
        kinds.setdefault(str(getattr(task, "kind", "all")), []).append(task.task_id)
    hist = run.module.history
    measured = lambda key: measured_mean([h.get(key) for h in hist], float("nan"))  # noqa: E731
    evals = run.module.evals
    return {
        "row": label,
        "flags": row_flags,
        "seed": seed,
        "greedy_first": evals[0]["pass_rate"] if evals else float("nan"),
        "greedy": result.pass_rate,
        "sampled": sampled,
        "reward": measured("train/reward"),
        "mismatch": measured("mismatch/abs_mean"),
        "over_cap": measured("mismatch/over_cap"),
        "skipped": sum(h.get("train/skipped", 0.0) for h in hist),
        "redrawn": sum(h.get("train/redrawn", 0.0) for h in hist),
        "steps": len(hist),
        "wall": wall,
        # the memory plan's microbatch: runs of one seed planned otherwise compute other numbers (lrl/budget.py)
        "micro_tokens": run.module.memory.train_tokens if run.module.memory is not None else None,
        "evals": [{"step": e["step"], "pass_rate": e["pass_rate"], "solved": solved(e)} for e in evals],
        "kinds": kinds,
        "sampled_tasks": sampled_tasks,
        "history": [step_figures(h) for h in hist],
        **provenance(run.module.precision, str(run.module.device)),
    }


def machine_name(device: str = "cpu") -> str:
    """The machine a run computes on, in words: the GPU's name, or the cores, the CPU's name and its native bf16."""
    import platform

    import torch

    from lrl.precision import cpu_bf16_features, cpu_model

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    name = cpu_model() or platform.processor() or platform.machine()
    return f"{os.cpu_count()}-core {name} ({', '.join(cpu_bf16_features()) or 'no native bf16'})"


def provenance(precision: str, device: str) -> dict:
    """Where a run's numbers come from: the machine (one seed computes other numbers on another processor, and
    ``precision: auto`` picks bf16 only where it is native), the arithmetic, torch, and lrl's commit (with ``+``
    where the code of lrl, the lab or train.py differs from it; ``unknown`` outside a checkout)."""
    import subprocess

    import torch

    import lrl

    root = Path(lrl.__file__).resolve().parents[1]
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True)  # noqa: E731
    head = git("rev-parse", "--short", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else "unknown"
    if head.returncode == 0 and git("diff", "--quiet", "HEAD", "--", "lrl", "lab", "train.py").returncode:
        commit += "+"
    return {"machine": machine_name(device), "precision": precision, "torch": torch.__version__, "commit": commit}


def solved(evaluation: dict) -> list[int]:
    """The held-out problems an evaluation passed (a pass rate of a half or more over its episodes)."""
    return sorted(t for t, stats in evaluation.get("tasks", {}).items() if stats["pass_rate"] >= 0.5)


# -- the command ----------------------------------------------------------------------------------------------------
def parse_rows(specs: list[str]) -> dict[str, str]:
    rows: dict[str, str] = {}
    for spec in specs:
        if spec in PRESETS:
            rows.update(PRESETS[spec])
        elif "=" in spec:
            label, flags = spec.split("=", 1)
            rows[label.strip()] = flags.strip()
        else:
            raise ValueError(f"--rows: {spec!r} is neither LABEL=FLAGS nor a preset ({', '.join(PRESETS)})")
    return rows


def run_argv(flags: list[str], row_flags: str, seed: int, threads: int) -> list[str]:
    """The train.py flags of one run: the shared ones, the row's, then the seed, paired streams and threads."""
    argv = [*flags, *row_flags.split(), "--seed", str(seed), "--paired-streams", "true", "--threads", str(threads)]
    return argv + ["--progress", "false"]


def check_rows(
    rows: dict[str, str], flags: list[str], seed: int, jobs: int, threads: int, runs: dict[str, int] | None = None
) -> list[str]:
    """What would stop the rows before any run starts -> one line per problem (empty: none): a row whose flags
    train.py refuses, whose model or environment cannot be built, or whose step does not fit the memory alone;
    and the `jobs` costliest of the runs to do (`runs`: a row's count; default `jobs` each) side by side past the
    memory this machine has (each run's memory plan, lrl/budget.py, counts its weights, optimizer, the sampler's
    copies and a step's peak)."""
    from lrl.arguments import parse_args
    from lrl.budget import SHARE, available_bytes
    from lrl.run import plan_run

    problems, peaks = [], {}
    for label, row_flags in rows.items():
        try:
            plan = plan_run(parse_args(run_argv(flags, row_flags, seed, threads)))[2]
        except ValueError as err:  # a ConfigError, or a value a registry entry refuses
            problems.append(f"row {label!r} ({row_flags or 'no flags'}): {err}")
            continue
        peaks[label] = plan.step_peak or plan.static
    counts = runs or {}
    each = sorted(((b, label) for label, b in peaks.items() for _ in range(counts.get(label, jobs))), reverse=True)
    costliest = each[:jobs]  # the runs that may be in flight together at worst
    have = SHARE * available_bytes()
    together = sum(b for b, _ in costliest)
    if jobs > 1 and together > have:
        fits = max(1, sum(1 for total in accumulate(b for b, _ in costliest) if total <= have))
        names = ", ".join(f"{label!r} {b / 2**30:.1f} GiB" for b, label in costliest)
        problems.append(
            f"--jobs {jobs}: the costliest runs side by side ({names}, at a step's peak) need about "
            f"{together / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB this machine has ({SHARE} of "
            f"the memory available): the kernel would kill runs; --jobs {fits} fits"
        )
    return problems


def run_device(flags: list[str], threads: int) -> str:
    """The torch device type the runs of these flags compute on."""
    from lrl.arguments import parse_args
    from lrl.precision import accelerator_device

    return accelerator_device(parse_args(run_argv(flags, "", 0, threads)).run.accelerator)


def each_in_its_own_process(cells: list, jobs: int, fn=one_run, started=None):
    """Run `fn` (one_run) on every cell, `jobs` at a time, each in a fresh process (spawned; it dies with this one, so
    a killed command leaves no run burning the cores) -> (cell, its finished future), in the order they finish;
    `started(cell)` is called as each run is handed its process.
    A process serves one run only: a run's memory is gone before the next one plans its own (a reused process
    still held the last run's, and a lag-8 run after another was refused as too large), and no state of one run
    reaches the next."""
    context = multiprocessing.get_context("spawn")
    pending, running = list(cells), {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                cell = pending.pop(0)
                pool = ProcessPoolExecutor(1, mp_context=context, initializer=die_with_parent)
                running[pool.submit(fn, cell)] = (cell, pool)
                if started is not None:
                    started(cell)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                cell, pool = running.pop(future)
                pool.shutdown(wait=True)
                yield cell, future
    finally:  # stopped early (an interrupt): the runs in flight end with it
        for pool in (pool for _, pool in running.values()):
            pool.shutdown(wait=False, cancel_futures=True)


def say_started(cell: tuple) -> None:
    """A run takes minutes to an hour: say which one is under way, and since when."""
    label, _, seed, *_ = cell
    print(f"started {label} seed {seed} at {time.strftime('%H:%M')}", flush=True)


def time_left(elapsed: float, done: int, total: int) -> str:
    """", about N min left" at the pace of the `done` runs so far ("" once none is left)."""
    return f", about {elapsed / done * (total - done) / 60:.0f} min left" if done < total else ""


def read_done(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tables(results: list[dict], rows: dict, baseline: str, args) -> str:
    """The markdown of the rows, and the stretches of each row asked for."""
    table = markdown(results, list(rows), baseline, args.effect, args.metric, args.learned)
    by_label = by_row(results)
    extra = [line for label in args.stretches for line in stretches_table(by_label, label)]
    return "\n".join(provenance_lines(results) + [table]) + ("\n".join(extra) + "\n" if extra else "")


def tabling_command(results: Path, args) -> str:
    """The command that prints these tables again from the results file, with the table options of this command:
    its rows (their order and the default baseline), baseline, metric, effect, learned line and stretches."""
    argv = ["python", "-m", "lrl_lab.experiments.decide", "--from-results", str(results)]
    argv += ["--rows", *(args.rows_given or ["core"])]
    if args.baseline:
        argv += ["--baseline", args.baseline]
    argv += ["--metric", args.metric, "--effect", f"{args.effect:g}", "--learned", f"{args.learned:g}"]
    for label in args.stretches:
        argv += ["--stretches", label]
    return shlex.join(argv)


def parser() -> OneLineParser:
    """The command's options (the module docstring says what it does with them)."""
    p = OneLineParser(
        prog="python -m lrl_lab.experiments.decide",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--rows",
        nargs="+",
        dest="rows_given",
        help="LABEL=FLAGS or a preset (core, wider, fast); default core, or with --from-results the file's rows; "
        "the tables and figure show the rows named only",
    )
    p.add_argument("--seeds", type=int, default=8, help="seeds 0 .. N-1 of every row (default 8)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=4, help="sampled held-out episodes a problem (0: none)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--threads", type=int, default=0, help="torch threads a run (default: cores / jobs)")
    p.add_argument("--baseline", default=None, help="the row the others are compared with (default: the first)")
    p.add_argument("--effect", type=float, default=0.1, help="the difference the seeds-needed column sizes for")
    p.add_argument("--metric", default="sampled", choices=sorted(METRICS), help="the claims' metric")
    p.add_argument(
        "--learned", type=float, default=0.25, help="the held-out greedy gain that counts a run as learned (0.25)"
    )
    p.add_argument("--out", default="results/decide", help="folder of results.jsonl and table.md")
    p.add_argument("--from-results", metavar="JSONL", help="run nothing: the tables of this results.jsonl")
    p.add_argument(
        "--stretches",
        metavar="ROW",
        action="append",
        default=[],
        help="also this row's runs between two evaluations: held-out change, mismatch, gradient norm (repeatable)",
    )
    p.add_argument("--plot", metavar="PATH", help="also draw the rows, differences and intervals to PATH (.png, .svg, "
                   ".pdf; runs always draw plot.png beside table.md)")  # fmt: skip
    p.add_argument("flags", nargs="*", help="train.py flags of every run, after -- (default: --env calc)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        rows = parse_rows(args.rows_given or ["core"])
    except ValueError as err:
        p.error(str(err))
    if args.seeds < 1 or args.jobs < 1 or args.samples < 0 or args.threads < 0:
        p.error("--seeds and --jobs must be >= 1, --samples and --threads >= 0")
    results = read_done(Path(args.from_results)) if args.from_results else []
    if args.from_results:  # the file's own rows, in the order they were run, or only those --rows names
        rows = ({r["row"]: r.get("flags", "") for r in results} or rows) if args.rows_given is None else rows
        results = [r for r in results if r["row"] in rows]
    baseline = args.baseline or next(iter(rows))
    if baseline not in rows:
        p.error(f"--baseline: {baseline!r} is not one of the rows ({', '.join(rows)})")
    out = Path(args.out)
    if unknown := [r for r in args.stretches if r not in rows]:
        p.error(f"--stretches: {', '.join(map(repr, unknown))} not among the rows ({', '.join(rows)})")
    if args.plot and Path(args.plot).suffix.lower() not in FORMATS:
        p.error(f"--plot: {args.plot!r} must end in {', '.join(FORMATS)}")
    if args.from_results:
        print(tables(results, rows, baseline, args))
        if args.plot and results:
            figure = Path(args.plot)
            print(figure_line(results, list(rows), baseline, args.metric, args.effect, figure, args.from_results))
        return 0
    flags = args.flags or ["--env", "calc"]
    threads = args.threads or max((os.cpu_count() or 1) // args.jobs, 1)
    done_path = out / "results.jsonl"
    done = read_done(done_path)
    have = {(r["row"], r["seed"]) for r in done}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    # seed by seed: a stopped command leaves whole seeds, the pairs a difference needs
    cells = [(label, rows[label], seed, flags, args.samples, threads) for seed in seeds for label in rows
             if (label, seed) not in have]  # fmt: skip
    to_do = Counter(label for label, *_ in cells)
    problems = check_rows({label: rows[label] for label in to_do}, flags, args.first_seed, args.jobs, threads, to_do)
    for line in problems:  # before any run: a typo in one row would otherwise surface hours into the others
        print(f"decide: {line}", file=sys.stderr)
    if problems:
        print(f"decide: nothing was run ({len(problems)} problem(s) above)", file=sys.stderr)
        return 2
    here = machine_name(run_device(flags, threads))  # runs with no machine recorded pass
    if cells and (others := sorted({r["machine"] for r in done if r.get("machine", here) != here})):
        print(f"decide: {done_path} holds runs of {'; '.join(others)}, and these would run on {here}: one seed "
              "computes other numbers on each, so their rows would not pair; give this machine's runs an --out of "
              "their own", file=sys.stderr)  # fmt: skip
        return 2
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(cells)} runs to do ({len(have)} already in {done_path}), {args.jobs} at a time, {threads} threads each")
    start, failed = time.time(), 0
    for i, (cell, future) in enumerate(each_in_its_own_process(cells, args.jobs, started=say_started), 1):
        label, _, seed, *_ = cell
        try:
            r = future.result()
        except BrokenProcessPool:  # the kernel killed the run's process (for memory, most often)
            failed += 1
            print(f"[{i}/{len(cells)}] {label} seed {seed} failed: its process died (killed for memory, most "
                  "likely: try fewer --jobs); the command started again runs it again", file=sys.stderr,
                  flush=True)  # fmt: skip
            continue
        except Exception as err:  # a run refused or failed: said in one line, and the others go on
            failed += 1
            print(f"[{i}/{len(cells)}] {label} seed {seed} failed: {err}", file=sys.stderr, flush=True)
            continue
        with done_path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        done.append(r)
        elapsed = time.time() - start
        print(f"[{i}/{len(cells)}] {r['row']} seed {r['seed']}: greedy {r['greedy_first']:.3f} -> "
              f"{r['greedy']:.3f}, sampled {r['sampled']:.3f}, reward {r['reward']:.3f}, "
              f"{r['wall'] / 60:.1f} min ({elapsed / 60:.0f} min in all{time_left(elapsed, i, len(cells))})",
              flush=True)  # fmt: skip
    done = [r for r in done if r["row"] in rows]  # the rows asked for, as the command that tables again names them
    table = tables(done, rows, baseline, args)
    again = tabling_command(done_path, args)
    (out / "table.md").write_text(f"train.py flags of every run: {' '.join(flags)}\nTabled again by: {again}\n\n"
                                  + table)  # fmt: skip
    print(table)
    if done:
        for path in dict.fromkeys([out / "plot.png", *([Path(args.plot)] if args.plot else [])]):
            print(figure_line(done, list(rows), baseline, args.metric, args.effect, path, str(out)))
    if failed:
        print(f"decide: {failed} of {len(cells)} runs failed (above); the table holds the others", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
