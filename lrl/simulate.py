"""``python -m lrl.simulate``: the simulator's command line under its former name (see lrl/sim/cli.py)."""

import sys

from lrl.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
