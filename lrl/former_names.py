"""The lab's commands under their former names, kept for one release: ``python -m lrl.sim`` and ``python -m
lrl.simulate`` are now ``python -m lrl_lab.sim``, ``python -m lrl.mismatch`` is now ``python -m lrl_lab.mismatch``.

The lab (the simulator, the experiments, the tools) is a distribution of its own, ``lrl-lab``, installed beside the
library from a checkout with ``pip install ./lab``; the library never imports it. A former name runs the new one in
its own process when the lab is installed, and otherwise exits with one line that names the install and the new name.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys

INSTALL = "pip install ./lab"  # from a checkout of lrl, beside the library (README.md, Install)


def forward(old: str, new: str) -> None:
    """Run ``python -m new`` with this command's arguments, saying that ``python -m old`` is its former name."""
    if importlib.util.find_spec(new.partition(".")[0]) is None:
        sys.exit(f"python -m {old} is now python -m {new}, in the lab: {INSTALL} (from a checkout of lrl)")
    print(f"python -m {old} is now python -m {new}; the former name goes in the next release", file=sys.stderr)
    runpy.run_module(new, run_name="__main__", alter_sys=True)
