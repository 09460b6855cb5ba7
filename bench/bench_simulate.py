"""Scale benchmark of the pipeline simulator: against the slot-scanning reference, and from 64 to 1,048,576 slots.

    python bench/bench_simulate.py [--compare-slots 2048] [--slots 64 256 ...] [--steps 20] [--eta 2]
                                   [--n-durations 23068672] [--memory] [--threads 1]
                                   [--load-slots 64 1024 16384] [--windowed-slots 1024 ... 1048576]

Every run simulates `steps` steps of an asynchronous pipeline with partial rollouts (batch = slots, 60 s
training, 10 s sync, bound eta) on one pool of pre-drawn agent durations (lrl_lab.sim.durations). It prints:

1. the simulator and lab/lrl_lab/sim/reference.py (a plain scan of every slot at every event) on the same run at
   `--compare-slots`, both times, their ratio, and whether every number agrees (throughput, slot use,
   staleness mean, max and histogram, trained duration);
2. one row per `--slots`: events, seconds with and without the event log, events per second; the largest
   row is the one-core time of the biggest run;
3. the load model (episodes as turns on an engine that batches its decoding, lrl_lab.sim.board) at each
   `--load-slots` event by event and at each `--windowed-slots` in windows (lrl_lab.sim.windowed): episodes,
   seconds, microseconds an episode, and where both ran, how far apart their numbers are.

Times come from one run on a shared machine: read the ratios within a run, not the absolute numbers. A row
needs (steps + eta) x slots durations; rows the pool cannot feed are skipped and say so.
"""

from __future__ import annotations

import math
import time
import tracemalloc

import torch

from lrl.cli import OneLineParser
from lrl_lab.sim import agent_episode_durations, simulate_pipeline
from lrl_lab.sim.limits import MAX_POOL, MAX_SEED, MAX_SLOTS
from lrl_lab.sim.options import int_in
from lrl_lab.sim.reference import scan_reference

COMPARED = ("throughput", "gen_util", "staleness_mean", "staleness_max", "staleness_hist", "trained_duration")
LOG_UP_TO = 65_536  # slots up to which the run with the event log is timed too (the log is a tuple per event)


def draw_pool(n: int, seed: int, chunk: int = 65_536) -> torch.Tensor:
    """`n` agent durations drawn chunk by chunk from one generator (bounded memory) -> [n] seconds."""
    gen = torch.Generator().manual_seed(seed)
    parts = [agent_episode_durations(min(chunk, n - i), gen) for i in range(0, n, chunk)]
    return torch.cat(parts)


def timed_run(pool: torch.Tensor, slots: int, steps: int, eta: int, keep_events: bool) -> tuple[float, dict]:
    """Seconds of one simulate_pipeline call and its result."""
    start = time.perf_counter()
    result = simulate_pipeline(pool, slots, slots, 60.0, 10.0, eta, True, steps, keep_events=keep_events)
    return time.perf_counter() - start, result


def peak_mib(pool: torch.Tensor, slots: int, steps: int, eta: int) -> float:
    """Peak Python heap of one run without the event log, numpy arrays included, in MiB (tracemalloc)."""
    tracemalloc.start()
    simulate_pipeline(pool, slots, slots, 60.0, 10.0, eta, True, steps, keep_events=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def compare(pool: torch.Tensor, slots: int, steps: int, eta: int, repeats: int = 3) -> bool:
    """The simulator against the reference on one run: both times (the best of `repeats` each, alternating), the
    ratio, agreement -> all agree."""
    need = (steps + eta) * slots
    if need > len(pool):
        print(f"reference comparison at {slots:,} slots skipped: needs up to {need:,} durations")
        return True
    durations = pool[:need]
    reference_s = simulator_s = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        want = scan_reference(durations.tolist(), slots, slots, 60.0, 10.0, eta, True, steps)
        reference_s = min(reference_s, time.perf_counter() - start)
        took, got = timed_run(durations, slots, steps, eta, keep_events=True)
        simulator_s = min(simulator_s, took)
    differ = [key for key in COMPARED if got[key] != want[key]]
    events_same = got["events"] == want["events"]
    print(
        f"{slots:,} slots against the slot-scanning reference (lab/lrl_lab/sim/reference.py), event log kept by both:"
    )
    print(
        f"  reference {reference_s:.3f} s, simulator {simulator_s:.4f} s (best of {repeats} each): "
        f"{reference_s / simulator_s:.1f}x faster"
    )
    if differ or not events_same:
        print(f"  DIFFERENT: {', '.join(differ + ([] if events_same else ['events']))}")
        return False
    print(
        f"  identical: throughput {got['throughput']:.6f} episodes/h, slot use {got['gen_util']:.6f}, staleness "
        f"mean {got['staleness_mean']:.6f} max {got['staleness_max']} hist {got['staleness_hist']}, trained "
        f"{got['trained_duration']:.6f} s, and all {len(got['events']):,} events"
    )
    return True


def draw_turns(n: int, seed: int) -> list[list[tuple[int, float]]]:
    """`n` agent episodes as turns: 1-4 turns of 20-60 tokens, each followed by a log-normal tool (median 2 s)."""
    import random

    rng = random.Random(seed)
    return [
        [(rng.randint(20, 60), 2.0 * rng.lognormvariate(0.0, 1.0)) for _ in range(rng.randint(1, 4))]
        for _ in range(n)
    ]


def load_rows(
    slot_counts: list[int],
    windowed: list[int],
    steps: int,
    eta: int,
    seed: int,
    window_steps: float | None = None,
    group: int = 8,
) -> None:
    """The board simulator's load model at each slot count, event by event (lrl_lab.sim.load) and in windows
    (lrl_lab.sim.windowed), and how far apart the two are where both ran: batch = slots in groups of `group`, turns
    cycled from a pool of 65,536 episodes, a step of 20 ms + 50 us per episode decoding, 60 s train, 10 s
    weight load, a worker that sees its messages at once (wait slice 0, as the windowed model has it)."""
    from lrl_lab.sim.board import simulate_board
    from lrl_lab.sim.load import EngineCurve
    from lrl_lab.sim.windowed import simulate_windowed

    pool = draw_turns(65_536, seed)
    curve = EngineCurve.linear(0.02, 5e-5)
    print(
        f"\nload model: {steps} steps, batch = slots in groups of {group}, eta {eta}, partial, throttle alone; "
        + (
            f"windows of {window_steps:g} engine step(s)"
            if window_steps
            else "windows of the model's own size"
        )
    )
    print(" | ".join(f"{c:>12}" for c in ("slots", "model", "episodes", "s", "episodes/s", "us/episode")))
    got: dict[tuple[int, str], dict] = {}
    for slots in sorted(set(slot_counts) | set(windowed)):
        args = (slots, group, max(slots // group, 1), 60.0, 10.0, eta, True, steps)
        kw = {"drop": False, "turns": pool, "engine": curve}
        for model in ("event", "windowed"):
            if slots not in (slot_counts if model == "event" else windowed):
                continue
            start = time.perf_counter()
            if model == "event":
                r = simulate_board(None, *args, wait_slice=0.0, **kw)
            else:
                r = simulate_windowed(*args, window_steps=window_steps, **kw)
            took = time.perf_counter() - start
            got[slots, model] = r
            cells = (f"{slots:>12,}", f"{model:>12}", f"{r['started']:>12,}", f"{took:>12.2f}",
                     f"{r['started'] / took:>12,.0f}", f"{took / r['started'] * 1e6:>12.2f}")  # fmt: skip
            print(" | ".join(cells), flush=True)
    both = [n for n in sorted(set(slot_counts) & set(windowed))]
    if both:
        print("\nwindowed against event by event (relative difference; staleness: absolute):")
        for slots in both:
            e, w = got[slots, "event"], got[slots, "windowed"]
            parts = [
                f"{k} {w[k] / e[k] - 1:+.4%}" for k in ("episodes_per_s", "slot_util", "trained_duration")
            ]
            parts.append(f"staleness mean {w['staleness_mean'] - e['staleness_mean']:+.4f}")
            parts.append(f"max {w['staleness_max']} vs {e['staleness_max']}")
            print(f"  {slots:,} slots: " + ", ".join(parts))


def main(argv=None) -> int:
    # each count checked as it is parsed, within the simulator's own limits (lrl_lab.sim.limits)
    slots, count = int_in(1, MAX_SLOTS), int_in(1, 1_000_000)
    p = OneLineParser(prog="bench_simulate.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--slots",
        type=slots,
        nargs="+",
        default=[64, 256, 1024, 2048, 4096, 16384, 65536, 262144, 1048576],
        help="slots of the scale rows",
    )
    p.add_argument("--compare-slots", type=slots, default=2048, help="slots of the reference comparison")
    p.add_argument(
        "--compare-repeats", type=count, default=3, help="runs of each in the comparison (the best counts)"
    )
    p.add_argument("--steps", type=count, default=20)
    p.add_argument("--eta", type=int_in(0, 10_000), default=2)
    p.add_argument(
        "--n-durations",
        type=int_in(1, MAX_POOL),
        default=22 << 20,
        help="pool size; (steps + eta) x slots feeds a row",
    )
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    p.add_argument(
        "--memory", action="store_true", help="also measure the peak Python heap (slow: tracemalloc)"
    )
    p.add_argument(
        "--threads", type=int_in(1, 1024), default=1, help="torch threads (the simulator runs on one core)"
    )
    p.add_argument(
        "--load-slots",
        type=slots,
        nargs="*",
        default=[64, 1024, 16384],
        help="slots of the event-by-event load model's rows (none: skip them; 16,384 takes about 30 s, 65,536 "
        "about 2 minutes)",
    )
    p.add_argument(
        "--windowed-slots",
        type=slots,
        nargs="*",
        default=[1024, 16384, 262144, 1048576],
        help="slots of the windowed load model's rows (lrl_lab.sim.windowed; 1,048,576 takes about 50 s)",
    )
    p.add_argument(
        "--window-steps",
        type=float,
        default=1.0,
        help="the windowed model's window, in engine steps (the model's own default is 1 for actions of 40 tokens)",
    )
    args = p.parse_args(argv)
    if not (math.isfinite(args.window_steps) and args.window_steps > 0):
        p.error(f"--window-steps: {args.window_steps} is not allowed; it must be a finite number above 0")
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    pool = draw_pool(args.n_durations, args.seed)
    print(
        f"drew {len(pool):,} durations in {time.perf_counter() - start:.2f} s; torch threads {args.threads}"
    )
    print(f"{args.steps} steps, batch = slots, eta = {args.eta}, partial rollouts, 60 s train, 10 s sync\n")
    same = compare(pool, args.compare_slots, args.steps, args.eta, args.compare_repeats)
    print()
    cols = ("slots", "events", "s (log)", "s (no log)", "events/s", "us/event", "peak MiB")
    print(" | ".join(f"{c:>10}" for c in cols))
    for slots in args.slots:
        need = (args.steps + args.eta) * slots
        if need > len(pool):
            print(f"{slots:>10} | skipped: needs up to {need:,} durations (--n-durations)")
            continue
        durations = pool[:need]  # all a run can use: the check of its input then costs what the run does
        lean, result = timed_run(durations, slots, args.steps, args.eta, False)
        with_log = timed_run(durations, slots, args.steps, args.eta, True)[0] if slots <= LOG_UP_TO else None
        cells = (
            f"{slots:>10,}",
            f"{result['n_events']:>10,}",
            f"{with_log:>10.3f}" if with_log is not None else f"{'-':>10}",
            f"{lean:>10.3f}",
            f"{result['n_events'] / lean:>10,.0f}",
            f"{lean / result['n_events'] * 1e6:>10.3f}",
            f"{peak_mib(durations, slots, args.steps, args.eta):>10.1f}" if args.memory else f"{'-':>10}",
        )
        print(" | ".join(cells), flush=True)
    if args.load_slots or args.windowed_slots:
        load_rows(args.load_slots, args.windowed_slots, args.steps, args.eta, args.seed, args.window_steps)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
