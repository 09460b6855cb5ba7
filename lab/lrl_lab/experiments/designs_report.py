"""Tables, figure and projection of the five-designs experiment (:mod:`lrl_lab.experiments.designs`)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from lrl.pipeline.policies import DEFAULT_POLICY
from lrl_lab.experiments.labels import shown
from lrl_lab.experiments.workload import LATENCY

COLUMNS = [
    ("episodes/s", "episodes_per_s", "{:.2f}"),
    ("slot util", "slot_util", "{:.2f}"),
    ("staleness mean", "staleness_mean", "{:.2f}"),
    ("staleness max", "staleness_max", "{:d}"),
    ("trained episode (s)", "trained_duration", "{:.2f}"),
]


def calibration_spread(row: dict) -> str:
    """The lowest and highest episodes/s the calibration's runs predict, each alone (over every seed's calibration),
    and whether the measured median lies between them; "-" without a calibration."""
    alone = [v for x in row["per_repeat"] for v in x["predicted"].get("per_calibration_run", [])]
    if not alone:
        return "-"
    lo, hi = min(alone), max(alone)
    holds = lo <= row["measured_episodes_per_s"] <= hi
    return f"{lo:.1f}-{hi:.1f}" + (" (holds it)" if holds else "")


def markdown(rows: list[dict]) -> str:
    """One line per design: measured / predicted for each quantity, the TV distance, the ratio to sync."""
    sync = next((r["measured_episodes_per_s"] for r in rows if r["design"] == "synchronous"), None)
    head = ["design", *[c[0] + " (meas. / pred.)" for c in COLUMNS], "TV", "x sync", "error"]
    head += ["pred. per calibration run", "dropped"]
    head += ["in-run duration model error", "policy", "wasted tokens (meas. / pred.)", "aborted"]
    head.append("held-out pass at the end (mean ± SE)")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["design"]]
        for _, key, fmt in COLUMNS:
            cells.append(f"{fmt.format(r['measured_' + key])} / {fmt.format(r['predicted_' + key])}")
        cells.append(f"{r['staleness_tv']:.3f}")
        cells.append(f"{r['measured_episodes_per_s'] / sync:.2f}" if sync else "")
        error = r["predicted_episodes_per_s"] / r["measured_episodes_per_s"] - 1
        cells.append(f"{100 * error:+.1f}%")
        cells.append(calibration_spread(r))
        cells.append(f"{r['measured_dropped']} / {r['predicted_dropped']}")
        cells.append(f"{100 * (r['inrun_episodes_per_s'] / r['measured_episodes_per_s'] - 1):+.1f}%")
        cells.append(shown(r.get("stale_policy", DEFAULT_POLICY)))
        wasted = r.get("predicted_wasted_share", math.nan)
        guess = "-" if wasted != wasted else f"{100 * wasted:.1f}%"  # the duration model counts no tokens
        cells.append(f"{100 * r.get('measured_wasted_share', 0.0):.1f}% / {guess}")
        cells.append(f"{r.get('measured_aborted', 0)} / {r.get('predicted_aborted', 0)}")
        mu, se = r.get("measured_pass_rate", math.nan), r.get("measured_pass_rate_se", math.nan)
        cells.append("-" if mu != mu else f"{mu:.2f} ± {se:.2f} ({r['pass_rate_repeats']})")
        out.append("| " + " | ".join(cells) + " |")
    launched = [r["measured_launched_duration"] for r in rows]
    out.append("")
    out.append(
        f"Median of {rows[0]['repeats']} repeats per design; predicted from {rows[0]['predicted_from']} (with a "
        "calibration: the mean over its runs, beside the lowest and highest each predicts alone, and whether the "
        "measured median lies between); "
        "staleness max is the largest over repeats. "
        f"Mean duration of every episode that finished (launched): {min(launched):.2f}-{max(launched):.2f} s."
    )
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["design"] for r in rows]
    x = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    w = 0.38
    left.bar([i - w / 2 for i in x], [r["measured_episodes_per_s"] for r in rows], w, label="measured")
    left.bar([i + w / 2 for i in x], [r["predicted_episodes_per_s"] for r in rows], w, label="predicted")
    left.set_ylabel("trained episodes per second")
    right.bar([i - w / 2 for i in x], [r["measured_staleness_mean"] for r in rows], w, label="mean, measured")
    right.bar(
        [i + w / 2 for i in x], [r["predicted_staleness_mean"] for r in rows], w, label="mean, predicted"
    )
    right.plot(list(x), [r["measured_staleness_max"] for r in rows], "k^", label="max, measured")
    right.plot(list(x), [r["predicted_staleness_max"] for r in rows], "rv", label="max, predicted")
    right.set_ylabel("token staleness (versions)")
    for ax in (left, right):
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Five pipeline designs on TinyAgent with slow tools: measured against the calibrated simulator"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def projection(runs: list[dict]) -> str:
    """The designs at more slots and workers, from the pooled measured inputs: where the trainer is the limit.

    The batch grows with the slots (a batch a step per 64 slots, as measured); the trainer's step time is taken
    to grow in proportion to its batch, so the trainer can take at most 64 / t64 episodes a second whatever the
    size, while generation capacity grows with the slots."""
    from lrl_lab.experiments.workload import DESIGNS, GROUP, STEPS, durations, switch_seconds, trainer_seconds
    from lrl_lab.sim.board import simulate_board

    pool = [d for r in runs if not DESIGNS[r["design"]].get("sync") for d in durations(r["history"])]
    async_runs = [r for r in runs if not DESIGNS[r["design"]].get("sync")]
    if not async_runs:
        return "(no asynchronous run: no projection)\n"
    t64 = statistics.median([trainer_seconds(r["history"], False) for r in async_runs])
    switch = statistics.median([switch_seconds(r["history"]) for r in async_runs])
    mean_d = statistics.fmean(pool)
    lines = [
        f"Projection from the measured inputs ({len(pool)} episode durations, mean {mean_d:.2f} s; trainer "
        f"{t64:.3f} s per 64 episodes, so at most {64 / t64:.0f} episodes/s; weight load {1000 * switch:.1f} ms):",
        "",
        "| slots per worker x workers | batch | generation capacity (episodes/s) | "
        + " | ".join(DESIGNS)
        + " |",
        "|" + "---|" * (3 + len(DESIGNS)),
    ]
    for slots, workers in [(64, 1), (256, 1), (1024, 1), (64, 4), (64, 16), (1024, 4)]:
        batch = slots * workers
        groups = batch // GROUP
        cells = []
        for spec in DESIGNS.values():
            sim = simulate_board(
                pool,
                slots,
                GROUP,
                groups,
                t64 * batch / 64,
                switch,
                spec["eta"],
                spec["interrupt"],
                STEPS,
                workers=workers,
                sync_before=bool(spec.get("sync")),
            )
            busy = sum(sim["step_trained"]) / batch * t64 * batch / 64 / sim["time"]
            cells.append(f"{sim['episodes_per_s']:.0f}" + (" (trainer-bound)" if busy > 0.9 else ""))
        lines.append(
            f"| {slots} x {workers} | {batch} | {slots * workers / mean_d:.0f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def tool_time_plot(times: list[float], path: Path) -> None:
    """Histogram of the real tool calls' times beside as many draws of the slow-tool workload's lognormal."""
    import math
    import random

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    median_s, sigma = (float(x) for x in LATENCY.split(":")[1:])
    rng = random.Random(0)
    drawn = [median_s * math.exp(sigma * rng.gauss(0, 1)) for _ in times]
    bins = [10 ** (k / 10) for k in range(-20, 11)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.hist(times, bins=bins, alpha=0.75, label=f"codefix: {len(times)} sandboxed test runs, measured")
    ax.hist(drawn, bins=bins, alpha=0.5, label=f"{LATENCY}: as many draws")
    ax.set_xscale("log")
    ax.set_xlabel("tool call (s)")
    ax.set_ylabel("calls")
    ax.legend(fontsize=8)
    ax.set_title("Real tool times against the drawn lognormal", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tool_time_table(times: list[float]) -> str:
    """The real tool calls' time distribution beside the drawn lognormal of the slow-tool workload."""
    import math

    ordered = sorted(times)
    q = lambda p: ordered[min(int(p * len(ordered)), len(ordered) - 1)]  # noqa: E731
    z = {0.5: 0.0, 0.95: 1.6449, 0.99: 2.3263}
    median, sigma = (float(x) for x in LATENCY.split(":")[1:])
    rows = ["| tool time (s) | p50 | p95 | p99 | p99 / p50 | mean |", "|---|---|---|---|---|---|"]
    rows.append(
        f"| codefix, measured ({len(times)} sandboxed runs) | {q(0.5):.3f} | {q(0.95):.3f} | {q(0.99):.3f} | "
        f"{q(0.99) / q(0.5):.1f} | {statistics.fmean(times):.3f} |"
    )
    drawn = {p: median * math.exp(sigma * z[p]) for p in z}
    rows.append(
        f"| {LATENCY}, drawn | {drawn[0.5]:.3f} | {drawn[0.95]:.3f} | {drawn[0.99]:.3f} | "
        f"{drawn[0.99] / drawn[0.5]:.1f} | {median * math.exp(sigma**2 / 2):.3f} |"
    )
    return "\n".join(rows) + "\n"
