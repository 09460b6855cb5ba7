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
``results.jsonl`` in ``--out`` as one whole line (records.py), with everything that made it: the flags of every run
and the row's, the configuration they resolve to, the machine and the training code's fingerprint. The command
started again skips the runs the file holds of the same setting, and refuses, naming it, a run of a row's label and
seed made otherwise (another label, or another ``--out``, keeps both); a line that does not read is named and
skipped, so a crash costs one run. Ctrl-C, SIGTERM or SIGHUP end the runs in flight at once, in one line; every
finished run is kept. The tables pool, for each row, the runs of one setting, and name the runs they leave out (of
other flags, another machine, or a seed run again). Before any run, the command's numbers, ``--out`` and ``--plot``
(made and written to), every seed, and every row are checked as its runs would be (flags, model, environment, memory plan) and so is
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

``--budget HOURS`` spends seeds where a verdict is still open: rounds of ``--round-seeds`` paired seeds (at most
``--seeds`` a row), each run only for the rows of the comparisons not yet decided, a look after each, until every
comparison is decided or the next round would pass the budget. Its verdicts hold their family-wise error at 5%
however early it stops (a group-sequential design, Holm at 0.05 / K at each of K planned looks:
``lrl_lab.experiments.sequential`` says why that design); each record keeps its round, and the tables end with how
many seeds each verdict took, replayed from the records by ``--from-results``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from lrl.cli import OneLineParser
from lrl_lab.experiments import records, sequential
from lrl_lab.experiments.decide_checks import (  # noqa: F401 - check_rows, parse_rows and run_argv: decide's too
    MAX_INT,
    PRESETS,
    check_numbers,
    check_plot,
    check_rows,
    machine_name,
    parse_rows,
    planned,
    run_argv,
    table_options,
    writable_folder,
)
from lrl_lab.experiments.decide_plot import figure_line
from lrl_lab.experiments.decide_tables import METRICS, by_row, markdown, provenance_lines, stretches_table
from lrl_lab.experiments.runner import Stopped, each_in_its_own_process, stop_on_signals


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
    from lrl_lab.experiments.records import code_fingerprint, settings

    start = time.time()
    argv = run_argv(flags, row_flags, seed, threads)
    cfg = parse_args(argv)
    asked = settings(cfg)  # as the flags give it: building the run resolves a named model to this machine's cache
    run = build_run(cfg, logger=False, callbacks=None)
    # what made the run, read before it trains (the checkout may move on while it does; records.py pools by it)
    made = {"shared_flags": shlex.join(flags), "argv": argv, "settings": asked, "code": code_fingerprint(),
            **provenance(run.module.precision, str(run.module.device))}  # fmt: skip
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
        **made,
    }


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
def say_started(cell: tuple) -> None:
    """A run takes minutes to an hour: say which one is under way, and since when."""
    label, _, seed, *_ = cell
    print(f"started {label} seed {seed} at {time.strftime('%H:%M')}", flush=True)


def time_left(elapsed: float, done: int, total: int) -> str:
    """", about N min left" at the pace of the `done` runs so far ("" once none is left)."""
    return f", about {elapsed / done * (total - done) / 60:.0f} min left" if done < total else ""


def tables(results: list[dict], rows: dict, baseline: str, args, left: list[str] = ()) -> str:
    """The markdown of the rows (where the runs come from and the runs left out first), and the stretches of each
    row asked for."""
    table = markdown(results, list(rows), baseline, args.effect, args.metric, args.learned)
    comparisons, looks, rounds = sequential.replay(results, list(rows), baseline, args.metric)
    if comparisons:  # a budgeted command's runs: its verdicts as its looks reached them, from the records
        table += "\n" + "\n".join(sequential.summary(comparisons, looks, rounds)) + "\n"
    by_label = by_row(results)
    extra = [line for label in args.stretches for line in stretches_table(by_label, label)]
    head = provenance_lines(results) + (["Left out (not of the setting the row pools):", *left, ""] if left else [])
    return "\n".join(head + [table]) + ("\n".join(extra) + "\n" if extra else "")


def flags_line(runs: list[dict]) -> str:
    """The train.py flags of every run, as their records keep them (where they differ or were not recorded: each
    with its count)."""
    shared = Counter(r.get("shared_flags") for r in runs)
    if len(shared) == 1 and None not in shared:
        return f"train.py flags of every run: {next(iter(shared))}"
    said = [f"{v if v is not None else 'not recorded'} ({n} run(s))" for v, n in shared.items()]
    return "train.py flags of the runs: " + "; ".join(said)


def from_results(p: OneLineParser, args, rows: dict[str, str]) -> int:
    """The tables (and figure) of a results file: its own rows, in the order they were run, or those --rows names
    (``LABEL=`` any of the label's runs, ``LABEL=FLAGS`` only those made with those row flags)."""
    path = Path(args.from_results)
    if not path.is_file():
        p.error(f"--from-results: {path} " + ("is not a file" if path.exists() else "does not exist"))
    try:
        results, damaged = records.read(path)
    except OSError as err:
        p.error(f"--from-results: {path}: cannot read it ({err.strerror or err})")
    for line in damaged:
        print(f"decide: {line}", file=sys.stderr)
    if not results:
        p.error(f"--from-results: {path} holds no run")
    if args.rows_given is None:
        wanted: dict = dict.fromkeys(dict.fromkeys(r["row"] for r in results))
    else:
        wanted = {label: flags or None for label, flags in rows.items()}
    baseline = args.baseline or next(iter(wanted))
    if problem := table_options(args, wanted, baseline) or next(iter(check_plot(args.plot)), None):
        p.error(problem)
    pooled, left = records.pool(results, wanted)
    print(tables(pooled, wanted, baseline, args, left))
    if args.plot and pooled:
        print(figure_line(pooled, list(wanted), baseline, args.metric, args.effect, Path(args.plot), str(path)))
    return 0


def write_tables(args, rows, baseline, done, done_path: Path, wanted, out: Path) -> list[dict]:
    """The tables of the rows asked for, as the command that tables them again names them: written to table.md under
    that command, and printed -> the runs they pool."""
    pooled, left = records.pool([r for r in done if r["row"] in rows], rows, wanted)
    table = tables(pooled, rows, baseline, args, left)
    again = tabling_command(done_path, args)
    (out / "table.md").write_text(f"{flags_line(pooled)}\nTabled again by: {again}\n\n" + table)
    print(table)
    return pooled


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
    p.add_argument(
        "--budget", type=float, metavar="HOURS",
        help="run paired seeds in rounds, each given to the comparisons still open, until every one is decided or "
        "HOURS are spent (--seeds: the most seeds a row gets; lrl_lab.experiments.sequential says how it decides)",
    )  # fmt: skip
    p.add_argument("--round-seeds", type=int, default=2, help="with --budget: paired seeds a round (default 2)")
    p.add_argument("flags", nargs="*", help="train.py flags of every run, after -- (default: --env calc)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        rows = parse_rows(args.rows_given or ["core"])
    except ValueError as err:
        p.error(str(err))
    if problem := check_numbers(args):
        p.error(problem)
    if args.from_results:
        return from_results(p, args, rows)
    baseline = args.baseline or next(iter(rows))
    if problem := table_options(args, rows, baseline):
        p.error(problem)
    flags = args.flags or ["--env", "calc"]
    threads = args.threads or max((os.cpu_count() or 1) // args.jobs, 1)
    out = Path(args.out)
    done_path = out / "results.jsonl"
    wanted, problems = planned(rows, flags, args.first_seed, threads)  # first: a refused command makes no folder
    if not problems:
        problems = [problem for problem in [writable_folder(out, "--out")] if problem] + check_plot(args.plot)
    if not problems and done_path.exists() and not done_path.is_file():
        problems.append(f"--out {out}: its results.jsonl is not a file")
    for line in problems:  # before any run: a typo in one row would otherwise surface hours into the others
        print(f"decide: {line}", file=sys.stderr)
    if problems:
        print(f"decide: nothing was run ({len(problems)} problem(s) above)", file=sys.stderr)
        return 2
    done, damaged = records.read(done_path) if done_path.exists() else ([], [])
    for line in damaged:  # named, skipped, and its run (if it was one) run again
        print(f"decide: {line}", file=sys.stderr)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    here = next(iter(wanted.values()))["machine"]  # runs with no machine recorded pass
    if (others := sorted({r["machine"] for r in done if r.get("machine", here) != here})):
        print(f"decide: {done_path} holds runs of {'; '.join(others)}, and these would run on {here}: one seed "
              "computes other numbers on each, so their rows would not pair; give this machine's runs an --out of "
              "their own", file=sys.stderr)  # fmt: skip
        return 2
    ours = [r for r in done if r["row"] in rows and r["seed"] in seeds]
    have = {(r["row"], r["seed"]) for r in ours if records.same_setting(r, wanted[r["row"]])}
    if clash := [r for r in ours if (r["row"], r["seed"]) not in have]:
        for r in clash:
            print(f"decide: {done_path} holds row {r['row']!r} seed {r['seed']} made otherwise: "
                  f"{records.difference(r, wanted[r['row']])}", file=sys.stderr)  # fmt: skip
        print("decide: nothing was run: give the rows made now labels of their own, or their runs another --out",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.budget is not None:
        from lrl_lab.experiments.decide_budget import run_budget

        parts = (run_cells, write_tables)
        return run_budget(args, rows, baseline, flags, threads, seeds, have, done, done_path, wanted, out, parts)
    # seed by seed: a stopped command leaves whole seeds, the pairs a difference needs
    cells = [(label, rows[label], seed, flags, args.samples, threads) for seed in seeds for label in rows
             if (label, seed) not in have]  # fmt: skip
    to_do = Counter(label for label, *_ in cells)
    problems = check_rows({label: rows[label] for label in to_do}, flags, args.first_seed, args.jobs, threads, to_do)
    for line in problems:
        print(f"decide: {line}", file=sys.stderr)
    if problems:
        print(f"decide: nothing was run ({len(problems)} problem(s) above)", file=sys.stderr)
        return 2
    print(f"{len(cells)} runs to do ({len(have)} already in {done_path}), {args.jobs} at a time, {threads} threads each")
    failed = run_cells(cells, args.jobs, done_path, done)
    if isinstance(failed, Stopped):
        return failed.exit_code
    pooled = write_tables(args, rows, baseline, done, done_path, wanted, out)
    if pooled:
        for path in dict.fromkeys([out / "plot.png", *([Path(args.plot)] if args.plot else [])]):
            print(figure_line(pooled, list(rows), baseline, args.metric, args.effect, path, str(out)))
    if failed:
        print(f"decide: {failed} of {len(cells)} runs failed (above); the table holds the others", file=sys.stderr)
    return 1 if failed else 0


def run_cells(cells: list, jobs: int, done_path: Path, done: list[dict], extra: dict | None = None) -> int | Stopped:
    """Run the cells, keeping each finished run in `done_path` (and `done`) as it comes back -> the count of runs
    that failed, or :class:`Stopped` where a signal stopped the command (said in one line; the runs in flight ended,
    every finished one kept)."""
    start, failed, begun = time.time(), 0, []
    runs = each_in_its_own_process(cells, jobs, fn=one_run, started=lambda cell: (begun.append(cell), say_started(cell)))
    i = 0
    try:
        with stop_on_signals():
            for i, (cell, future) in enumerate(runs, 1):
                label, _, seed, *_ = cell
                try:
                    r = future.result()
                except BrokenProcessPool:  # the kernel killed the run's process (for memory, most often)
                    failed += 1
                    print(f"[{i}/{len(cells)}] {label} seed {seed} failed: its process died (killed for memory, "
                          "most likely: try fewer --jobs); the command started again runs it again", file=sys.stderr,
                          flush=True)  # fmt: skip
                    continue
                except Exception as err:  # a run refused or failed: said in one line, and the others go on
                    failed += 1
                    print(f"[{i}/{len(cells)}] {label} seed {seed} failed: {err}", file=sys.stderr, flush=True)
                    continue
                r.update(extra or {})
                keep(done_path, r)
                done.append(r)
                elapsed = time.time() - start
                print(f"[{i}/{len(cells)}] {r['row']} seed {r['seed']}: greedy {r['greedy_first']:.3f} -> "
                      f"{r['greedy']:.3f}, sampled {r['sampled']:.3f}, reward {r['reward']:.3f}, "
                      f"{r['wall'] / 60:.1f} min ({elapsed / 60:.0f} min in all{time_left(elapsed, i, len(cells))})",
                      flush=True)  # fmt: skip
    except (Stopped, KeyboardInterrupt) as err:
        runs.close()  # the runs in flight end now
        stop = err if isinstance(err, Stopped) else Stopped(signal.SIGINT)
        ended = len(begun) - i
        print(f"decide: stopped by {stop}: {i - failed} run(s) of this command finished and are kept in "
              f"{done_path}; {ended} in flight ended; the same command again runs the rest", file=sys.stderr)  # fmt: skip
        return stop
    return failed


def keep(done_path: Path, record: dict) -> None:
    """Append a finished run to the results file; where that fails (a full disk), it goes to a file of its own in
    the temporary folder, named in one line, rather than being lost."""
    try:
        records.append(done_path, record)
    except OSError as err:
        spare = Path(tempfile.mkdtemp(prefix="decide-run-")) / "results.jsonl"
        spare.write_text(json.dumps(record) + "\n")
        print(f"decide: could not add {record['row']} seed {record['seed']} to {done_path} ({err.strerror or err}): "
              f"kept in {spare}; append it to the results file", file=sys.stderr, flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
