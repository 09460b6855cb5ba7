"""``python -m lrl.sim``: the simulator's command line (lrl/sim/cli.py)."""

import sys

from lrl.sim.cli import main

sys.exit(main())
