"""``python -m lrl.mismatch``: the training-inference mismatch tool (lrl/tools/mismatch.py)."""

import sys

from lrl.tools.mismatch import main

if __name__ == "__main__":
    sys.exit(main())
