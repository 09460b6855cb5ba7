"""``python -m lrl_lab.sim``: the simulator's command line (lab/lrl_lab/sim/cli.py)."""

import sys

from lrl_lab.sim.cli import main

sys.exit(main())
