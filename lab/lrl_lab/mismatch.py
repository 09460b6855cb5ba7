"""``python -m lrl_lab.mismatch``: the training-inference mismatch tool (lab/lrl_lab/tools/mismatch.py)."""

import sys

from lrl_lab.tools.mismatch import main

if __name__ == "__main__":
    sys.exit(main())
