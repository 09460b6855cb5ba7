"""The default run over many seeds: per-seed held-out pass rate, reads and invalid actions, mean ± standard
error and minimum, and a figure of every seed's held-out curve.

    python -m lrl_lab.experiments.seeds --seeds 10                    # python train.py, seeds 0 to 9
    python -m lrl_lab.experiments.seeds --seeds 10 -- --env review    # any train.py flags after --
    python -m lrl_lab.experiments.seeds --seeds 20 --machines all     # and under every emulated machine

A result measured on one seed is an anecdote: the same seed follows another trajectory on another CPU. The float
rounding of another CPU cannot be had here, but its effect can: a trajectory that is fragile amplifies the
smallest difference. ``--machines`` runs every seed again on emulated machines (:data:`MACHINES`): the starting
weights perturbed by one part in 10^7 (about float32's rounding step, or SIZE) with a noise seed of its own, or more
torch threads (other reduction orders where a product is large enough to be split; on TinyAgent's policy none is,
and ``threads2`` repeats ``here`` bit for bit, so ``all`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import lrl
from lrl.cli import OneLineParser
from lrl_lab.experiments.inputs import outputs
from lrl_lab.experiments.stats import mean_se

LATE = 20  # steps after which a healthy run no longer produces malformed actions at a high rate
PERTURBATION = 1e-7  # relative size of an emulated machine's change of the starting weights (float32's step)
# emulated machines: name -> (torch threads, the seed of the weights' perturbation or None)
# the machines of --machines all; any "perturbN", "perturbN@SIZE" or "threadsN" is accepted too (machine_spec)
MACHINES = ("here", "perturb1", "perturb2", "perturb3", "perturb4")
# "threads2" was measured bit-identical to "here" on TinyAgent's policy: its products are too small to be split


def machine_spec(name: str) -> tuple[int, int | None, float]:
    """An emulated machine by name -> (torch threads, the seed of the weights' perturbation or None, its size):
    "here", "threadsN", "perturbN" (size PERTURBATION) or "perturbN@SIZE"; ValueError for anything else."""
    if name == "here":
        return 1, None, 0.0
    if name.startswith("threads") and name[7:].isdigit() and 1 <= int(name[7:]) <= 64:
        return int(name[7:]), None, 0.0
    if name.startswith("perturb"):
        seed, _, size = name[7:].partition("@")
        try:
            value = float(size) if size else PERTURBATION
        except ValueError:
            value = -1.0
        if seed.isdigit() and 0 < value < 1:
            return 1, int(seed), value
    raise ValueError(f"{name!r} is not a machine: here, threadsN, perturbN or perturbN@SIZE (0 < SIZE < 1)")


def perturbed(model, seed: int, size: float = PERTURBATION):
    """`model` with every weight multiplied by (1 + size * z), z standard normal from `seed` (in place)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + size * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def one_seed(args: tuple) -> dict:
    """Train one seed with the given train.py flags, on an emulated machine -> its summary and curves."""
    seed, flags, out, machine = (*args, "here") if len(args) == 3 else args
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    from lrl.arguments import parse_args
    from lrl.envs import make_env
    from lrl.preflight import resolve
    from lrl.run import build_run, fit, load_model

    threads, noise, size = machine_spec(machine)
    cfg = parse_args(
        [
            *flags,
            "--seed",
            str(seed),
            "--progress",
            "false",
            "--threads",
            str(threads),
            "--log-dir",
            str(Path(out) / "runs"),
            "--run-name",
            f"{machine}-seed{seed}" if machine != "here" else f"seed{seed}",
        ]
    )
    policy = None
    if noise is not None:  # the run's own starting policy, perturbed
        spec = make_env(resolve(cfg))  # a named model -> its folder, as a run's preflight does
        policy = load_model(cfg.policy, spec.tok) or (spec.warm_start() if spec.warm_start else None)
        if policy is None:
            raise ValueError(f"machine {machine}: the environment has no starting policy to perturb")
        policy = perturbed(policy, noise, size)
    start = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = build_run(cfg, policy=policy)
        result = fit(run)
    ours = [str(w.message) for w in caught if is_ours(w.filename)]
    history = run.module.history
    late = [h["train/invalid"] for h in history if h["step"] >= LATE]
    return {
        "seed": seed,
        "machine": machine,
        "pass_rate": result.pass_rate,
        "invalid": result.invalid,
        **result.metrics,
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
    root = Path(lrl.__file__).resolve().parents[1]  # a checkout's root, or the site-packages lrl is installed in
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

    fig, ax = plt.subplots(figsize=(7.6, 4))
    palette = plt.get_cmap("tab20").colors  # twenty distinct colours: a seed can be told from its line
    for i, r in enumerate(sorted(results, key=lambda r: r["seed"])):
        steps, values = zip(*r["heldout"])
        colour, style = palette[i % len(palette)], ("-", "--", ":")[i // len(palette) % 3]
        ax.plot(
            steps, values, style, color=colour, marker="o", ms=3, lw=1, alpha=0.8, label=f"seed {r['seed']}"
        )
    steps = [s for s, _ in results[0]["heldout"]]
    if all([s for s, _ in r["heldout"]] == steps for r in results):
        mean = [sum(r["heldout"][i][1] for r in results) / len(results) for i in range(len(steps))]
        ax.plot(steps, mean, color="black", lw=2.5, label="mean")
    ax.set(xlabel="training step (policy version)", ylabel="held-out pass rate", ylim=(0, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine() -> str:
    from lrl.precision import cpu_model

    return f"{os.cpu_count()} x {cpu_model() or platform.processor() or platform.machine()}"


def machine_words(name: str) -> str:
    threads, noise, size = machine_spec(name)
    if noise is not None:
        return f"starting weights x (1 + {size:g} z), noise seed {noise}, torch threads {threads}"
    return f"torch threads {threads} per run"


FLOOR = 0.85  # held-out pass rate below which a seed counts as failed


def summary(results: list[dict], machines: list[str]) -> str:
    """One row per machine: held-out mean ± SE, minimum, the seeds below FLOOR, warnings."""
    lines = [
        "| machine | what differs | held-out mean ± SE | minimum | seeds below 0.85 | warnings |",
        "|---|---|---|---|---|---|",
    ]
    for name in machines:
        rows = [r for r in results if r["machine"] == name]
        mean, se = mean_se([r["pass_rate"] for r in rows])
        failing = ", ".join(
            str(r["seed"]) for r in sorted(rows, key=lambda r: r["seed"]) if r["pass_rate"] < FLOOR
        )
        lines.append(
            f"| {name} | {machine_words(name)} | {mean:.3f} ± {se:.3f} | {min(r['pass_rate'] for r in rows):.3f} "
            f"| {failing or 'none'} | {sum(r['warnings'] for r in rows)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m lrl_lab.experiments.seeds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel (1 thread each)"
    )
    parser.add_argument(
        "--machines",
        default="here",
        help=f"comma-separated emulated machines (here, threadsN, perturbN, perturbN@SIZE), or all: "
        f"{', '.join(MACHINES)} (default here: this machine)",
    )
    parser.add_argument(
        "--out", default="results/seeds", help="folder for table.md, results.json, heldout.png"
    )
    parser.add_argument("flags", nargs="*", help="train.py flags, after --")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    for problem in outputs(("--out", args.out, "dir")):
        parser.error(problem)
    machines = list(MACHINES) if args.machines == "all" else args.machines.split(",")
    for name in machines:
        try:
            machine_spec(name)
        except ValueError as err:
            parser.error(f"--machines: {err}")
    from lrl.arguments import parse_args
    from lrl.config import ConfigError
    from lrl.envs import make_env

    if "--threads" in args.flags:
        parser.error("--threads is the machine's (see --machines); leave it out of the train.py flags")
    try:
        cfg = parse_args(list(args.flags))
    except ConfigError as err:
        parser.error(str(err))
    spec = make_env(cfg)
    if spec.warm_start is not None:
        spec.warm_start()  # build the cache once, before the workers
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags = list(args.flags)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cells = [(s, flags, str(out), m) for m in machines for s in seeds]
    start, results = time.time(), []
    # spawned, not forked: a fork after torch has started its thread pool can hang in the child's first product
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, r in enumerate(pool.map(one_seed, cells), 1):
            results.append(r)
            print(
                f"[{i}/{len(cells)}] {r['machine']} seed {r['seed']}: held-out {r['pass_rate']:.3f} invalid "
                f"{r['invalid']:.3f} max late train/invalid {r['max_late_train_invalid']:.3f}, {r['warnings']} "
                f"warnings ({time.time() - start:.0f} s)",
                flush=True,
            )
            for text in r["warning_texts"]:
                print(f"    seed {r['seed']}: {text}", flush=True)
    where = machine()
    table = ""
    for name in machines:
        rows = [r for r in results if r["machine"] == name]
        table += f"### {name}\n\n" if len(machines) > 1 else ""
        table += markdown(rows, args.flags, list(spec.metrics), f"{where}, {machine_words(name)}") + "\n"
    if len(machines) > 1:
        table += "### every machine\n\n" + summary(results, machines)
    table += f"\nWall time: {time.time() - start:.0f} s for {len(cells)} runs ({args.jobs} in parallel).\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    for name in machines:
        rows = [r for r in results if r["machine"] == name]
        title = f"python train.py {' '.join(args.flags)}".strip() + (f" ({name})" if name != "here" else "")
        plot(rows, out / ("heldout.png" if name == "here" else f"heldout_{name}.png"), title)
    print(table)
    print(f"wrote {out / 'table.md'}, {out / 'results.json'} and the held-out figures in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
