"""The signals that stop a run, and the exception that stops one still starting; nothing heavy is imported here,
so that train.py can install its handlers before it imports torch.

SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal went away) all stop a run the same way: during training at the
end of the current step, with a last checkpoint when checkpoints are on (``lrl.checkpoint.GracefulStop``), which
the run says at once (a real model's step can take minutes), with how to stop it now: a second signal, which ends
the process at once with one line saying what was kept and how to continue; before the first step, at once, with
nothing to save (:class:`StoppedBeforeTraining`). The exit status is 128 + the signal's number (130, 143, 129).
"""

from __future__ import annotations

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StoppedBeforeTraining(BaseException):
    """A signal arrived while the run was still starting (importing, loading, building the data, starting
    workers). A BaseException, as KeyboardInterrupt is: code that turns any error into a message must let it
    through."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum} before the first step")
        self.signum = signum


_RECEIVED: list[int] = []  # the stop signals that arrived while the run was starting
_PROGRAM = ["train.py"]  # the name the stop line goes under (install_startup_handlers sets it)
_IMPORT_MACHINERY = ("importlib._bootstrap", "importlib._bootstrap_external")


def stopped_at_start_line(program: str, signum: int) -> str:
    """The one line a run stopped before its first step ends with."""
    return f"{program}: stopped by {signal_name(signum)} before the first step; nothing was trained yet"


def in_an_import(frame) -> bool:
    """Whether the interrupted code runs under an import: an import machinery frame on its stack."""
    while frame is not None:
        if frame.f_globals.get("__name__") in _IMPORT_MACHINERY:
            return True
        frame = frame.f_back
    return False


def stop_at_once(signum, frame) -> None:
    """The handler while a run starts: stop where it is, and remember it.

    Under an import the process ends here, with its one line and 128 + the signal, as an unhandled SIGTERM would end
    it: an exception raised there can land in library code that cannot pass it on (a C++ extension calling back into
    Python while torch imports aborts the process: SIGABRT and a stack dump; numpy's lazy attributes turn it into an
    AttributeError), and a run still importing has written nothing and started nothing a kill would leave behind.
    Elsewhere it raises StoppedBeforeTraining, so that the run's own clean-up runs. That exception may still be
    swallowed where Python ignores exceptions (a weakref callback): train.py and lrl.checkpoint.GracefulStop look at
    what was received."""
    _RECEIVED.append(signum)
    if in_an_import(frame):
        try:
            sys.stdout.flush()
        except (RuntimeError, OSError, ValueError):
            pass
        say(stopped_at_start_line(_PROGRAM[0], signum))
        os._exit(128 + signum)
    raise StoppedBeforeTraining(signum)


def received_at_start() -> int | None:
    """The first stop signal that arrived while the run was starting, if any."""
    return _RECEIVED[0] if _RECEIVED else None


def install_startup_handlers(program: str = "train.py") -> None:
    """Every stop signal ends a starting run at once (main thread only); `program` names its one line."""
    _RECEIVED.clear()
    _PROGRAM[0] = program
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop_at_once)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def say(line: str) -> None:
    """One line on stderr from a signal handler: through sys.stderr, or straight to its descriptor where the handler
    interrupted a write to sys.stderr (a progress bar's), which Python refuses to enter again."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (RuntimeError, OSError, ValueError):
        try:
            os.write(2, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass


def again(signum: int) -> str:
    return "press Ctrl-C again" if signum == signal.SIGINT else f"send {signal_name(signum)} again"


def stopping_notice(prefix: str, signum: int, checkpoints: bool) -> str:
    """The line a first signal during training prints at once."""
    then = "a checkpoint is written then" if checkpoints else "checkpoints are off, so nothing will be saved"
    return (
        f"{prefix}: {signal_name(signum)}: stopping at the end of the current step ({then}); {again(signum)} to "
        "stop now, losing that step's work"
    )


def stopped_now_line(
    prefix: str, signum: int, done: int, kept: tuple[str, int] | None, checkpoints: bool, how: str | None
) -> str:
    """The line a second signal prints before the process ends: what was kept (the last checkpoint written, of
    which step) and how to continue from it."""
    head = f"{prefix}: stopped by {signal_name(signum)} again, in the middle of step {done + 1}"
    if kept is None:
        why = "no checkpoint had been written yet" if checkpoints else "checkpoints are off"
        return f"{head}; nothing was kept ({why}: --checkpoint-every N keeps one every N steps)"
    path, step = kept
    return f"{head}; kept: the checkpoint of step {step} ({path})" + (
        f"; continue with: {how}" if how else ""
    )
