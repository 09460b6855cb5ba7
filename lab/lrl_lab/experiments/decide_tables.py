"""decide's tables: each row's mean with its 95% interval, paired differences from a baseline row, the runs that
learned, and the chapter's claims with a verdict each; read from the runs of results.jsonl (decide.py runs them)."""

from __future__ import annotations

import math

# two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the normal's 1.96 is within 2%)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
       20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip
METRICS = {
    "sampled": "held-out, sampled",
    "greedy": "held-out, greedy",
    "reward": "training reward",
}
# what results.jsonl keeps of each step of a run: where a row's time went, and the first step at which two runs of
# the same flags and seed part (the loss and the gradient norm, at full precision)
STEP_KEYS = {
    "step": "step",
    "reward": "train/reward",
    "skipped": "train/skipped",
    "action_tokens": "train/action_tokens",
    "mismatch": "mismatch/abs_mean",
    "over_cap": "mismatch/over_cap",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    **{
        f"{k}_{s}": f"train/{k}_{s}" for k in ("clip", "push", "adv") for s in ("pos", "neg")
    },  # by the advantage's sign
    "sample_s": "time/sample",
    "old_logp_s": "time/old_logp",
    "update_s": "time/update",
}


def step_figures(logged: dict) -> dict:
    """What results.jsonl keeps of one step's logged metrics: the ``STEP_KEYS``, under their short names, the
    shares of action tokens and of whole episodes each rule of the correction dropped (lrl.metrics'
    ``offpolicy/dropped_tokens/<rule>`` and ``offpolicy/dropped_seqs/<rule>``, kept without ``offpolicy/``), and
    on the steps that split the mismatch (``--mismatch-split-every``) its parts (``mismatch/part/*``)."""
    kept = {name: logged[key] for name, key in STEP_KEYS.items() if key in logged}
    kept |= {k.removeprefix("offpolicy/"): v for k, v in logged.items() if k.startswith("offpolicy/dropped_")}
    return kept | {
        k: v for k, v in logged.items() if k.startswith("mismatch/part/")
    }  # the live split, where run


# the chapter's conclusions as (claim, row a, row b, the sign a - b has where the claim holds)
CLAIMS = [
    ("staleness costs (lag 8 below on-policy)", "lag 8", "on-policy", -1),
    ("TIS recovers what lag 8 costs", "lag 8, TIS", "lag 8", +1),
    ("FP8 costs (FP8 below on-policy)", "FP8", "on-policy", -1),
    ("TIS recovers what FP8 costs", "FP8, TIS", "FP8", +1),
    ("MIS recovers what FP8 costs", "FP8, MIS", "FP8", +1),
    ("staleness costs at lag 4", "lag 4", "on-policy", -1),
    ("TIS recovers what lag 4 costs", "lag 4, TIS", "lag 4", +1),
    ("MIS recovers what lag 8 costs", "lag 8, MIS", "lag 8", +1),
]


# -- statistics -------------------------------------------------------------------------------------------------
def t95(df: int) -> float:
    if df < 1:
        return float("nan")
    known = [k for k in T95 if k <= df]
    return T95[max(known)] if df <= 30 else 1.96


def interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and the half-width of its 95% interval (Student's t), and the standard deviation: (mean, half, sd)."""
    n = len(xs)
    mean = sum(xs) / n if n else float("nan")
    if n < 2:
        return mean, float("nan"), float("nan")
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, t95(n - 1) * sd / math.sqrt(n), sd


def seeds_needed(sd: float, effect: float) -> float:
    """Seeds for a paired difference of `effect` to be seen with 80% power at 5% (two-sided), at spread `sd`."""
    if not effect > 0 or not math.isfinite(sd):
        return float("nan")
    return math.ceil(((1.96 + 0.84) * sd / effect) ** 2)


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a share of k in n (it stays inside [0, 1] and is not empty at 0 or n)."""
    if n == 0:
        return float("nan"), float("nan")
    z, share = 1.96, k / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def exact_mcnemar(only_a: int, only_b: int) -> float:
    """Two-sided exact p of McNemar's test: of the seeds where one row's run learned and the other's did not,
    `only_a` went a's way and `only_b` b's; under no difference each way has even odds."""
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz), for x < (a+1)/(a+b+2)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            out *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return out


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def paired_p(xs: list[float]) -> float:
    """Two-sided p of the paired t test that the mean of the differences `xs` is 0 (NaN under two of them)."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mean, _, sd = interval(xs)
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(n))
    df = n - 1
    return regularized_beta(df / 2, 0.5, df / (df + t * t))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family's p values: each comparison's adjusted p, which is at most alpha only
    where Holm's procedure rejects it at family-wise error alpha (a NaN p stays NaN and counts in the family)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: (math.isnan(ps[i]), ps[i]))
    adjusted = [float("nan")] * m
    running = 0.0
    for rank, i in enumerate(order):
        if math.isnan(ps[i]):
            continue
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def holm_verdict(mean: float, adjusted: float, sign: int, alpha: float = 0.05) -> str:
    """'holds' / 'does not hold' where Holm rejects no difference (adjusted p <= alpha), by the side the mean lies
    on; else 'not decided at this power'."""
    if not adjusted <= alpha:
        return "not decided at this power"
    return "holds" if (mean > 0) == (sign > 0) else "does not hold"


# -- tables -------------------------------------------------------------------------------------------------------
def by_row(results: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in results:
        out.setdefault(r["row"], {})[r["seed"]] = r
    return out


def in_order(rows: dict, order: list[str]) -> list[str]:
    """The labels of `rows` in `order`, then those `order` does not name, in the order they came."""
    return [r for r in order if r in rows] + [r for r in rows if r not in order]


def same_code(x: dict, y: dict) -> bool:
    """Two runs made by the same training code (records.code_fingerprint; a record without one is taken to agree)."""
    return x.get("code") is None or y.get("code") is None or x["code"] == y["code"]


def common_seeds(rows: dict, a: str, b: str) -> list[int]:
    """The seeds both rows ran with the same training code: the pairs a difference may be taken over."""
    both = sorted(set(rows.get(a, {})) & set(rows.get(b, {})))
    return [s for s in both if same_code(rows[a][s], rows[b][s])]


def unpaired_lines(rows: dict, pairs: list[tuple[str, str]]) -> list[str]:
    """One line per pair of rows whose runs of a seed were made by other training code: those seeds are not paired."""
    lines = []
    for a, b in pairs:
        both = sorted(set(rows.get(a, {})) & set(rows.get(b, {})))
        apart = [s for s in both if not same_code(rows[a][s], rows[b][s])]
        if apart:
            lines.append(f"- {a} - {b}: seed(s) {', '.join(map(str, apart))} not paired: their runs were made by "
                         f"other training code ({rows[a][apart[0]]['code']} and {rows[b][apart[0]]['code']})")  # fmt: skip
    return lines


def paired(rows: dict, a: str, b: str, metric: str) -> list[float]:
    """a - b on every seed both rows ran with the same training code."""
    return [rows[a][s][metric] - rows[b][s][metric] for s in common_seeds(rows, a, b)]


def learned(run: dict, gain: float) -> bool:
    """The run gained at least `gain` held-out greedy between its first and last evaluation."""
    return run["greedy"] - run["greedy_first"] >= gain


def learned_pairs(rows: dict, a: str, b: str, gain: float) -> str:
    """Of the seeds both rows ran with the same code: those where only a's run learned, only b's, and McNemar's
    exact p."""
    both = [(learned(rows[a][s], gain), learned(rows[b][s], gain)) for s in common_seeds(rows, a, b)]
    only_a, only_b = sum(x and not y for x, y in both), sum(y and not x for x, y in both)
    return f"{only_a}, {only_b} ({exact_mcnemar(only_a, only_b):.2f})"


def mean_pm(mean: float, half: float, digits: int = 3) -> str:
    """'mean ± half', or the mean alone where there is no interval (one seed)."""
    return f"{mean:.{digits}f} ± {half:.{digits}f}" if math.isfinite(half) else f"{mean:.{digits}f}"


def provenance_lines(results: list[dict]) -> list[str]:
    """Where the runs come from: one line per machine, arithmetic and torch, with the commits of its runs; and a
    warning where the runs come from more than one (a paired difference across machines holds theirs too)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r.get("machine"), r.get("precision"), r.get("torch")), []).append(r)
    lines = []
    for (machine, precision, torch_version), runs in groups.items():
        if machine is None:
            lines.append(f"- {len(runs)} run(s) without a record of their machine, arithmetic or commit")
            continue
        commits = ", ".join(dict.fromkeys(
            r.get("commit", "unknown") + (f" (code {r['code']})" if r.get("code") else "") for r in runs
        ))  # fmt: skip
        lines.append(f"- {len(runs)} run(s) on {machine}, {precision}, torch {torch_version}, at {commits}")
    if len(groups) > 1:
        lines.append("- **these runs come from more than one machine or arithmetic**: one seed computes other "
                     "numbers on each, so a paired difference across them holds the machines' difference too")  # fmt: skip
    return ["Runs:", *lines, ""] if lines else []


def measured_mean(values: list, otherwise: float) -> float:
    """The mean of a run's per-step figure over the steps that measured it (None: not measured), `otherwise` where
    none did. Under bypass (``--proximal rollout``) a step with nothing to train scores no pi_old and logs no
    mismatch: counted as 0, the run's mismatch would read a fraction of what its trained steps measured."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else otherwise


def run_figure(run: dict, key: str) -> float:
    """A run's mismatch or over-cap share, over the steps that measured it: from its step records where it kept them
    (a record written before decide skipped the steps without the figure counted them as 0), else its recorded
    mean."""
    return measured_mean([h.get(key) for h in run.get("history") or []], run[key])


def markdown(
    results: list[dict], order: list[str], baseline: str, effect: float, primary: str, gain: float = 0.25
) -> str:
    rows = by_row(results)
    order = in_order(rows, order)
    lines = [f"Each row: the runs that gained {gain:g} held-out greedy (learned; Wilson's 95% interval), first, since "
             "runs on a real model often part into those that learn and those that do not; then each figure's mean "
             "over the seeds ± the half-width of its 95% interval (Student's t); wall: the mean minutes a run (the "
             "longest):", "",
             f"| row | seeds | learned (+{gain:g} greedy) | " + " | ".join(METRICS.values()) + " | greedy at start | "
             "mismatch | over cap | wall (min) |",
             "| --- | --- | --- | " + " | ".join("---" for _ in METRICS) + " | --- | --- | --- | --- |"]  # fmt: skip
    for label in order:
        runs = list(rows[label].values())
        cells = [mean_pm(*interval([r[m] for r in runs])[:2]) for m in METRICS]
        extra = [mean_pm(*interval([r["greedy_first"] for r in runs])[:2])]
        extra += [mean_pm(*interval([run_figure(r, k) for r in runs])[:2]) for k in ("mismatch", "over_cap")]
        k = sum(learned(r, gain) for r in runs)
        count = "{} of {} ({:.2f}-{:.2f})".format(k, len(runs), *wilson(k, len(runs)))
        wall = interval([r["wall"] / 60 for r in runs])
        lines.append(f"| {label} | {len(runs)} | {count} | " + " | ".join(cells + extra) + f" | {wall[0]:.1f} (max "
                     f"{max(r['wall'] for r in runs) / 60:.1f}) |")  # fmt: skip
    lines += ["", f"Paired differences from **{baseline}** (row minus {baseline}, over the seeds both have; learned, "
              f"first: seeds where only the row's run gained {gain:g}, where only {baseline}'s did, and McNemar's "
              "exact p; then each mean difference ± the half-width of its 95% interval (Student's t); seeds needed: "
              f"for a difference of {effect:g} to be seen with 80% power at the spread measured):", "",
              "| row | seeds | learned: only row, only baseline (p) | " + " | ".join(METRICS.values())
              + " | seeds needed (" + METRICS[primary] + ") |",
              "| --- | --- | --- | " + " | ".join("---" for _ in METRICS) + " | --- |"]  # fmt: skip
    for label in order:
        if label == baseline or baseline not in rows:
            continue
        diffs = {m: paired(rows, label, baseline, m) for m in METRICS}
        cells = [mean_pm(*interval(diffs[m])[:2]) for m in METRICS]
        need = seeds_needed(interval(diffs[primary])[2], effect)
        lines.append(f"| {label} | {len(diffs[primary])} | {learned_pairs(rows, label, baseline, gain)} | "
                     + " | ".join(cells) + f" | {need:g} |")  # fmt: skip
    apart = unpaired_lines(
        rows, [(label, baseline) for label in order if label != baseline and baseline in rows]
    )
    if apart:
        lines += [
            "",
            "Seeds left unpaired (a difference is taken only between runs of one training code):",
            *apart,
        ]
    claims = [(c, a, b, s) for c, a, b, s in CLAIMS if a in rows and b in rows]
    if claims:
        lines += ["", f"The chapter's claims, on {METRICS[primary]}: learned, first: seeds where only a's run gained "
                  f"{gain:g} greedy, only b's, and McNemar's exact p; then a - b over paired seeds (mean ± the "
                  f"half-width of its 95% t interval), the paired t test's p, and the verdict with the family's error "
                  f"held at 5% by Holm's correction over the {len(claims)} claims of this table (the family):", "",
                  "| claim | learned: only a, only b (p) | a - b | seeds | p | Holm p | verdict (Holm) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        tested = [(claim, a, b, sign, paired(rows, a, b, primary)) for claim, a, b, sign in claims]
        adjusted = holm([paired_p(pairs) for *_, pairs in tested])
        for (claim, a, b, sign, pairs), adj in zip(tested, adjusted):
            diff = interval(pairs)
            lines.append(f"| {claim} | {learned_pairs(rows, a, b, gain)} | {mean_pm(*diff[:2])} | {len(pairs)} | "
                         f"{paired_p(pairs):.3f} | {adj:.3f} | {holm_verdict(diff[0], adj, sign)} |")  # fmt: skip
        apart = unpaired_lines(rows, [(a, b) for _, a, b, _ in claims])
        if apart:
            lines += ["", "Seeds left unpaired (other training code):", *apart]
    return "\n".join(lines + kinds_table(rows, order)) + "\n"


def kind_share(evaluation: dict, run: dict, kind: str) -> float:
    """The share of the run's held-out problems of `kind` that `evaluation` passed."""
    of_kind = set(run["kinds"].get(kind, []))
    return len(set(evaluation["solved"]) & of_kind) / len(of_kind) if of_kind else float("nan")


def kinds_table(rows: dict, order: list[str]) -> list[str]:
    """Per row, the share of each kind of held-out problem passed (greedy) at the first and the last evaluation
    (mean and 95% interval over the runs that recorded which problems they passed); none where no run did."""
    recorded = {
        label: [r for r in rows[label].values() if r.get("kinds") and r.get("evals")] for label in order
    }
    sizes: dict[str, int] = {}
    for r in (r for runs in recorded.values() for r in runs):
        sizes.update({k: len(ids) for k, ids in r["kinds"].items()})
    if not sizes:
        return []
    kinds = sorted(sizes)
    fmt = lambda m, h: mean_pm(m, h, 2)  # noqa: E731
    lines = ["", "Held-out evaluation by kind of problem (greedy): the share of each kind passed, first -> "
             "last evaluation, mean ± the half-width of its 95% t interval (the runs that recorded which problems they "
             "passed; the kind's problems in brackets):", "",
             "| row | runs | " + " | ".join(f"{k} ({sizes[k]})" for k in kinds) + " |",
             "| --- | --- | " + " | ".join("---" for _ in kinds) + " |"]  # fmt: skip
    for label, runs in recorded.items():
        if not runs:
            continue
        cells = []
        for k in kinds:
            first = interval([kind_share(r["evals"][0], r, k) for r in runs])
            last = interval([kind_share(r["evals"][-1], r, k) for r in runs])
            cells.append(f"{fmt(*first[:2])} -> {fmt(*last[:2])}")
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def with_through(step: dict) -> dict:
    """A step record with ``through_pos`` and ``through_neg``: per sign of the advantage, the share of the gradient
    a ratio of 1 would give that the ratio and the clip let through (push / adv), where the step logged both
    (records from before them: none); and ``balance``, adv_neg / adv_pos, the negative advantages' weight the step
    carried against the positive ones' (near 1 where nothing drops episodes of one sign: a group's advantages sum
    to 0; a mask that drops negative episodes lowers it)."""

    def over(num, den):
        a, b = step.get(num), step.get(den)
        return a / b if a is not None and b else None

    return {**step, "through_pos": over("push_pos", "adv_pos"), "through_neg": over("push_neg", "adv_neg"),
            "balance": over("adv_neg", "adv_pos")}  # fmt: skip


def stretches(run: dict) -> list[dict]:
    """The run between each two of its evaluations: the change of its held-out greedy pass rate, and the mean
    mismatch, gradient norm, clipped shares, the gradient let through by sign and the balance of the signs
    (``with_through``), over the steps of the stretch that trained (from its step records); none for a run that kept
    no step records."""
    history, evals = run.get("history") or [], run.get("evals") or []
    out = []
    for a, b in zip(evals, evals[1:]):
        steps = [
            with_through(h) for h in history if a["step"] <= h["step"] < b["step"] and not h.get("skipped")
        ]
        if not steps:
            continue
        keys = ("mismatch", "grad_norm", "clip_pos", "clip_neg", "through_pos", "through_neg", "balance")
        out.append({"steps": (a["step"], b["step"]), "change": b["pass_rate"] - a["pass_rate"],
                    **{k: measured_mean([h.get(k) for h in steps], math.nan) for k in keys}})  # fmt: skip
    return out


def share(x: float) -> str:
    """A share as a percentage; "-" where the records did not measure it."""
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def ratio(x: float) -> str:
    """A ratio to two places; "-" where the records did not measure it."""
    return "-" if math.isnan(x) else f"{x:.2f}"


def stretches_table(rows: dict, label: str) -> list[str]:
    """One row's runs stretch by stretch (between two held-out evaluations): the held-out greedy change beside the
    mean mismatch, gradient norm, clipped shares, gradient let through by sign and the negative advantages' weight
    against the positive ones' (``stretches``) of the same steps, then the stretches after each run's first by
    whether the held-out rate fell, stayed or rose, with the range of their mismatch. Empty where no run kept step
    records."""
    runs = {seed: stretches(run) for seed, run in sorted(rows.get(label, {}).items())}
    if not any(runs.values()):
        return []
    lines = ["", f"**{label}**, run by run between two held-out evaluations (the mean over the steps that trained):",
             "", "| seed | steps | held-out greedy change | mismatch | gradient norm | clip removed, A > 0 / A < 0 "
             "| let through, A > 0 / A < 0 | weight of A < 0 against A > 0 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for seed, parts in runs.items():
        lines += [f"| {seed} | {p['steps'][0]}-{p['steps'][1] - 1} | {p['change']:+.3f} | {p['mismatch']:.2f} | "
                  f"{p['grad_norm']:.2f} | {share(p['clip_pos'])} / {share(p['clip_neg'])} | "
                  f"{share(p['through_pos'])} / {share(p['through_neg'])} | {ratio(p['balance'])} |"
                  for p in parts]  # fmt: skip
    later = [p for parts in runs.values() for p in parts[1:]]
    lines.append("")
    for name, keep in (("fell", lambda c: c < 0), ("stayed", lambda c: c == 0), ("rose", lambda c: c > 0)):
        picked = [p["mismatch"] for p in later if keep(round(p["change"], 9))]
        span = (
            f"{min(picked):.2f}-{max(picked):.2f}" if len(picked) > 1 else "".join(f"{m:.2f}" for m in picked)
        )
        span = f", mismatch {span}" if span else ""
        lines.append(
            f"- after the first stretch, the held-out rate {name} over {len(picked)} of {len(later)}{span}"
        )
    return lines
