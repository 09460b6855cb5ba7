"""What every command-line tool of lrl shares: a bad command line is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line (what is wrong, and where the options are listed),
    not with the usage block, which wraps over a screen for a tool with many options."""

    def error(self, message: str):
        message = " ".join(message.removeprefix("argument ").split())
        print(f"{self.prog}: error: {message} ({self.prog} --help lists every option)", file=sys.stderr)
        raise SystemExit(2)


def train_program() -> str:
    """The name training's messages go under: ``lrl-train`` when started by that command, else ``train.py``
    (``python train.py`` in a checkout, ``python -m lrl.train``, or a test calling :func:`lrl.train.main`)."""
    return "lrl-train" if Path(sys.argv[0]).name == "lrl-train" else "train.py"


def train_command() -> str:
    """How a user starts this training again: ``lrl-train``, ``python -m lrl.train`` or ``python train.py``."""
    started = Path(sys.argv[0])
    if started.name == "lrl-train":
        return "lrl-train"
    # python -m lrl.train starts the package's own module file; a checkout's train.py is another file, whatever its
    # folder is called (a clone named lrl holds lrl/train.py beside the package lrl/lrl/train.py)
    if sys.argv[0] and started.resolve() == Path(__file__).resolve().with_name("train.py"):
        return "python -m lrl.train"
    return "python train.py"
