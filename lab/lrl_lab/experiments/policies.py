"""The staleness policies compared (``python -m lrl_lab.experiments.pipeline --compare-policies``): the runs of
``--designs chapter --stale-policy P`` for every policy, read from their folders, as one table and one figure of
throughput against waste, measured and predicted.

Each policy's runs are in ``results/designs/hard`` (``drop``, with the synchronous runs the ratios are taken
against) and ``results/designs/hard-<policy>`` (``codefix-hard`` and ``codefix-hard-<policy>`` with ``--env codefix``,
written to ``policies-codefix.md``; ``hard-frozen[-<policy>]`` with ``--freeze-policy true``, written to
``policies-frozen.md``); ``ordered`` with a patience of S seconds in ``hard-ordered-wS``; a design a folder lacks is
left out. The prediction beside each
measurement is the simulator's for that run, from the run's own episode times (the duration model, which counts
an episode as one unit of work spread over its time); the waste measured is in action tokens.
"""

from __future__ import annotations

import math
from pathlib import Path

from lrl.pipeline.policies import DEFAULT_POLICY, STALE_POLICIES, takes_patience
from lrl_lab.experiments.designs import DESIGNS, load_runs, measured, summarise, waste_sources
from lrl_lab.experiments.designs_predict import calibration_of, predicted
from lrl_lab.experiments.designs_report import calibration_spread
from lrl_lab.experiments.labels import env_prefix, run_folder, shown
from lrl_lab.experiments.stats import median

ROOT = Path("results/designs")


def folder(policy: str, root: Path = ROOT, env: str = "tinyagent", frozen: bool = False) -> Path:
    """Where `--designs chapter --stale-policy P` wrote its runs (64 slots, the hard bound)."""
    return root / run_folder(env, True, frozen, policy=policy)


def labels(root: Path = ROOT, env: str = "tinyagent", frozen: bool = False) -> list[str]:
    """Every policy, in option order, each ``ordered`` with a patience that has a folder after ``ordered``
    (``...-ordered-w1.2``: ``ordered@1.2``; ``...-ordered-w1x``: ``ordered@1x``, in trainer steps), by patience."""
    out = []
    for policy in STALE_POLICIES:
        out.append(policy)
        if takes_patience(policy):
            base = folder(policy, root, env, frozen).name + "-w"
            seconds, steps = [], []
            for path in root.glob(base + "*"):
                tail = path.name[len(base) :]
                try:
                    (steps if tail.endswith("x") else seconds).append(float(tail.removesuffix("x")))
                except ValueError:
                    continue  # not a patience folder
            out += [f"ordered@{w:g}" for w in sorted(seconds)] + [f"ordered@{k:g}x" for k in sorted(steps)]
    return out


def compare(
    root: Path = ROOT,
    design: str = "async eta=1, partial",
    cal=None,
    env: str = "tinyagent",
    frozen: bool = False,
) -> list[dict]:
    """One row per policy with runs of `design`: its summary (lrl_lab.experiments.designs.summarise; predicted from
    the calibration `cal` by the load model when one is given, else from each run itself) and its ratio to the
    synchronous runs of the drop folder. `cal` may be a function of a run's seed (its calibration);
    `frozen`: the runs of ``--freeze-policy true``."""
    home = folder(DEFAULT_POLICY, root, env, frozen)
    sync_runs = load_runs(home, ["synchronous"])
    if not sync_runs:
        raise SystemExit(f"{home}: no synchronous runs to compare with (run --designs chapter)")
    sync = summarise(sync_runs, True, cal)[0]
    sync_by_seed = {r["repeat"]: x for r, x in zip(sync_runs, sync["per_repeat"])}
    drop_by_seed = {r["repeat"]: r for r in load_runs(home, [design])}
    rows = []
    for policy in labels(root, env, frozen):
        runs = load_runs(folder(policy, root, env, frozen), [design])
        if not runs:
            continue
        row = summarise(runs, True, cal, policy)[0]
        pairs = [
            (x, sync_by_seed[r["repeat"]])
            for r, x in zip(runs, row["per_repeat"])
            if r["repeat"] in sync_by_seed
        ]
        if not pairs:
            raise SystemExit(
                f"{folder(policy, root, env, frozen)}: no seed in common with the synchronous runs"
            )
        # each run against the synchronous run of its own seed (the seeds' workloads differ: a policy that learns
        # to call more tools makes longer episodes), then the median over the seeds
        row["x_sync_per_seed"] = [
            a["measured"]["episodes_per_s"] / b["measured"]["episodes_per_s"] for a, b in pairs
        ]
        row["x_sync"] = median(row["x_sync_per_seed"])
        row["predicted_x_sync"] = median(
            [a["predicted"]["episodes_per_s"] / b["predicted"]["episodes_per_s"] for a, b in pairs]
        )
        # the planner's question: the policy predicted from the drop run of the same seed (its episode times, which
        # no policy has censored), against the policy's own run
        cross = [
            predicted(drop_by_seed[r["repeat"]], True, policy)["episodes_per_s"]
            / measured(r)["episodes_per_s"]
            - 1
            for r in runs
            if r["repeat"] in drop_by_seed
        ]
        row["from_drop_errors"] = cross
        row["from_drop_error"] = median(cross) if cross else math.nan
        row["sync_episodes_per_s"] = sync["measured_episodes_per_s"]
        row["sync_pass_rate"] = sync["measured_pass_rate"]
        row["waste_sources"] = [waste_sources(r["history"]) for r in runs]
        rows.append(row)
    if not rows:
        raise SystemExit(f"no runs of {design!r} under {root}: run --designs chapter --stale-policy P first")
    return rows


def table(rows: list[dict]) -> str:
    head = [
        "policy",
        "seeds",
        "episodes/s (meas. / pred.)",
        "x sync, per seed (median: meas. / pred.)",
        "error",
        "pred. per calibration run",
        "error (from drop's run)",
        "wasted tokens (meas. / pred.)",
        "dropped",
        "aborted",
        "cut (meas. / pred.)",
        "masked tokens",
        "staleness mean / max",
        "held-out pass at the end (mean ± SE)",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        err = r["predicted_episodes_per_s"] / r["measured_episodes_per_s"] - 1
        masked = sum(x["measured"]["masked_tokens"] for x in r["per_repeat"])
        cut = sum(x["measured"]["cut"] for x in r["per_repeat"])
        decoded = sum(x["measured"]["decoded_tokens"] for x in r["per_repeat"])
        pass_rate = r["measured_pass_rate"]
        cells = [
            shown(r["stale_policy"]),
            str(r["repeats"]),
            f"{r['measured_episodes_per_s']:.2f} / {r['predicted_episodes_per_s']:.2f}",
            f"{', '.join(f'{x:.2f}' for x in r['x_sync_per_seed'])} ({r['x_sync']:.2f} / {r['predicted_x_sync']:.2f})",
            f"{100 * err:+.1f}%",
            calibration_spread(r),
            "-" if math.isnan(r["from_drop_error"]) else f"{100 * r['from_drop_error']:+.1f}%",
            f"{100 * r['measured_wasted_share']:.1f}% / {100 * r['predicted_wasted_share']:.1f}%",
            f"{r['measured_dropped']} / {r['predicted_dropped']}",
            f"{r['measured_aborted']} / {r['predicted_aborted']}",
            f"{cut} / {r['predicted_cut']}",
            f"{masked:.0f} of {decoded:.0f}",
            f"{r['measured_staleness_mean']:.2f} / {r['measured_staleness_max']}",
            "-" if pass_rate != pass_rate else
            f"{pass_rate:.2f} ± {r['measured_pass_rate_se']:.2f} ({r['pass_rate_repeats']})",
        ]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    first = rows[0]
    sync_pass = first["sync_pass_rate"]
    out.append("")
    out.append(
        f"{first['design']}, median over the seeds a policy (pass rate: mean over the seeds); "
        f"x sync: each run against the synchronous run of its seed; synchronous {first['sync_episodes_per_s']:.2f} "
        "episodes/s (median)"
        + ("" if sync_pass != sync_pass else f", held-out pass {sync_pass:.2f}")
        + f'. Predicted ("error"): from {first["predicted_from"]} (the mean over its runs; "pred. per calibration '
        'run": the lowest and highest of them, "holds it" where the measured median lies between: a miss that '
        "the calibration's own spread covers); also by the duration model from the drop "
        "run of the same seed (the median error over the seeds: what a user running drop would be told); wasted: "
        "share of the action tokens decoded that were never trained (measured), of the episodes' work (predicted)."
    )
    return "\n".join(out) + "\n"


def sources_table(rows: list[dict]) -> str:
    """Where each policy's waste could come from (lrl_lab.experiments.designs.waste_sources), the median over seeds."""
    head = [
        "policy",
        "trainer period P (s)",
        "finished episodes longer than P",
        "longer than 2P",
        "tokens in groups whose slowest episode is longer than 2P",
        "wasted tokens",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        src = r.get("waste_sources") or []

        def med(key: str, src=src) -> float:
            return median([x[key] for x in src]) if src else math.nan

        cells = [
            shown(r["stale_policy"]),
            f"{med('period_s'):.2f}",
            f"{100 * med('over_1p'):.1f}%",
            f"{100 * med('over_2p'):.1f}%",
            f"{100 * med('group_over_2p_tokens'):.1f}%",
            f"{100 * r['measured_wasted_share']:.1f}%",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        "Median over the seeds; P: the mean seconds between step ends. Episodes stopped in flight (abort, cut) "
        "never finish and are not counted among the finished."
    )
    return "\n".join(out) + "\n"


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, r in enumerate(rows):
        color = f"C{i}"
        x, y = 100 * r["measured_wasted_share"], r["x_sync"]
        px, py = 100 * r["predicted_wasted_share"], r["predicted_x_sync"]
        ax.plot([x], [y], "o", color=color, markersize=8, label=f"{shown(r['stale_policy'])} (measured)")
        if math.isfinite(px) and math.isfinite(py):
            ax.plot([px], [py], "o", color=color, markersize=8, markerfacecolor="none")
            ax.plot([x, px], [y, py], "-", color=color, linewidth=0.8, alpha=0.6)
        ax.annotate(shown(r["stale_policy"]), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=9)
    ax.set_xlim(left=0)
    ax.axhline(2.5, color="grey", linestyle=":", linewidth=1)
    ax.axvline(5.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("wasted: decoded, never trained (% of decoded)")
    ax.set_ylabel("trained episodes per second, x synchronous")
    source = rows[0]["predicted_from"]
    ax.set_title(
        f"{rows[0]['design']}: staleness policies (filled: measured, hollow: predicted from {source})",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(
    root: Path = ROOT,
    design: str = "async eta=1, partial",
    predict_from: str | None = None,
    env: str = "tinyagent",
    frozen: bool = False,
) -> int:
    if design not in DESIGNS:
        raise SystemExit(f"unknown design {design!r}")
    rows = compare(root, design, calibration_of(predict_from), env, frozen)
    text = table(rows) + "\n" + sources_table(rows)
    print(text)
    name = f"policies-{env}" if env_prefix(env) else "policies"
    name += "-frozen" if frozen else ""
    (root / f"{name}.md").write_text(text)
    figure(rows, root / f"{name}.png")
    print(f"wrote {root / (name + '.md')}, {root / (name + '.png')}")
    return 0
