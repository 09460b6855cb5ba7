"""Every bench script and every ``python -m`` entry point starts: ``--help`` prints its usage and exits 0
without doing any work, and the cheap ones also run a tiny real configuration.

Both lists are discovered from the tree (``bench/*.py``; every module under ``lrl/`` and the lab's
``lab/lrl_lab/`` with a main block, and every package ``__main__``), so a new script or entry point is covered without editing this file, and a move
that breaks one's imports fails here. The commands run a few at a time, each in an empty folder that must
stay empty under ``--help``, each in a fork of one interpreter that has the heavy imports done (entry_driver.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.xdist_group("entrypoints")  # the module-scoped runs of every entry point, once
MAIN_BLOCK = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)

# a few seconds each; {events} is a folder of TensorBoard scalars made for the test
TINY = {
    "bench/bench_callbacks.py": ["--steps", "1", "--rounds", "1", "--warmup", "0"],
    "bench/bench_engine.py": ["--prompts", "4", "--new-tokens", "4", "--repeats", "1"],
    "bench/bench_sampling.py": ["--rows", "2", "--repeats", "1"],
    "bench/fp16_gradients.py": ["--layers", "2", "--rows", "2", "--tokens", "8", "--scales", "1", "--threads", "1"],
    "bench/bench_proximal.py": ["--steps", "2", "--", "--env", "tinyagent", "--tasks-per-step", "2", "--episodes-per-task", "2"],
    "bench/bench_simulate.py": ["--slots", "8", "--steps", "2", "--n-durations", "1024", "--load-slots", "8", "--windowed-slots", "8"],
    "lrl_lab.sim": ["--single", "--n-durations", "512", "--slots", "4", "--batch-size", "4", "--steps", "2"],
    "lrl_lab.experiments.estimators": ["--sigmas", "0.5", "--reps", "20", "--samples", "8", "--vocab", "10"],
    "lrl_lab.tools.mismatch": ["--new-tokens", "2", "--trainer-batch", "0"],
    "lrl_lab.tools.plot_run": ["{events}", "--out", "{events}/curves.png"],
    "bench/runs_table.py": ["one run={events}", "--learned", "0.5"],
}
# the tiny runs that need an optional part (conftest.OPTIONAL_PARTS): skipped, saying what to install, without it
NEEDS = {"bench/fp16_gradients.py": "smollm2"}
# --help only: the same main as an entry run tiny above, or too long to run tiny
HELP_ONLY = {
    "lrl_lab.sim.cli": "the main of lrl_lab.sim",
    "lrl.sim": "the main of lrl_lab.sim, under its former name",
    "lrl.simulate": "the main of lrl_lab.sim, under its former name",
    "lrl.mismatch": "the main of lrl_lab.mismatch, under its former name",
    "lrl_lab.mismatch": "the main of lrl_lab.tools.mismatch, under a short name",
    "bench/bench_first_run.py": "three first runs of train.py with an empty cache",
    "bench/bench_pipeline.py": "repeated sync and async training runs",
    "lrl_lab.experiments.pipeline": "training runs per staleness bound and repeat",
    "lrl_lab.experiments.seeds": "the default run over seeds",
    "lrl_lab.experiments.staleness": "a grid of training runs over seeds",
    "lrl_lab.experiments.decide": "training runs over rows and paired seeds",
    "lrl_lab.tools.ship_bases": "rebuilds the shipped warm starts",
    "bench/profile_step.py": "training steps of the real model",
    "bench/floors.py": "the real model's matrix products timed at large shapes",
    "bench/bench_vs_trl.py": "lrl and TRL training the real model",
    "bench/bench_recipe_speed.py": "two training runs of the real model",
    "bench/profile_decode.py": "samples from the real model",
}


def entry_modules() -> list[str]:
    """Modules of the library and the lab that `python -m` runs: a package's __main__, or a module with a main
    block."""
    found = []
    paths = [(p, ROOT) for p in sorted((ROOT / "lrl").rglob("*.py"))]
    paths += [(p, ROOT / "lab") for p in sorted((ROOT / "lab" / "lrl_lab").rglob("*.py"))]
    for path, top in paths:
        parts = path.relative_to(top).with_suffix("").parts
        if path.name in ("__main__.py", "__init__.py"):
            if path.name == "__main__.py" or MAIN_BLOCK.search(path.read_text()):
                found.append(".".join(parts[:-1]))
        elif MAIN_BLOCK.search(path.read_text()):
            found.append(".".join(parts))
    return found


ENTRIES = {
    **{f"bench/{p.name}": [str(p)] for p in sorted((ROOT / "bench").glob("*.py"))},
    **{m: ["-m", m] for m in entry_modules()},
}


def environment() -> dict[str, str]:
    """This checkout first on the path (a bench script's own folder would come first otherwise)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"}


def run_all(commands: dict[str, tuple[list[str], Path]], timeout: float) -> dict:
    """Run each (argv, cwd), a few at a time, as ``python ARGV`` would -> name: CompletedProcess. Each is a fork of
    one interpreter that imported torch, lightning and transformers once (entry_driver.py): those imports are most
    of an entry point's start, paid here once instead of fifty times."""
    jobs = [{"name": name, "argv": argv, "cwd": str(cwd)} for name, (argv, cwd) in commands.items()]
    driver = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("entry_driver.py")), str(timeout)],
        input=json.dumps(jobs),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout * len(jobs),
    )
    assert driver.returncode == 0, driver.stderr[-2000:]
    outs = json.loads(driver.stdout)
    return {name: subprocess.CompletedProcess(commands[name][0], **outs[name]) for name in commands}


@pytest.fixture(scope="module")
def helped(tmp_path_factory):
    folders = {name: tmp_path_factory.mktemp("help") for name in ENTRIES}
    outs = run_all({name: ([*argv, "--help"], folders[name]) for name, argv in ENTRIES.items()}, 120)
    return {name: (outs[name], folders[name]) for name in ENTRIES}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    events = tmp_path_factory.mktemp("events")
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(events)) as writer:
        for step in range(3):
            for tag in ("train/reward", "val/pass_rate", "train/reads", "train/invalid"):
                writer.add_scalar(tag, step / 3, step)
    commands = {
        name: ([*ENTRIES[name], *(a.format(events=events) for a in args)], tmp_path_factory.mktemp("tiny"))
        for name, args in TINY.items()
        if name in ENTRIES and not (name in NEEDS and missing(NEEDS[name]))
    }
    return run_all(commands, 180), events


def test_the_entry_points_are_found():
    assert {"lrl_lab.sim", "lrl_lab.tools.mismatch", "lrl_lab.experiments.seeds", "bench/bench_engine.py"} <= set(
        ENTRIES
    )
    assert {"lrl.sim", "lrl.simulate", "lrl.mismatch"} <= set(ENTRIES)  # the former names, for one release
    listed = set(TINY) | set(HELP_ONLY)
    assert listed <= set(ENTRIES), f"listed here but gone from the tree: {sorted(listed - set(ENTRIES))}"
    assert not set(TINY) & set(HELP_ONLY)
    assert set(NEEDS) <= set(TINY)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_help_prints_the_usage_and_does_no_work(helped, name):
    out, folder = helped[name]
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout.lower(), out.stdout[-1000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not any(folder.iterdir()), f"--help wrote {sorted(p.name for p in folder.iterdir())}"


def tiny_names() -> list:
    """The tiny runs, each marked with the optional part it needs."""
    return [
        pytest.param(name, marks=[getattr(pytest.mark, NEEDS[name])] if name in NEEDS else [])
        for name in sorted(TINY)
    ]


@pytest.mark.parametrize("name", tiny_names())
def test_a_tiny_configuration_runs(tiny, name):
    outs, events = tiny
    out = outs[name]
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() or name == "lrl_lab.tools.plot_run", "printed nothing"
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    if name == "lrl_lab.tools.plot_run":
        assert (events / "curves.png").stat().st_size > 0
    if name == "bench/runs_table.py":  # the events' held-out pass rate goes 0, 1/3, 2/3: a gain of 2/3, learned
        assert "| one run | 1 | 0.000 -> 0.667 | 0.667 | 0.667 | 1 of 1 |" in out.stdout, out.stdout
