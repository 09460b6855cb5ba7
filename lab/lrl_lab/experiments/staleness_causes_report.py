"""Why the staleness rows end where they do, from the runs' own records (results.json of
lrl_lab.experiments.staleness): where the ratios leave the MIS band and what those tokens are, how the runs that
end low fail, and the time course of each row. Tables only; the runs are lrl_lab.experiments.staleness."""

from __future__ import annotations

import math

from lrl_lab.experiments.band_probe import KINDS, P_BINS, totals
from lrl_lab.experiments.staleness_report import key_of
from lrl_lab.experiments.stats import mean, mean_se

LOW_END = 0.85  # a run that ends below this held-out pass rate is examined in the outcome table


def _cells(results: list[dict], row: tuple, lr: float) -> list[dict]:
    return sorted((r for r in results if key_of(r) == (*row, lr) and "band" in r), key=lambda r: r["seed"])


def _share(num: float, den: float) -> float:
    return num / den if den else float("nan")


def _label(row: tuple, lr: float) -> str:
    sampler, lag, corr, level = row
    return f"{lr:g} {sampler} {lag} {corr}" + (f" ({level})" if corr != "none" else "")


def band_table(results: list[dict], rows: list[tuple], lrs: list[float]) -> list[str]:
    """Per row, over every step of every seed: the share of action tokens below / above the band, of each kind
    outside it, of the |advantage| they carry, of above-band tokens with a positive advantage, and each
    correction's |A|-weighted distance from the unbiased weight pi_old/mu (band_probe.weight_error)."""
    head = [
        "row",
        "tokens below / above",
        *[f"{k} outside" for k in KINDS],
        "|A| outside",
        "above with A > 0",
        "error none / TIS / MIS",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lr in lrs:
        for row in rows:
            cells = _cells(results, row, lr)
            if not cells or row[1] == 0:
                continue
            t = _sum([totals(c["band"]) for c in cells])
            kinds = [_share(t[f"below_{k}"] + t[f"above_{k}"], t[f"tokens_{k}"]) for k in KINDS]
            errors = [_share(t[f"error_{c}"], t["adv_mass"]) for c in ("none", "tis", "mis")]
            lines.append(
                f"| {_label(row, lr)} | {_share(t['below'], t['tokens']):.3f} / {_share(t['above'], t['tokens']):.3f} | "
                + " | ".join(f"{x:.3f}" for x in kinds)
                + f" | {_share(t['adv_below'] + t['adv_above'], t['adv_mass']):.3f} | "
                f"{_share(t['above_positive'], t['above']):.2f} | "
                + " / ".join(f"{e:.2f}" for e in errors)
                + " |"
            )
    return lines


def probability_table(results: list[dict], rows: list[tuple], lrs: list[float]) -> list[str]:
    """Per row: of the tokens below (above) the band, the share in each bin of the trainer's pi_old(token)."""
    head = ["row", *[f"below: {b}" for b in P_BINS], *[f"above: {b}" for b in P_BINS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lr in lrs:
        for row in rows:
            cells = _cells(results, row, lr)
            if not cells or row[1] == 0:
                continue
            t = _sum([totals(c["band"]) for c in cells])
            below = [_share(t[f"below_{b}"], t["below"]) for b in P_BINS]
            above = [_share(t[f"above_{b}"], t["above"]) for b in P_BINS]
            lines.append(f"| {_label(row, lr)} | " + " | ".join(f"{x:.2f}" for x in below + above) + " |")
    return lines


def outcome_table(results: list[dict], rows: list[tuple], lrs: list[float]) -> list[str]:
    """Per row: how many seeds end below LOW_END, and how those fail at the end, held out: reads per episode
    (below 0.5: the policy does not read) and the malformed share; the seeds themselves."""
    head = ["row", f"seeds below {LOW_END}", "their held-out", "their reads", "their invalid", "which"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lr in lrs:
        for row in rows:
            cells = _cells(results, row, lr)
            if not cells:
                continue
            low = [c for c in cells if c["heldout"] < LOW_END]
            if not low:
                lines.append(f"| {_label(row, lr)} | 0/{len(cells)} | | | | |")
                continue
            held = mean([c["heldout"] for c in low])
            reads = mean([c.get("env_reads", float("nan")) for c in low])
            invalid = mean([c.get("heldout_invalid", float("nan")) for c in low])
            which = ", ".join(str(c["seed"]) for c in low)
            lines.append(
                f"| {_label(row, lr)} | {len(low)}/{len(cells)} | {held:.3f} | {reads:.2f} | {invalid:.3f} | {which} |"
            )
    return lines


def course_table(results: list[dict], rows: list[tuple], lrs: list[float]) -> list[str]:
    """Per row, mean over seeds: held-out pass rate at each evaluation, and by quarter of the run the
    behavior policy's reads and malformed share and the step KL."""
    steps = sorted({e["step"] for r in results if "evals" in r for e in r["evals"]})
    head = [
        "row",
        *[f"held-out @{s}" for s in steps],
        "reads by quarter",
        "invalid by quarter",
        "step KL by quarter",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lr in lrs:
        for row in rows:
            cells = _cells(results, row, lr)
            if not cells:
                continue
            held = []
            for s in steps:
                xs = [e["pass_rate"] for c in cells for e in c["evals"] if e["step"] == s]
                mu, se = mean_se(xs) if xs else (float("nan"), float("nan"))
                held.append(f"{mu:.3f} ± {se:.3f}" if not math.isnan(se) else f"{mu:.3f}")
            quarters = [_quarters(cells, k) for k in ("train/reads", "train/invalid", "train/step_kl")]
            lines.append(f"| {_label(row, lr)} | " + " | ".join(held + quarters) + " |")
    return lines


def _quarters(cells: list[dict], key: str) -> str:
    """Mean over seeds of the mean of `key` in each quarter of the run, as 'a b c d'."""
    n = len(cells[0]["history"])
    q = max(n // 4, 1)
    parts = []
    for i in range(4):
        per_seed = [
            mean([h.get(key, 0.0) for h in c["history"][i * q : (i + 1) * q]] or [float("nan")])
            for c in cells
        ]
        parts.append(f"{mean(per_seed):.{3 if 'kl' in key else 2}f}")
    return " ".join(parts)


def _sum(dicts: list[dict]) -> dict:
    return {k: sum(d[k] for d in dicts) for k in dicts[0]}


def causes(results: list[dict], rows: list[tuple], lrs: list[float]) -> str:
    """The four tables as markdown."""
    if not any("band" in r for r in results):
        return "No per-step records in these results (runs made before lrl_lab.experiments.band_probe).\n"
    parts = [
        "Where the ratios pi_old/mu leave the MIS band, over every step of every seed (token kinds: "
        "lrl_lab.experiments.band_probe):",
        "",
        *band_table(results, rows, lrs),
        "",
        "Tokens below and above the band, by the trainer's probability pi_old(token):",
        "",
        *probability_table(results, rows, lrs),
        "",
        "The runs that end low:",
        "",
        *outcome_table(results, rows, lrs),
        "",
        "Time course (mean over seeds):",
        "",
        *course_table(results, rows, lrs),
    ]
    return "\n".join(parts) + "\n"
