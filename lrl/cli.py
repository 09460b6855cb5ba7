"""What every command-line tool of lrl shares: a bad command line is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line (what is wrong, and where the options are listed),
    not with the usage block, which wraps over a screen for a tool with many options."""

    def error(self, message: str):
        message = " ".join(message.removeprefix("argument ").split())
        print(f"{self.prog}: error: {message} ({self.prog} --help lists every option)", file=sys.stderr)
        raise SystemExit(2)
