"""The keeper of one Ray node that lrl starts on this machine: ``python -m lrl.pipeline.backends.ray.keeper``.

A Ray node is ``ray start --block`` and the processes it starts (the GCS, the raylet, their agents, the worker
processes of actors). Stopping them all is not Ray's strength: its agents outlive a killed driver and ignore
SIGTERM for seconds (docs/scaling.md). So lrl never starts a node itself; it starts this keeper, in a session of
its own (signals to the trainer's process group do not reach it), which

- runs ``ray start --block ...`` as its child, every process of the node carrying the environment marker
  ``LRL_RAY_NODE=<id>`` (inherited), so the keeper knows every process id of its node;
- watches the process that started it (the trainer, or a test): when that one is gone (the keeper's parent
  changes), even after a SIGKILL,
  or when the keeper receives SIGTERM (a normal stop), it stops ``ray start`` (which stops its node), then
  SIGKILLs whatever still carries the marker, removes the node's temporary folder if asked, and exits.

It imports nothing of Ray or torch: it must start fast and never hang on them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

MARKER = "LRL_RAY_NODE"  # environment variable every process of a node lrl started carries
POLL = 0.2  # seconds between looks at the watched process
GRACE = 4.0  # seconds `ray start` is given to stop its node after SIGTERM


def marked(marker: str, exclude: int | None = None) -> list[int]:
    """Live processes (not zombies) whose environment has ``LRL_RAY_NODE=<marker>``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (exclude, os.getpid()):
            continue
        try:
            if needle not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(int(name))
    return found


def kill_marked(marker: str, deadline: float, exclude: int | None = None) -> list[int]:
    """SIGKILL every process of the node (but `exclude`) until none is left or `deadline` -> those still alive."""
    left = marked(marker, exclude)
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
        left = marked(marker, exclude)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parent", type=int, required=True, help="the pid that started it (it follows its life)"
    )
    parser.add_argument("--marker", required=True, help=f"the value of {MARKER} of this node's processes")
    parser.add_argument("--remove", default=None, help="a folder to remove once the node has stopped")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ray start ... --block")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append("SIGTERM"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    if os.getppid() != args.parent:  # the process that started it is already gone
        return 0
    env = {**os.environ, MARKER: args.marker}
    node = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    code = 0
    while not stopping and os.getppid() == args.parent:
        if node.poll() is not None:  # the node stopped by itself (a crash, a bad flag): clean up after it
            code = node.returncode or 1
            break
        time.sleep(POLL)
    if node.poll() is None:
        node.terminate()
        try:
            node.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(timeout=2)
    left = kill_marked(args.marker, time.monotonic() + 10)
    if args.remove:
        shutil.rmtree(args.remove, ignore_errors=True)
    if left:
        print(f"lrl ray keeper: processes {left} of the node would not die", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
