"""Scale benchmark of the pipeline simulator: events per second from 64 to 16,384 slots.

    python bench/bench_simulate.py [--slots 64 256 ...] [--steps 20] [--eta 2] [--n-durations 1048576]

Each row simulates `steps` steps of an asynchronous pipeline with partial rollouts (batch = slots, 60 s
training, 10 s sync, bound eta) on one pool of pre-drawn agent durations, with and without the event log.
Times come from one run on a shared machine: read the ratios between rows, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import math
import time
import tracemalloc

import torch

from lrl.sim import agent_episode_durations, simulate_pipeline


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
    """Peak Python heap of one run without the event log, in MiB (tracemalloc; slows the run)."""
    tracemalloc.start()
    simulate_pipeline(pool, slots, slots, 60.0, 10.0, eta, True, steps, keep_events=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, nargs="+", default=[64, 256, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eta", type=int, default=2)
    p.add_argument("--n-durations", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--memory", action="store_true", help="also measure the peak Python heap (slow: tracemalloc)"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (the simulator itself is pure Python)"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    pool = draw_pool(args.n_durations, args.seed)
    print(f"drew {len(pool):,} durations in {time.perf_counter() - start:.2f} s")
    print(f"{args.steps} steps, batch = slots, eta = {args.eta}, partial rollouts, 60 s train, 10 s sync")
    cols = (
        "slots",
        "events",
        "s (log)",
        "s (no log)",
        "events/s",
        "us/event",
        "x vs first",
        "log2 ratio",
        "peak MiB",
    )
    print(" | ".join(f"{c:>10}" for c in cols))
    base = None
    for slots in args.slots:
        need = (args.steps + args.eta) * slots
        if need > len(pool):
            print(f"{slots:>10} | skipped: needs up to {need:,} durations")
            continue
        with_log, result = timed_run(pool, slots, args.steps, args.eta, True)
        lean, _ = timed_run(pool, slots, args.steps, args.eta, False)
        per_event = lean / result["n_events"] * 1e6
        base = base or (per_event, slots)
        cells = (
            f"{slots:>10}",
            f"{result['n_events']:>10,}",
            f"{with_log:>10.3f}",
            f"{lean:>10.3f}",
            f"{result['n_events'] / lean:>10,.0f}",
            f"{per_event:>10.2f}",
            f"{per_event / base[0]:>10.2f}",
            f"{math.log2(slots) / math.log2(base[1]):>10.2f}",
            f"{peak_mib(pool, slots, args.steps, args.eta):>10.1f}" if args.memory else f"{'-':>10}",
        )
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
