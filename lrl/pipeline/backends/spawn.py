"""The first code a rollout worker process runs: tie its life to the trainer's before importing anything.

A spawned process unpickles its arguments before its target runs; the arguments here are only the trainer's pid
and two queues, which import nothing heavy (this module and the packages above it import nothing at all at
the top level). So a trainer killed while its workers are still starting cannot leave one behind: the
parent-death signal is set first, and a worker whose trainer is already gone (its parent is no longer the
trainer's pid) exits at once. Everything heavy (the weight board, the model, the configuration) comes as the
first message on the worker's queue (:class:`lrl.pipeline.messages.Setup`).
"""

from __future__ import annotations

import os
import signal


def die_with_parent() -> None:
    """Ask Linux to kill this process with SIGKILL when its parent dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker's own parent check remains
        pass


def main(trainer: int, index: int, inbox, outbox) -> None:
    """A worker's entry point: parent-death signal, parent check, signals left to the trainer, then work."""
    die_with_parent()
    if os.getppid() != trainer:  # the trainer died before the line above took effect
        os._exit(0)
    # Ctrl-C, SIGTERM and SIGHUP are the trainer's to handle (a process group gets them all): it stops its
    # workers itself, after the step in progress, with a checkpoint
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    from lrl.pipeline.worker import worker_main

    worker_main(trainer, index, inbox, outbox)
