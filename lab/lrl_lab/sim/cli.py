"""The simulator's command line: ``python -m lrl_lab.sim`` (``python -m lrl.sim`` and ``python -m
lrl.simulate``, its former names, run it for one more release: lrl/former_names.py).

`python -m lrl_lab.sim` prints the reference tables (docs/simulate.md): episode durations and batch maxima, the
five pipeline designs, a timeout, the sync cost, and the length bias of worker failures. `--extra` adds
exponential durations against m H_B, the bound enforced at consumption, and the staleness sweep;
`--plot DIR` writes the timeline and staleness-throughput figures (and the extras' plots) as PNG and SVG;
`--single` simulates one configuration given by the options; `--trace FILE` plans a pipeline from a trace of
one's own episodes (lab/lrl_lab/sim/planner.py). See docs/simulate.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from lrl_lab.sim.checks import cli_problems
from lrl_lab.sim.durations import agent_episode_durations
from lrl_lab.sim.limits import MAX_EPISODES, MAX_POOL
from lrl_lab.sim.options import build_parser
from lrl_lab.sim.tables import (
    Setup,
    consume_lines,
    consume_rows,
    design_lines,
    duration_lines,
    exponential_lines,
    exponential_rows,
    failure_lines,
    sweep_lines,
    sweep_rows,
    sync_lines,
    timeout_lines,
)
from lrl_lab.sim.trace import TraceError, read_trace


def _setup(args: argparse.Namespace) -> Setup:
    """The tables' pipeline: the options given, Setup's reference values for the others."""
    given = dict(
        n_slots=args.slots, batch_size=args.batch_size, train_time=args.train_time, sync_time=args.sync_time
    )
    return Setup(**{k: v for k, v in given.items() if v is not None}, steps=args.steps)


def _durations(args: argparse.Namespace) -> torch.Tensor:
    """The pool of durations every run shares -> [n_durations] seconds."""
    return agent_episode_durations(
        args.n_durations,
        torch.Generator().manual_seed(args.seed),
        mean_turns=args.mean_turns,
        max_turns=args.max_turns,
        tokens_per_turn=tuple(args.tokens_per_turn),
        decode_rate=args.decode_rate,
        tool_median=args.tool_median,
        tool_sigma=args.tool_sigma,
    )


def single_lines(durations: torch.Tensor, setup: Setup, args: argparse.Namespace) -> list[str]:
    """One configuration's summary, staleness histogram included."""
    gen = torch.Generator().manual_seed(args.failure_seed)
    r = setup.run(
        durations,
        max_staleness=args.max_staleness,
        interrupt=not args.drain,
        consume_max_staleness=args.consume_max_staleness,
        timeout=args.timeout,
        failure_mtbf=args.failure_mtbf,
        failure_generator=gen,
        keep_events=False,
    )
    hist = ", ".join(f"{k}: {c}" for k, c in enumerate(r["staleness_hist"]) if c)
    return [
        f"simulated time            {r['time']:.1f} s",
        f"throughput                {r['throughput']:.1f} trained episodes/hour",
        f"slot utilization          {r['gen_util']:.3f}",
        f"staleness mean, max       {r['staleness_mean']:.3f}, {r['staleness_max']}",
        f"staleness histogram       {hist}",
        f"trained episode mean      {r['trained_duration']:.1f} s",
        f"episodes started/trained  {r['started']} / {r['trained']}",
        f"discarded (too stale)     {r['discarded']}",
        f"failed                    {r['failed']} (mean full length {r['failed_duration']:.1f} s)",
        f"truncated by the timeout  {r['truncated']}",
        f"events                    {r['n_events']}",
    ]


def table_sections(durations: torch.Tensor, setup: Setup, args: argparse.Namespace) -> list[list[str]]:
    """The reference tables, each a list of lines."""
    return [
        duration_lines(durations, args.batch_sizes),
        design_lines(durations, setup),
        timeout_lines(durations, setup, args.timeout_quantile),
        sync_lines(durations, setup, args.sync_times, args.sync_eta),
        failure_lines(durations, args.failure_mtbf or 2000.0, args.failure_seed),
    ]


def write_figures(durations: torch.Tensor, setup: Setup, args: argparse.Namespace, extras: dict) -> list:
    """The timeline and staleness-throughput figures (and the extras' plots when their rows exist) -> paths."""
    from lrl_lab.sim import figures

    n = args.timeline_slots
    steps = args.timeline_steps
    small = Setup(n, n, setup.train_time, setup.sync_time, steps)
    runs = [
        ("synchronous (eta = 0)", small.run(durations, max_staleness=0)),
        (
            f"asynchronous, eta = {args.timeline_eta}, partial rollouts",
            small.run(durations, max_staleness=args.timeline_eta),
        ),
    ]
    paths = figures.plot_timelines(runs, n, steps, args.plot)
    rows = extras.get("sweep") or sweep_rows(durations, setup, args.etas)
    title = (
        f"{setup.n_slots} slots, {setup.batch_size} episodes per step, {setup.train_time:g} s training, "
        f"{setup.sync_time:g} s sync, {setup.steps} steps"
    )
    paths += figures.plot_staleness_throughput(rows, title, args.plot)
    if "consume" in extras:
        paths += figures.plot_consume(extras["consume"], title, args.plot)
    if "exponential" in extras:
        exp_title = f"exponential durations, mean {args.exp_mean:g} s, {args.exp_steps} steps per point"
        fixed = setup.train_time + setup.sync_time
        paths += figures.plot_exponential(extras["exponential"], args.exp_mean, fixed, exp_title, args.plot)
    for name, r in runs:
        print(f"timeline, {name}: {steps} steps in {r['time']:.1f} s")
    return paths


def run_trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--trace: the planner's table (and --json). A trace that cannot be used is one line and status 2."""
    from lrl_lab.sim import planner, turns

    if turns.is_turn_trace(args.trace) and not (args.single or args.extra):
        return run_turn_trace(args, parser)
    if args.single or args.extra or args.plot:
        parser.error("--trace plans from a trace; it does not combine with --single, --extra or --plot")
    if args.policies:
        parser.error(
            "--policies plans from a turn trace (docs/simulate.md); a trace of wall times has no tokens"
        )
    options = {
        "slots": args.slots,
        "batch": args.batch_size,
        "train_s": args.train_time,
        "sync_s": args.sync_time,
    }
    flags = {"slots": "--slots", "batch": "--batch", "train_s": "--train-time", "sync_s": "--sync-time"}
    try:
        trace = read_trace(args.trace)
        plan = planner.resolve(trace, options, flags, args.steps)
        if plan.steps * plan.batch > MAX_EPISODES:
            parser.error(
                f"--steps x the batch ({plan.source['batch']}) is {plan.steps * plan.batch} episodes, more than "
                f"{MAX_EPISODES} per simulated run; lower --steps"
            )
        rows = planner.plan_rows(trace, plan)
    except TraceError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # the simulator's refusal, e.g. a run that takes no time
        print(f"{parser.prog}: error: {args.trace}: {err}", file=sys.stderr)
        return 2
    print("\n".join(planner.plan_lines(trace, plan, rows)))
    if args.json:
        planner.write_json(args.json, trace, plan, rows)
        print(f"wrote {args.json}")
    return 0


def run_turn_trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """--trace with turns: every design at every --plan-slots, on lrl's pipeline with the load model."""
    from lrl_lab.sim import turns
    from lrl_lab.sim.load import EngineCurve

    try:
        trace = turns.read_turn_trace(args.trace)
        engine = None
        if args.engine_step is not None:
            engine = EngineCurve.linear(*args.engine_step)
        slots = args.plan_slots or [args.slots or int(trace.settings.get("slots", 64))]
        given = {
            "train_s": args.train_time,
            "sync_s": args.sync_time,
            "batch": args.batch_size,
            "group": args.group,
            "tool_servers": args.tool_servers,
        }
        settings = {**trace.settings, **{k: v for k, v in given.items() if v is not None}}
        began = time.perf_counter()

        def progress(done: int, total: int, row: dict) -> None:  # on stderr, so the table stays clean
            if max(slots) >= turns.WINDOWED_FROM:  # a plan of minutes: say where it is
                print(f"planned {done} of {total}: {row['slots']:,} slots x {row['workers']}, {row['design']} "
                      f"({row['model']}), {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)  # fmt: skip

        rows = turns.plan_turns(
            trace, slots, args.bounds, args.steps, engine, args.workers, args.policies,
            patience=args.take_patience, model=args.model, progress=progress,
            patience_steps=args.take_patience_steps, **given,
        )  # fmt: skip
    except TraceError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"{parser.prog}: error: {args.trace}: {err}", file=sys.stderr)
        return 2
    print("\n".join(turns.turn_lines(trace, rows, settings)))
    if args.plot:
        print(f"wrote {turns.plot_plan(rows, args.trace, args.plot)}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump({"trace": args.trace, "settings": settings, "rows": rows}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


def check_sizes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Work that no machine holds is refused before anything is allocated (each bound says which options)."""
    if args.n_durations * args.max_turns > MAX_POOL:
        parser.error(
            f"--n-durations x --max-turns is {args.n_durations * args.max_turns}, more than {MAX_POOL} (the "
            "duration model draws a tensor of that many numbers); lower one of them"
        )
    batch = args.batch_size or 64
    if args.trace is None and args.steps * batch > MAX_EPISODES:
        parser.error(
            f"--steps x --batch-size is {args.steps * batch} episodes, more than {MAX_EPISODES} per simulated "
            "run; lower --steps"
        )
    if args.extra and args.exp_steps * max(args.exp_batch_sizes) > MAX_EPISODES:
        parser.error(
            f"--exp-steps x the largest --exp-batch-sizes is {args.exp_steps * max(args.exp_batch_sizes)} "
            f"episodes, more than {MAX_EPISODES}; lower one of them"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    low, high = args.tokens_per_turn
    if low > high:
        parser.error(f"--tokens-per-turn: LOW must be <= HIGH; got {low:g} > {high:g}")
    check_sizes(args, parser)
    if args.json and args.trace is None:
        parser.error("--json writes the rows of --trace; give a trace")
    if args.plugins:  # what they register (a staleness policy) is a choice from here on, as in train.py
        from lrl.plugins import load

        for problem in load(args.plugins)[:1]:
            parser.error(problem)
    for problem in cli_problems(args):  # train.py's options by train.py's rules, the outputs: before any work
        parser.error(problem)
    if args.trace is not None:
        return run_trace(args, parser)
    setup = _setup(args)
    try:
        durations = _durations(args)
        if args.single:
            print("\n".join(single_lines(durations, setup, args)))
            return 0
        for lines in table_sections(durations, setup, args):
            print("\n".join(lines) + "\n")
        extras: dict = {}
        if args.extra:
            extras["exponential"] = exponential_rows(
                args.exp_mean,
                args.exp_batch_sizes,
                Setup(1, 1, setup.train_time, setup.sync_time, args.exp_steps),
            )
            extras["consume"] = consume_rows(durations, setup, args.etas)
            extras["sweep"] = sweep_rows(durations, setup, args.etas)
            print("\n".join(exponential_lines(extras["exponential"], args.exp_mean, args.exp_steps)) + "\n")
            print("\n".join(consume_lines(extras["consume"])) + "\n")
            print("\n".join(sweep_lines(extras["sweep"])) + "\n")
        if args.plot:
            for path in write_figures(durations, setup, args, extras):
                print(f"wrote {path}")
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
