"""The staleness experiment: train from the RL base with a behavior policy k updates old, with and without
correction, and with an FP8-rounded sampler; mean and standard error over seeds.

    python -m lrl.experiments.staleness                       # 9 rows x 5 seeds at lr 5e-4
    python -m lrl.experiments.staleness --lr 5e-4 2e-3 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

STALE_ROWS = [
    ("lagged", 0, "none"),
    ("lagged", 2, "none"),
    ("lagged", 4, "none"),
    ("lagged", 8, "none"),
    ("lagged", 4, "tis"),
    ("lagged", 8, "tis"),
    ("lagged", 8, "mis"),
]
FP8_ROWS = [("fp8", 0, "none"), ("fp8", 0, "tis")]
METRICS = ("w0", "w1", "w2", "w3", "mismatch", "over_cap", "clip_frac", "heldout", "reads")


def one_run(args: tuple) -> dict:
    """Train one (sampler, lag, correction, lr, seed) cell -> its summary numbers."""
    sampler, lag, correction, lr, seed, steps, eval_episodes, level = args
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from lrl.config import Config
    from lrl.run import build_run, fit

    cfg = Config(
        sampler=sampler,
        lag=lag,
        correction=correction,
        level=level,
        lr=lr,
        seed=seed,
        max_steps=steps,
        eval_every=steps,
        eval_episodes=eval_episodes,
        threads=1,
        progress=False,
    )
    run = build_run(cfg, logger=False)
    result = fit(run)
    hist = run.module.history
    mean = lambda key: sum(h[key] for h in hist) / len(hist)  # noqa: E731
    window = max(len(hist) // 4, 1)
    out = {
        f"w{i}": sum(h["train/reward"] for h in hist[i * window : (i + 1) * window]) / window
        for i in range(4)
    }
    out.update(
        mismatch=mean("mismatch/abs_mean"),
        over_cap=mean("mismatch/over_cap"),
        clip_frac=mean("train/clip_frac"),
        heldout=result["pass_rate"],
        reads=result["reads"],
    )
    return {"sampler": sampler, "lag": lag, "correction": correction, "lr": lr, "seed": seed, **out}


def summarize(results: list[dict], key: tuple) -> dict[str, tuple[float, float]]:
    """Mean and standard error over seeds of each metric for one row."""
    cells = [r for r in results if (r["sampler"], r["lag"], r["correction"], r["lr"]) == key]
    out = {}
    for m in METRICS:
        xs = [c[m] for c in cells]
        mu = sum(xs) / len(xs)
        se = (
            math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) / len(xs))
            if len(xs) > 1
            else float("nan")
        )
        out[m] = (mu, se)
    return out


def markdown(results: list[dict], rows: list[tuple], lrs: list[float], n_seeds: int, steps: int) -> str:
    """The table as markdown: one line per (lr, row), mean ± standard error over seeds."""
    lines = [
        f"Staleness experiment: {steps} steps from the RL base, {n_seeds} seeds, mean ± standard error.",
        "",
        "| lr | sampler | lag | correction | reward by quarter | mismatch | over cap | clip frac | "
        "held-out | reads |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lr in lrs:
        for sampler, lag, corr in rows:
            s = summarize(results, (sampler, lag, corr, lr))
            window = " ".join(f"{s[f'w{i}'][0]:.2f}" for i in range(4))
            lines.append(
                f"| {lr:g} | {sampler} | {lag} | {corr} | {window} | {s['mismatch'][0]:.3f} ± {s['mismatch'][1]:.3f} | "
                f"{s['over_cap'][0]:.3f} | {s['clip_frac'][0]:.4f} | {s['heldout'][0]:.3f} ± {s['heldout'][1]:.3f} | "
                f"{s['reads'][0]:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], lrs: list[float], path: Path) -> None:
    """Held-out pass rate and mean training reward against lag, one line per (correction, lr)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for lr in lrs:
        for corr, marker in (("none", "o"), ("tis", "s"), ("mis", "^")):
            lags = sorted(
                {
                    r["lag"]
                    for r in results
                    if r["sampler"] == "lagged" and r["correction"] == corr and r["lr"] == lr
                }
            )
            if not lags:
                continue
            for ax, metric in zip(axes, ("heldout", "train")):
                ys = []
                es = []
                for lag in lags:
                    key = ("lagged", lag, corr, lr)
                    s = summarize(results, key)
                    if metric == "train":
                        vals = [
                            sum(r[f"w{i}"] for i in range(4)) / 4
                            for r in results
                            if (r["sampler"], r["lag"], r["correction"], r["lr"]) == key
                        ]
                        mu = sum(vals) / len(vals)
                        se = math.sqrt(sum((v - mu) ** 2 for v in vals) / max(len(vals) - 1, 1) / len(vals))
                        ys.append(mu)
                        es.append(se)
                    else:
                        ys.append(s["heldout"][0])
                        es.append(s["heldout"][1])
                ax.errorbar(lags, ys, yerr=es, marker=marker, capsize=3, label=f"{corr}, lr {lr:g}")
    axes[0].set(
        xlabel="lag (updates the sampler is behind)",
        ylabel="held-out pass rate",
        ylim=(0, 1.05),
        title="Held-out pass rate after training",
    )
    axes[1].set(
        xlabel="lag (updates the sampler is behind)",
        ylabel="mean training reward",
        ylim=(0, 1.05),
        title="Training reward, mean over all steps",
    )
    for ax in axes:
        ax.axhline(0.2, color="grey", lw=0.8, ls=":", label="blind guess")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per row (default 5)")
    parser.add_argument(
        "--lr",
        type=float,
        nargs="+",
        default=[5e-4],
        help="learning rates to sweep (default 5e-4, the package default)",
    )
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    parser.add_argument(
        "--eval-episodes", type=int, default=16, help="held-out episodes per task (default 16)"
    )
    parser.add_argument("--no-fp8", action="store_true", help="skip the two FP8 rows")
    parser.add_argument(
        "--level",
        default="token",
        choices=("token", "sequence", "geometric"),
        help="ratio the TIS/MIS rows correct with (default token)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (1 thread each)"
    )
    parser.add_argument(
        "--out", default="results/staleness", help="directory for table.md, results.json, plot"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 4 or args.jobs < 1 or any(lr <= 0 for lr in args.lr):
        parser.error("--seeds and --jobs must be >= 1, --steps >= 4, every --lr > 0")
    rows = STALE_ROWS + ([] if args.no_fp8 else FP8_ROWS)
    cells = [
        (s, lag, c, lr, seed, args.steps, args.eval_episodes, args.level)
        for lr in args.lr
        for s, lag, c in rows
        for seed in range(args.seeds)
    ]
    from lrl.envs.tinyagent import build_tokenizer, make_tasks
    from lrl.envs.tinyagent.base import make_rl_base

    make_rl_base(build_tokenizer(make_tasks("all")), verbose=True)  # build the cache once, before the workers
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    results = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, r in enumerate(pool.map(one_run, cells), 1):
            results.append(r)
            print(
                f"[{i}/{len(cells)}] {r['sampler']} lag {r['lag']} {r['correction']} lr {r['lr']:g} seed {r['seed']}: "
                f"held-out {r['heldout']:.3f} mismatch {r['mismatch']:.3f} ({time.time() - start:.0f} s)",
                flush=True,
            )
    table = markdown(results, rows, args.lr, args.seeds, args.steps)
    if args.level != "token":
        table = table.replace(
            "mean ± standard error.", f"mean ± standard error; corrections at {args.level} level.", 1
        )
    wall = time.time() - start
    table += f"\nWall time: {wall:.0f} s for {len(cells)} runs ({args.jobs} in parallel).\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.lr, out / "staleness.png")
    print(table)
    print(f"wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'staleness.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
