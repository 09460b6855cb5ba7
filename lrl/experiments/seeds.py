"""The default run over many seeds: per-seed held-out pass rate, reads and invalid actions, mean ± standard
error and minimum, and a figure of every seed's held-out curve.

    python -m lrl.experiments.seeds --seeds 10                    # python train.py, seeds 0 to 9
    python -m lrl.experiments.seeds --seeds 10 -- --env review    # any train.py flags after --

A result measured on one seed is an anecdote: the same seed follows another trajectory on another CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from lrl.experiments.stats import mean_se

LATE = 20  # steps after which a healthy run no longer produces malformed actions at a high rate


def one_seed(args: tuple) -> dict:
    """Train one seed with the given train.py flags -> its summary and curves."""
    seed, flags, out = args
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from lrl.arguments import parse_args
    from lrl.run import build_run, fit

    cfg = parse_args(
        [
            *flags,
            "--seed",
            str(seed),
            "--progress",
            "false",
            "--log-dir",
            str(Path(out) / "runs"),
            "--run-name",
            f"seed{seed}",
        ]
    )
    start = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = build_run(cfg)
        result = fit(run)
    ours = [str(w.message) for w in caught if is_ours(w.filename)]
    history = run.module.history
    late = [h["train/invalid"] for h in history if h["step"] >= LATE]
    return {
        "seed": seed,
        "pass_rate": result["pass_rate"],
        "invalid": result["invalid"],
        **{m: result[m] for m in run.spec.metrics},
        "max_late_train_invalid": max(late) if late else float("nan"),
        "warnings": len(ours),
        "warning_texts": ours,
        "heldout": [(e["step"], e["pass_rate"]) for e in run.module.evals],
        "train_reward": [h["train/reward"] for h in history],
        "history": history,
        "wall_s": time.time() - start,
        "log_dir": run.trainer.logger.log_dir if run.trainer.logger else None,
    }


def is_ours(filename: str) -> bool:
    """A warning raised by the package's own code (lrl, callbacks, samplers), not by a library it uses."""
    root = Path(__file__).resolve().parents[2]
    try:
        part = Path(filename).resolve().relative_to(root).parts[0]
    except (ValueError, IndexError):
        return False
    return part in ("lrl", "callbacks", "samplers", "train.py")


def cell(result: dict, column: str) -> str:
    """A table cell: a count as an integer, a rate to three decimals."""
    value = result.get(column, 0)
    return str(value) if column == "warnings" else f"{value:.3f}"


def markdown(results: list[dict], flags: list[str], metrics: list[str], machine: str) -> str:
    """Per-seed rows, then mean ± standard error and the minimum of each column."""
    cols = ["pass_rate", *metrics, "invalid", "max_late_train_invalid", "warnings"]
    head = [
        "seed",
        "held-out pass rate",
        *metrics,
        "invalid",
        f"max train/invalid after step {LATE}",
        "warnings",
    ]
    lines = [
        f"`python train.py {' '.join(flags)}` over {len(results)} seeds, on {machine}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in sorted(results, key=lambda r: r["seed"]):
        lines.append(f"| {r['seed']} | " + " | ".join(cell(r, c) for c in cols) + " |")
    stats = {c: mean_se([r.get(c, 0) for r in results]) for c in cols}
    lines.append("| mean ± SE | " + " | ".join(f"{stats[c][0]:.3f} ± {stats[c][1]:.3f}" for c in cols) + " |")
    lines.append("| minimum | " + " | ".join(f"{min(r.get(c, 0) for r in results):.3f}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path, title: str) -> None:
    """Every seed's held-out pass rate against the training step, and the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r in sorted(results, key=lambda r: r["seed"]):
        steps, values = zip(*r["heldout"])
        ax.plot(steps, values, marker="o", ms=3, lw=1, alpha=0.7, label=f"seed {r['seed']}")
    steps = [s for s, _ in results[0]["heldout"]]
    if all([s for s, _ in r["heldout"]] == steps for r in results):
        mean = [sum(r["heldout"][i][1] for r in results) / len(results) for i in range(len(steps))]
        ax.plot(steps, mean, color="black", lw=2.5, label="mean")
    ax.set(xlabel="training step (policy version)", ylabel="held-out pass rate", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} x {cpu}, torch threads 1 per run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (1 thread each)"
    )
    parser.add_argument(
        "--out", default="results/seeds", help="folder for table.md, results.json, heldout.png"
    )
    parser.add_argument("flags", nargs="*", help="train.py flags, after --")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    from lrl.arguments import parse_args
    from lrl.config import ConfigError
    from lrl.envs import make_env

    try:
        cfg = parse_args([*args.flags, "--threads", "1"])
    except ConfigError as err:
        parser.error(str(err))
    spec = make_env(cfg)
    if spec.warm_start is not None:
        spec.warm_start()  # build the cache once, before the workers
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags = [*args.flags, "--threads", "1"]
    cells = [(s, flags, str(out)) for s in range(args.first_seed, args.first_seed + args.seeds)]
    start, results = time.time(), []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, r in enumerate(pool.map(one_seed, cells), 1):
            results.append(r)
            print(
                f"[{i}/{len(cells)}] seed {r['seed']}: held-out {r['pass_rate']:.3f} invalid {r['invalid']:.3f} "
                f"max late train/invalid {r['max_late_train_invalid']:.3f}, {r['warnings']} warnings "
                f"({time.time() - start:.0f} s)",
                flush=True,
            )
            for text in r["warning_texts"]:
                print(f"    seed {r['seed']}: {text}", flush=True)
    table = markdown(results, args.flags, list(spec.metrics), machine())
    table += f"\nWall time: {time.time() - start:.0f} s for {len(cells)} runs ({args.jobs} in parallel).\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "heldout.png", f"python train.py {' '.join(args.flags)}".strip())
    print(table)
    print(f"wrote {out / 'table.md'}, {out / 'results.json'}, {out / 'heldout.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
