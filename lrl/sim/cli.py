"""The simulator's command line: ``python -m lrl.sim`` (``python -m lrl.simulate`` is the same command).

`python -m lrl.sim` prints the reference tables (docs/simulate.md): episode durations and batch maxima, the
five pipeline designs, a timeout, the sync cost, and the length bias of worker failures. `--extra` adds
exponential durations against m H_B, the bound enforced at consumption, and the staleness sweep;
`--plot DIR` writes the timeline and staleness-throughput figures (and the extras' plots) as PNG and SVG;
`--single` simulates one configuration given by the options; `--trace FILE` plans a pipeline from a trace of
one's own episodes (lrl/sim/planner.py). See docs/simulate.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from lrl.cli import OneLineParser
from lrl.sim.checks import cli_problems
from lrl.sim.durations import agent_episode_durations
from lrl.sim.limits import MAX_EPISODES, MAX_POOL, MAX_SECONDS, MAX_SEED, MAX_SLOTS
from lrl.sim.tables import (
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
from lrl.sim.trace import TraceError, read_trace


def _typed(cast, test, what: str):
    """An argparse type: cast the text, then check it (`what` says what is expected)."""

    def parse(text: str):
        try:
            value = cast(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def int_in(low: int, high: int):
    return _typed(int, lambda v: low <= v <= high, f"an integer in [{low}, {high}]")


def seconds(low_open: bool):
    if low_open:
        return _typed(float, lambda v: 0 < v <= MAX_SECONDS, f"a number of seconds in (0, {MAX_SECONDS:g}]")
    return _typed(float, lambda v: 0 <= v <= MAX_SECONDS, f"a number of seconds in [0, {MAX_SECONDS:g}]")


POS_INT = int_in(1, MAX_SLOTS)  # counts of slots, episodes and batches
NONNEG_INT = int_in(0, 10_000)  # staleness bounds
STEPS = int_in(1, 1_000_000)
NONNEG_FLOAT = _typed(float, lambda v: 0 <= v <= MAX_SECONDS, f"a finite number in [0, {MAX_SECONDS:g}]")
POS_FLOAT = seconds(low_open=True)
FRACTION = _typed(float, lambda v: 0 < v < 1, "a number strictly between 0 and 1")
SEED = int_in(0, MAX_SEED)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except where the help itself says what an unset option means."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The command line: every duration-model and simulator setting, with the reference values as defaults."""
    p = OneLineParser(
        prog="python -m lrl.sim",
        description="Simulate rollout pipelines. Prints the reference tables (docs/simulate.md): "
        "durations and batch maxima, five designs, a timeout, the sync cost, the failure bias. --extra adds "
        "exponential durations, the bound enforced at consumption and the staleness sweep, --plot DIR writes "
        "the figures, --single runs one "
        "configuration given by the options, --trace FILE plans a pipeline from a trace of your own episodes.",
        formatter_class=_Help,
    )
    g = p.add_argument_group("episode durations")
    g.add_argument(
        "--seed", type=SEED, default=0, help="seed of the torch CPU generator the durations come from"
    )
    g.add_argument(
        "--n-durations",
        type=int_in(1, MAX_POOL),
        default=65_536,
        help="durations drawn (the pool every run uses)",
    )
    g.add_argument(
        "--mean-turns",
        type=_typed(float, lambda v: 1 < v <= 10_000, "a number in (1, 10000]"),
        default=8,
        help="mean turns",
    )
    g.add_argument("--max-turns", type=int_in(1, 10_000), default=40, help="turns are capped at this")
    g.add_argument(
        "--tokens-per-turn",
        type=NONNEG_FLOAT,
        nargs=2,
        default=[100, 600],
        metavar=("LOW", "HIGH"),
        help="tokens per turn are uniform in [LOW, HIGH)",
    )
    g.add_argument("--decode-rate", type=POS_FLOAT, default=40.0, help="per-sequence decode rate (tokens/s)")
    g.add_argument("--tool-median", type=POS_FLOAT, default=2.0, help="median tool latency per turn (s)")
    g.add_argument(
        "--tool-sigma", type=NONNEG_FLOAT, default=1.0, help="log-normal sigma of the tool latency"
    )
    g.add_argument(
        "--batch-sizes",
        type=POS_INT,
        nargs="+",
        default=[8, 64, 512],
        help="batch sizes whose expected slowest episode is printed",
    )
    g = p.add_argument_group("pipeline")
    g.add_argument(
        "--slots", type=POS_INT, help="generation slots (concurrent episodes); default 64, or the trace's"
    )
    g.add_argument(
        "--batch-size",
        "--batch",
        type=POS_INT,
        help="episodes per training step; default 64, or the trace's",
    )
    g.add_argument(
        "--train-time",
        type=NONNEG_FLOAT,
        help="seconds per training step; default 60 for the tables, with --trace it overrides the trace",
    )
    g.add_argument(
        "--sync-time",
        type=NONNEG_FLOAT,
        help="seconds per weight sync (pauses generation); default 10 for the tables, with --trace it "
        "overrides the trace",
    )
    g.add_argument("--steps", type=STEPS, default=20, help="training steps simulated")
    g = p.add_argument_group("timeout, sync cost and worker failures")
    g.add_argument(
        "--timeout-quantile", type=FRACTION, default=0.95, help="timeout at this duration quantile"
    )
    g.add_argument(
        "--sync-times", type=NONNEG_FLOAT, nargs="+", default=[1.0, 10.0, 60.0], help="sync costs (s)"
    )
    g.add_argument(
        "--sync-eta", type=NONNEG_INT, default=2, help="staleness bound of the async row of the sync table"
    )
    g.add_argument(
        "--failure-mtbf",
        type=POS_FLOAT,
        default=None,
        help="seconds per worker failure (constant hazard); tables default to 2000; with --single, "
        "failures are simulated only if given",
    )
    g.add_argument("--failure-seed", type=SEED, default=1, help="seed of the failure draws")
    g = p.add_argument_group("extras")
    g.add_argument(
        "--extra",
        action="store_true",
        help="also print exponential durations against m H_B, the bound enforced at consumption, and the staleness sweep",
    )
    g.add_argument("--etas", type=NONNEG_INT, nargs="+", default=list(range(9)), help="bounds of the sweeps")
    g.add_argument("--exp-mean", type=POS_FLOAT, default=96.0, help="exponential study: mean duration (s)")
    g.add_argument("--exp-steps", type=STEPS, default=200, help="exponential study: steps per batch size")
    g.add_argument(
        "--exp-batch-sizes",
        type=POS_INT,
        nargs="+",
        default=[1, 8, 64, 512],
        help="exponential study: batch sizes (slots = B)",
    )
    g.add_argument(
        "--plot",
        metavar="DIR",
        help="write the timeline and staleness-throughput figures (with --extra also their plots) here, as PNG and SVG",
    )
    g.add_argument(
        "--timeline-slots", type=int_in(1, 1024), default=8, help="timeline figure: slots = episodes per step"
    )
    g.add_argument("--timeline-steps", type=int_in(1, 1000), default=4, help="timeline figure: steps drawn")
    g.add_argument(
        "--timeline-eta", type=NONNEG_INT, default=1, help="timeline figure: bound of the async pipeline"
    )
    g = p.add_argument_group("a trace of your own pipeline (--trace)")
    g.add_argument(
        "--trace",
        metavar="FILE",
        help="plan from this trace: one episode per line (CSV with a duration_s column, or JSONL), the "
        "trainer's train_s and sync_s in it or given by --train-time and --sync-time (docs/simulate.md)",
    )
    g.add_argument("--json", metavar="FILE", help="with --trace: also write the rows to this JSON file")
    g.add_argument(
        "--plan-slots",
        type=POS_INT,
        nargs="+",
        default=None,
        metavar="N",
        help="with a turn trace: the slot counts to plan for (default: --slots, the trace's, or 64)",
    )
    g.add_argument(
        "--bounds",
        type=NONNEG_INT,
        nargs="+",
        default=[1, 2, 4],
        metavar="K",
        help="with a turn trace: the staleness bounds to plan for, each with partial rollouts and drain",
    )
    g.add_argument(
        "--tool-servers",
        type=POS_INT,
        default=None,
        help="with a turn trace: each worker's tool calls queue for this many servers (a sandbox pool), a turn's "
        "tool seconds being its service time; default: the trace's, else every call at once",
    )
    g.add_argument(
        "--model",
        choices=("auto", "event", "windowed"),
        default="auto",
        help="with a turn trace: simulate event by event, or in windows on arrays (lrl.sim.windowed: 20 steps of a "
        "million slots in under a minute; the throttle alone and the drop policy, tools at once); auto: windowed "
        "from 16,384 slots a worker where it applies",
    )
    g.add_argument(
        "--policies",
        nargs="+",
        default=None,
        metavar="P",
        help="with a turn trace: plan the async designs under the hard bound, once with each staleness policy "
        "(lrl's --stale-policy: drop mask oldest-first abort cut ordered), with their waste; default: the "
        "throttle alone",
    )
    g.add_argument(
        "--take-patience",
        type=float,
        nargs="+",
        default=None,
        metavar="S",
        help="with --policies ordered: the seconds the trainer waits for an earlier issued group (lrl's "
        "--take-patience), one plan row each; default: it waits until the group is back",
    )
    g.add_argument(
        "--take-patience-steps",
        type=float,
        nargs="+",
        default=None,
        metavar="K",
        help="with --policies ordered: the same patience in trainer steps (lrl's --take-patience-steps), one plan "
        "row each",
    )
    g.add_argument(
        "--engine-step",
        type=NONNEG_FLOAT,
        nargs=2,
        default=None,
        metavar=("BASE", "PER"),
        help="with a turn trace: an engine step of BASE + PER x episodes decoding seconds (instead of the "
        "trace's measured curve)",
    )
    g.add_argument(
        "--group",
        type=POS_INT,
        default=None,
        help="with a turn trace: episodes per task (the trainer's unit)",
    )
    g.add_argument(
        "--workers",
        type=int_in(1, 4096),
        default=1,
        help="with a turn trace: rollout workers, each with --plan-slots slots and its own engine",
    )
    g = p.add_argument_group("one configuration (--single)")
    g.add_argument("--single", action="store_true", help="simulate one configuration instead of the tables")
    g.add_argument(
        "--max-staleness", type=NONNEG_INT, default=0, help="generation throttle eta (batches ahead)"
    )
    g.add_argument(
        "--drain", action="store_true", help="drain in-flight episodes before each sync (no partial rollouts)"
    )
    g.add_argument(
        "--consume-max-staleness",
        type=NONNEG_INT,
        default=None,
        help="the trainer drops episodes staler than this",
    )
    g.add_argument("--timeout", type=POS_FLOAT, default=None, help="truncate durations to this many seconds")
    return p


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
    from lrl.sim import figures

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
    from lrl.sim import planner, turns

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
    from lrl.sim import turns
    from lrl.sim.load import EngineCurve

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
