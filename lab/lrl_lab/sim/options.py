"""The simulator's options (``python -m lrl_lab.sim --help``), group by group, each checked as it is parsed."""

from __future__ import annotations

import argparse

from lrl.cli import OneLineParser
from lrl.pipeline.policies import STALE_POLICIES
from lrl_lab.sim.limits import MAX_POOL, MAX_SECONDS, MAX_SEED, MAX_SLOTS


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
    """The command line: every duration-model and simulator setting, with the reference values as defaults."""
    p = OneLineParser(
        prog="python -m lrl_lab.sim",
        description="Simulate rollout pipelines. Prints the reference tables (docs/simulate.md): "
        "durations and batch maxima, five designs, a timeout, the sync cost, the failure bias. --extra adds "
        "exponential durations, the bound enforced at consumption and the staleness sweep, --plot DIR writes "
        "the figures, --single runs one "
        "configuration given by the options, --trace FILE plans a pipeline from a trace of your own episodes.",
        formatter_class=_Help,
    )
    add_durations(p)
    add_pipeline(p)
    add_failures(p)
    add_extras(p)
    add_trace(p)
    add_single(p)
    return p


def add_durations(p: argparse.ArgumentParser) -> None:
    """The options of episode durations."""
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


def add_pipeline(p: argparse.ArgumentParser) -> None:
    """The options of pipeline."""
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


def add_failures(p: argparse.ArgumentParser) -> None:
    """The options of timeout, sync cost and worker failures."""
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


def add_extras(p: argparse.ArgumentParser) -> None:
    """The options of extras."""
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


def add_trace(p: argparse.ArgumentParser) -> None:
    """The options of a trace of your own pipeline (--trace)."""
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
        help="with a turn trace: simulate event by event, or in windows on arrays (lrl_lab.sim.windowed: 20 steps of a "
        "million slots in under a minute; the throttle alone and the drop policy, tools at once); auto: windowed "
        "from 16,384 slots a worker where it applies",
    )
    g.add_argument(
        "--policies",
        nargs="+",
        default=None,
        metavar="P",
        help="with a turn trace: plan the async designs under the hard bound, once with each staleness policy "
        "(lrl's --stale-policy: "
        + " ".join(STALE_POLICIES)
        + ", or one that --plugins registers), with their "
        "waste; default: the throttle alone",
    )
    g.add_argument(
        "--plugins",
        nargs="+",
        default=[],
        metavar="MODULE",
        help="modules to import first, as train.py's --plugins (from the current folder or the Python path): a "
        "staleness policy one registers is simulated with --policies as lrl runs it",
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


def add_single(p: argparse.ArgumentParser) -> None:
    """The options of one configuration (--single)."""
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
