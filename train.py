"""Train an agent with RL from a behavior sampler, from a checkout: ``python train.py --help`` lists every option.

The code is :mod:`lrl.train`, installed as the ``lrl-train`` command (and ``python -m lrl.train``).
"""

import sys

from lrl.train import main

if __name__ == "__main__":
    sys.exit(main())
