"""decide's inputs, checked before any run: its rows (``LABEL=FLAGS`` and presets), its numbers, the folders it
writes, the flags of every row as train.py takes them and the memory of the runs side by side; and what a run of each
row made now records of its making (records.py), so that runs already made are known for what they are."""

from __future__ import annotations

import math
import os
import shlex
import tempfile
from itertools import accumulate
from pathlib import Path

from lrl_lab.experiments import records
from lrl_lab.experiments.decide_plot import FORMATS

MAX_INT = 2**31 - 1  # the largest seed train.py takes (lrl.options.MAX_INT)
MAX_SEEDS = 10_000
MAX_SAMPLES = 1_000
PRESETS = {
    "core": {
        "on-policy": "",
        "lag 8": "--sampler lagged --lag 8",
        "lag 8, TIS": "--sampler lagged --lag 8 --correction tis",
        "FP8": "--sampler fp8",
        "FP8, TIS": "--sampler fp8 --correction tis",
        "FP8, MIS": "--sampler fp8 --correction mis",
    },
    "wider": {
        "lag 4": "--sampler lagged --lag 4",
        "lag 4, TIS": "--sampler lagged --lag 4 --correction tis",
        "lag 8, MIS": "--sampler lagged --lag 8 --correction mis",
    },
    "fast": {"on-policy": "", "lag 8": "--sampler lagged --lag 8"},  # a pilot's two rows
}


def machine_name(device: str = "cpu") -> str:
    """The machine a run computes on, in words: the GPU's name, or the cores, the CPU's name and its native bf16."""
    import platform

    import torch

    from lrl.precision import cpu_bf16_features, cpu_model

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    name = cpu_model() or platform.processor() or platform.machine()
    return f"{os.cpu_count()}-core {name} ({', '.join(cpu_bf16_features()) or 'no native bf16'})"


def parse_rows(specs: list[str]) -> dict[str, str]:
    """``LABEL=FLAGS`` and presets -> label: flags, in order; a label given twice (presets included) is refused,
    where the second would silently replace the first."""
    rows: dict[str, str] = {}
    for spec in specs:
        if spec in PRESETS:
            given = list(PRESETS[spec].items())
        elif "=" in spec:
            label, flags = spec.split("=", 1)
            given = [(label.strip(), flags.strip())]
        else:
            raise ValueError(f"--rows: {spec!r} is neither LABEL=FLAGS nor a preset ({', '.join(PRESETS)})")
        for label, flags in given:
            if not label:
                raise ValueError(f"--rows: {spec!r} has no label before '='")
            if label in rows:
                raise ValueError(f"--rows: the label {label!r} is given twice ({rows[label] or 'no flags'!r} and "
                                 f"{flags or 'no flags'!r}); give each row a label of its own")  # fmt: skip
            rows[label] = flags
    return rows


def run_argv(flags: list[str], row_flags: str, seed: int, threads: int) -> list[str]:
    """The train.py flags of one run: the shared ones, the row's, then the seed, paired streams and threads."""
    argv = [*flags, *shlex.split(row_flags), "--seed", str(seed), "--paired-streams", "true", "--threads", str(threads)]
    return argv + ["--progress", "false"]


# the train.py flags decide sets for every run itself: given in a row or after --, they would be overridden unseen
OWN = {"--seed": "--first-seed and --seeds", "--paired-streams": "decide (always true)", "--threads": "--threads",
       "--progress": "decide (off)"}  # fmt: skip


def flag_problem(flags: list[str], row_flags: str) -> str | None:
    """Why a row's flags cannot be run as written (None: they can): a quote left open, or a flag decide sets."""
    try:
        words = [*flags, *shlex.split(row_flags)]
    except ValueError as err:
        return f"its flags do not parse ({err})"
    if given := [w.partition("=")[0] for w in words if w.partition("=")[0] in OWN]:
        return f"{given[0]} is set for every run by {OWN[given[0]]}"
    return None


def check_rows(
    rows: dict[str, str], flags: list[str], seed: int, jobs: int, threads: int, runs: dict[str, int] | None = None
) -> list[str]:
    """What would stop the rows before any run starts -> one line per problem (empty: none): a row whose flags
    train.py refuses, whose model or environment cannot be built, or whose step does not fit the memory alone;
    and the `jobs` costliest of the runs to do (`runs`: a row's count; default `jobs` each) side by side past the
    memory this machine has (each run's memory plan, lrl/budget.py, counts its weights, optimizer, the sampler's
    copies and a step's peak)."""
    from lrl.arguments import parse_args
    from lrl.budget import SHARE, available_bytes
    from lrl.run import plan_run

    problems, peaks = [], {}
    for label, row_flags in rows.items():
        try:
            plan = plan_run(parse_args(run_argv(flags, row_flags, seed, threads)))[2]
        except ValueError as err:  # a ConfigError, or a value a registry entry refuses
            problems.append(f"row {label!r} ({row_flags or 'no flags'}): {err}")
            continue
        peaks[label] = plan.step_peak or plan.static
    counts = runs or {}
    each = sorted(((b, label) for label, b in peaks.items() for _ in range(counts.get(label, jobs))), reverse=True)
    costliest = each[:jobs]  # the runs that may be in flight together at worst
    have = SHARE * available_bytes()
    together = sum(b for b, _ in costliest)
    if jobs > 1 and together > have:
        fits = max(1, sum(1 for total in accumulate(b for b, _ in costliest) if total <= have))
        names = ", ".join(f"{label!r} {b / 2**30:.1f} GiB" for b, label in costliest)
        problems.append(
            f"--jobs {jobs}: the costliest runs side by side ({names}, at a step's peak) need about "
            f"{together / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB this machine has ({SHARE} of "
            f"the memory available): the kernel would kill runs; --jobs {fits} fits"
        )
    return problems


def run_device(flags: list[str], threads: int) -> str:
    """The torch device type the runs of these flags compute on."""
    from lrl.arguments import parse_args
    from lrl.precision import accelerator_device

    return accelerator_device(parse_args(run_argv(flags, "", 0, threads)).run.accelerator)


def writable_folder(path: Path, option: str) -> str | None:
    """Why decide cannot keep files in `path` (None: it can): the folder is made where missing, and a file written
    in it and removed, so a read-only mount or a folder under /proc is found before any run, not after one."""
    if path.exists() and not path.is_dir():
        return f"{option} {path}: a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".decide-check-"):
            pass
    except OSError as err:
        return f"{option} {path}: cannot write there ({err.strerror or err})"
    return None


def check_plot(plot: str | None) -> list[str]:
    if not plot:
        return []
    path = Path(plot)
    if path.suffix.lower() not in FORMATS:
        return [f"--plot: {plot!r} must end in {', '.join(FORMATS)}"]
    if path.is_dir():
        return [f"--plot {plot}: a folder; name the figure's file"]
    problem = writable_folder(path.parent, "--plot")
    return [problem] if problem else []


def check_numbers(args) -> str | None:
    """The command's own numbers, all of them, before anything is read or run."""
    if args.seeds < 1 or args.jobs < 1 or args.samples < 0 or args.threads < 0:
        return "--seeds and --jobs must be >= 1, --samples and --threads >= 0"
    if args.seeds > MAX_SEEDS:
        return f"--seeds {args.seeds}: at most {MAX_SEEDS} (each is a training run)"
    last = args.first_seed + args.seeds - 1
    if args.first_seed < 0 or last > MAX_INT:
        return (f"--first-seed {args.first_seed} --seeds {args.seeds}: seeds run from {args.first_seed} to {last}, "
                f"and train.py takes seeds 0 to {MAX_INT}")  # fmt: skip
    if not (math.isfinite(args.effect) and args.effect > 0):
        return f"--effect {args.effect:g}: a difference > 0"
    if args.samples > MAX_SAMPLES:
        return f"--samples {args.samples}: at most {MAX_SAMPLES} held-out episodes a problem"
    if not str(args.out).strip():
        return "--out: an empty path; name the folder of the results"
    if not math.isfinite(args.learned):
        return f"--learned {args.learned:g}: a finite gain of held-out greedy"
    budget = getattr(args, "budget", None)
    if budget is not None and not (math.isfinite(budget) and 0 < budget <= 24 * 365):
        return f"--budget {budget:g}: hours of runs, above 0 (at most a year)"
    if getattr(args, "round_seeds", 1) < 1:
        return f"--round-seeds {args.round_seeds}: at least 1 paired seed a round"
    if budget is not None and getattr(args, "from_results", None):
        return "--budget runs seeds; --from-results runs none: give one of them"
    return None


def table_options(args, rows: dict, baseline: str) -> str | None:
    if baseline not in rows:
        return f"--baseline: {baseline!r} is not one of the rows ({', '.join(rows)})"
    if unknown := [r for r in args.stretches if r not in rows]:
        return f"--stretches: {', '.join(map(repr, unknown))} not among the rows ({', '.join(rows)})"
    return None


def planned(rows: dict[str, str], flags: list[str], seed: int, threads: int) -> tuple[dict[str, dict], list[str]]:
    """What a run of each row made now records of its making (records.py; its settings, machine and torch) ->
    (label: that record, the rows' problems: one line each where train.py refuses their flags)."""
    import torch

    from lrl.arguments import parse_args

    wanted, problems = {}, []
    for label, row_flags in rows.items():
        if problem := flag_problem(flags, row_flags):
            problems.append(f"row {label!r} ({row_flags or 'no flags'}): {problem}")
            continue
        try:
            cfg = parse_args(run_argv(flags, row_flags, seed, threads))
        except ValueError as err:  # a ConfigError, or a value a registry entry refuses
            problems.append(f"row {label!r} ({row_flags or 'no flags'}): {err}")
            continue
        wanted[label] = {"row": label, "flags": row_flags, "shared_flags": shlex.join(flags), "torch": torch.__version__,
                         "settings": records.settings(cfg)}  # fmt: skip
    if problems:
        return {}, problems
    here = machine_name(run_device(flags, threads))
    return {label: dict(w, machine=here) for label, w in wanted.items()}, []
