"""Seeds where they decide: ``decide --budget HOURS`` runs paired seeds in rounds and gives each round to the
comparisons still open, until every comparison of the family is decided, the budget is spent or ``--seeds`` run out.

The design is **group-sequential with the error split evenly over the looks planned**. Before the first round the
command fixes K = ceil(--seeds / --round-seeds), the most rounds it can run (a look after each round of
``--round-seeds`` paired seeds). At each look every comparison of the family (the chapter's claims among the rows
asked, or each row against the baseline) gets its paired t test's p over the seeds it has, and Holm's step-down
procedure over the whole family runs at level alpha / K. A comparison Holm rejects at a look is decided there, on
the side its mean lies, and takes no more seeds; the others go on. Each look holds the family-wise error at
alpha / K, so the chance of any false verdict at any look is at most alpha however early the command stops (on a
verdict, on the budget, on a signal): the union bound over the K looks. Each record keeps its round and K, so the
verdicts are replayed from the records (``--from-results``) exactly as they were reached.

Why this and not a confidence sequence: the comparisons here have 5-20 paired seeds, and a confidence sequence for a
bounded difference (Hoeffding or empirical Bernstein, valid at every sample size without a K) is wider at those
sizes than a t interval at alpha / K for the few looks a CPU's budget allows (K <= 10); the t test's normality is
the assumption the tables already make. The price: K is fixed before the first round, and a verdict reached at a
look stands even where later seeds would have moved its mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lrl_lab.experiments.decide_tables import CLAIMS, by_row, holm, holm_verdict, interval, paired, paired_p

ALPHA = 0.05


@dataclass
class Comparison:
    label: str
    a: str
    b: str
    sign: int  # the side a claim expects (+1 a above b, -1 below); 0: two-sided, a row against the baseline
    decided: str | None = None  # the verdict once decided
    seeds: int = 0  # the paired seeds it was decided on (or has)
    look: int = 0  # the look it was decided at
    history: list[tuple[int, float]] = field(default_factory=list)  # (seeds, p) at each look


def family(rows: list[str], baseline: str) -> list[Comparison]:
    """The comparisons a budget serves: the chapter's claims whose rows were asked, else each row against
    `baseline`."""
    claims = [Comparison(c, a, b, s) for c, a, b, s in CLAIMS if a in rows and b in rows]
    return claims or [Comparison(f"{r} - {baseline}", r, baseline, 0) for r in rows if r != baseline]


def planned_looks(seeds: int, round_seeds: int) -> int:
    """K: the most rounds (each followed by a look) `seeds` seeds a row allow, `round_seeds` a round."""
    return max(1, math.ceil(seeds / round_seeds))


def round_seconds(walls: list[float], runs: int, jobs: int) -> float:
    """A round's seconds: `runs` runs, `jobs` at a time, at the median wall of the runs so far (NaN: none yet)."""
    if not walls:
        return float("nan")
    median = sorted(walls)[len(walls) // 2]
    return median * math.ceil(runs / max(jobs, 1))


def look(comparisons: list[Comparison], rows: dict, metric: str, k: int, looks: int) -> None:
    """One look: every open comparison tested on the seeds it has now, Holm over the family at alpha / K; the ones
    rejected are decided at this look (those decided earlier stay so)."""
    ps, means = [], []
    for c in comparisons:
        diffs = paired(rows, c.a, c.b, metric)
        p = paired_p(diffs) if not c.decided else 0.0  # a decided one stays rejected in the step-down order
        if not c.decided:
            c.seeds = len(diffs)
            c.history.append((len(diffs), p))
        ps.append(p)
        means.append(interval(diffs)[0])
    for c, adj, mean in zip(comparisons, holm(ps), means):
        if c.decided:
            continue
        if adj <= ALPHA / looks:
            if c.sign:
                c.decided = holm_verdict(mean, adj, c.sign, ALPHA / looks)
            else:
                c.decided = "a above b" if mean > 0 else "a below b"
            c.look = k


def open_rows(comparisons: list[Comparison]) -> list[str]:
    """The rows the next round runs: those of the comparisons still open, in order."""
    return list(dict.fromkeys(r for c in comparisons if not c.decided for r in (c.a, c.b)))


def replay(results: list[dict], order: list[str], baseline: str, metric: str) -> tuple[list[Comparison], int, int]:
    """The looks of a budgeted command, again from its records (each keeps its ``round`` and ``looks``): the
    comparisons as they stood after the last round, K and the rounds run (no record with a round: none)."""
    rounds = [r for r in results if r.get("round")]
    if not rounds:
        return [], 0, 0
    looks = max(int(r.get("looks", 1)) for r in rounds)
    last = max(int(r["round"]) for r in rounds)
    comparisons = family([x for x in order if any(r["row"] == x for r in results)], baseline)
    for k in range(1, last + 1):
        look(comparisons, by_row([r for r in results if r.get("round", 0) <= k]), metric, k, looks)
    return comparisons, looks, last


def summary(comparisons: list[Comparison], looks: int, rounds_run: int) -> list[str]:
    """The table of the sequential verdicts: each comparison, its seeds and look, the last p."""
    lines = [f"Sequential verdicts (--budget): {rounds_run} round(s) of at most {looks}; Holm over the "
             f"{len(comparisons)} comparisons at {ALPHA:g} / {looks} a look (lrl_lab.experiments.sequential):", "",
             "| comparison | seeds | look | last p | verdict |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for c in comparisons:
        p = c.history[-1][1] if c.history else float("nan")
        lines.append(f"| {c.label} | {c.seeds} | {c.look or '-'} | {p:.3f} | "
                     f"{c.decided or 'not decided within the budget'} |")  # fmt: skip
    return lines
