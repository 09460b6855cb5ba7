"""A plain install, as a user makes it: ``pip install .`` (not editable) from a clean clone into a fresh virtual
environment that sees no other site-packages, then the lab beside it, ``pip install ./lab``, each used from another
folder. The library alone trains and holds nothing of the lab (the simulator's former name says how to install
it); with the lab, the simulator and one experiment run there; the experiment starts its training runs through the
installed module, so nothing reaches back into a source tree; ``samplers`` and ``callbacks`` are names under
``lrl.`` only.

It takes minutes (the environment is built from nothing, torch from its local wheel), so it is kept out of the
default run (marker ``install``) and .ci/run runs it as a step of its own: ``python -m pytest -m install``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # as .ci/run and the README install it


def run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}: {done.stderr[-3000:]}"
    return done


@pytest.mark.install
@pytest.mark.timeout(1800)
def test_a_plain_install_trains_and_the_lab_beside_it_simulates_and_runs_an_experiment(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["LRL_CACHE"] = str(tmp_path / "cache")  # an empty cache: the RL base must come from the wheel
    clone, venv, elsewhere = tmp_path / "clone", tmp_path / "venv", tmp_path / "elsewhere"
    run(["git", "clone", "--quiet", str(ROOT), str(clone)], tmp_path, env, 300)
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 300)
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", TORCH], tmp_path, env, 900)
    run([str(python), "-m", "pip", "install", "-q", str(clone)], tmp_path, env, 900)
    elsewhere.mkdir()

    # the library holds nothing of the lab; the simulator's former name says how to install it, in one line
    for name in ("lrl_lab", "lrl.experiments", "lrl.tools"):
        gone = subprocess.run([str(python), "-c", f"import {name}"], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert gone.returncode != 0 and "No module named" in gone.stderr, (name, gone.stderr[-500:])
    former = subprocess.run([str(python), "-m", "lrl.sim"], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert former.returncode == 1, former.stderr[-1000:]
    assert former.stderr.strip().splitlines() == [
        "python -m lrl.sim is now python -m lrl_lab.sim, in the lab: pip install ./lab (from a checkout of lrl)"
    ]

    # the package comes from the environment, not from a source tree; the names live under lrl.
    where = run(
        [str(python), "-c", "import lrl, lrl.samplers, lrl.callbacks; print(lrl.__file__)"],
        elsewhere,
        env,
        120,
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    for name in ("samplers", "callbacks"):
        gone = subprocess.run([str(python), "-c", f"import {name}"], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert gone.returncode != 0 and f"No module named '{name}'" in gone.stderr, gone.stderr[-500:]

    trained = run(
        [str(venv / "bin" / "lrl-train"), "--max-steps", "2", "--eval-every", "2", "--eval-episodes", "1",
         "--no-progress", "--log-dir", "runs"],
        elsewhere, env, 600,
    )  # fmt: skip
    assert "held-out pass rate" in trained.stdout and "2 steps" in trained.stdout, trained.stdout[-1000:]
    assert (elsewhere / "runs" / "lrl" / "version_0").is_dir()

    run([str(python), "-m", "pip", "install", "-q", str(clone / "lab")], tmp_path, env, 900)
    where = run([str(python), "-c", "import lrl_lab; print(lrl_lab.__file__)"], elsewhere, env, 120)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    simulated = run([str(python), "-m", "lrl_lab.sim"], elsewhere, env, 300)
    assert "episodes failing" in simulated.stdout, simulated.stdout[-1000:]
    tiny = ["--single", "--n-durations", "512", "--slots", "4", "--batch-size", "4", "--steps", "2"]
    simulated = run([str(python), "-m", "lrl_lab.sim", *tiny], elsewhere, env, 300)
    assert "episodes started/trained  8 / 8" in simulated.stdout, simulated.stdout[-1000:]
    former = run([str(python), "-m", "lrl.sim", *tiny], elsewhere, env, 300)  # the former name, one more release
    assert former.stdout == simulated.stdout and "now python -m lrl_lab.sim" in former.stderr, former.stderr

    out = elsewhere / "experiment"
    run(
        [str(python), "-m", "lrl_lab.experiments.pipeline", "--staleness", "0", "--repeats", "1", "--steps", "5",
         "--out", str(out)],
        elsewhere, env, 900,
    )  # fmt: skip
    histories = sorted(p.name for p in (out / "histories").glob("*.jsonl"))
    # the synchronous run and the bound-0 run, each trained by lrl.train
    assert len(histories) == 2, histories
    assert (out / "table.md").read_text().count("| sync |") == 1
