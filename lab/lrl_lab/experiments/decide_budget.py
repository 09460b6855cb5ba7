"""decide --budget: the rounds of a budgeted command (lrl_lab.experiments.sequential says how they decide)."""

from __future__ import annotations

import math
import sys
import time

from lrl_lab.experiments import records, sequential
from lrl_lab.experiments.decide_tables import by_row
from lrl_lab.experiments.runner import Stopped


def run_budget(args, rows, baseline, flags, threads, seeds, have, done, done_path, wanted, out, parts) -> int:
    """--budget: rounds of --round-seeds paired seeds, each for the rows of the comparisons still open, a look after
    each (lrl_lab.experiments.sequential), until all are decided, the budget is spent or --seeds run out; every record
    keeps its round and K; the tables end with the sequential verdicts and the seeds each took. `parts`: decide's
    run_cells and write_tables (handed over, so that this module does not import decide)."""
    run_cells, write_tables = parts

    budget_s, start = args.budget * 3600, time.time()
    comparisons = sequential.family(list(rows), baseline)
    seeds = list(seeds)
    looks = sequential.planned_looks(len(seeds), args.round_seeds)
    print(f"decide: at most {looks} round(s) of {args.round_seeds} paired seed(s) in {args.budget:g} h; each look "
          f"tests the {len(comparisons)} comparisons at {sequential.ALPHA:g} / {looks} (Holm)")  # fmt: skip
    walls = [r["wall"] for r in done if r["row"] in rows and "wall" in r]
    k, failed, runs = 0, 0, 0
    while (open_rows := sequential.open_rows(comparisons)) and k < looks:
        chunk = seeds[k * args.round_seeds : (k + 1) * args.round_seeds]
        cells = [(label, rows[label], seed, flags, args.samples, threads) for seed in chunk for label in open_rows
                 if (label, seed) not in have]  # fmt: skip
        cost = sequential.round_seconds(walls, len(cells), args.jobs)
        if time.time() - start + (cost if math.isfinite(cost) else 0) > budget_s:
            print(f"decide: round {k + 1} would pass the budget ({args.budget:g} h, about {cost / 60:.0f} min a "
                  f"round); stopping after {k}")  # fmt: skip
            break
        k += 1
        print(f"round {k} of at most {looks}: seeds {chunk[0]}-{chunk[-1]} of {', '.join(open_rows)} "
              f"({len(cells)} runs)", flush=True)  # fmt: skip
        before = len(done)
        result = run_cells(cells, args.jobs, done_path, done, extra={"round": k, "looks": looks})
        if isinstance(result, Stopped):
            return result.exit_code
        failed, runs = failed + result, runs + len(cells)
        walls += [r["wall"] for r in done[before:] if "wall" in r]
        have |= {(label, seed) for label, _, seed, *_ in cells}
        pooled, _ = records.pool([r for r in done if r["row"] in rows], rows, wanted)
        sequential.look(comparisons, by_row(pooled), args.metric, k, looks)
    write_tables(args, rows, baseline, done, done_path, wanted, out)
    if failed:
        print(f"decide: {failed} of {runs} runs failed (above); the table holds the others", file=sys.stderr)
    return 1 if failed else 0
