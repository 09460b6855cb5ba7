"""The command a run names to its user (to continue after a signal, or where --help lists every option) is the one
the user started it with: ``python train.py`` from a checkout, ``python -m lrl.train``, or ``lrl-train``. It is told
by what was started, never by a folder's name: a checkout cloned into a folder named ``lrl`` holds ``lrl/train.py``
beside the package's own ``lrl/lrl/train.py``, and its user typed ``python train.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lrl.train
from lrl.cli import train_command

ROOT = Path(__file__).resolve().parents[2]
HELP = " --help lists every option)"


def named_command(argv: list[str], cwd: Path) -> str:
    """The command that a bad command line's one line on stderr tells the user to ask for --help."""
    out = subprocess.run([*argv, "--no-such-option"], cwd=cwd, capture_output=True, text=True, timeout=120)
    line = out.stderr.strip()
    assert out.returncode == 2 and line.endswith(HELP), (out.returncode, line[-2000:])
    return line.removesuffix(HELP).rsplit("(", 1)[1]


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A folder named lrl holding a train.py that is a checkout's, not the package's module."""
    folder = tmp_path / "lrl"
    folder.mkdir()
    shutil.copy(ROOT / "train.py", folder / "train.py")
    return folder


def test_a_checkout_in_a_folder_named_lrl_is_told_python_train_py(checkout):
    assert named_command([sys.executable, "train.py"], checkout) == "python train.py"
    assert named_command([sys.executable, "lrl/train.py"], checkout.parent) == "python train.py"


def test_the_packages_module_is_told_python_m_lrl_train(tmp_path):
    assert named_command([sys.executable, "-m", "lrl.train"], tmp_path) == "python -m lrl.train"


def test_the_installed_command_is_told_lrl_train(tmp_path):
    script = Path(sys.executable).with_name("lrl-train")
    if not script.is_file():
        pytest.skip(f"no lrl-train beside {sys.executable} (pip install -e . makes it)")
    assert named_command([str(script)], tmp_path) == "lrl-train"


def test_each_way_of_starting_is_told_from_sys_argv(checkout, monkeypatch):
    """The same, within this process: what sys.argv[0] is for each way a run is started."""
    cases = {
        str(checkout / "train.py"): "python train.py",
        str(ROOT / "train.py"): "python train.py",  # this checkout's own, whatever its folder is called
        lrl.train.__file__: "python -m lrl.train",  # python -m sets sys.argv[0] to the module's file
        str(Path(sys.executable).with_name("lrl-train")): "lrl-train",
        "-c": "python train.py",
    }
    for argv0, expected in cases.items():
        monkeypatch.setattr(sys, "argv", [argv0])
        assert train_command() == expected, argv0
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(sys, "argv", ["train.py"])  # python train.py, from the checkout's folder
    assert train_command() == "python train.py"
