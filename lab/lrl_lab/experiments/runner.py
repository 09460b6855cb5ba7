"""Runs of an experiment, each in a process of its own, that a signal ends at once.

A run takes minutes to an hour; the command that runs them is stopped by Ctrl-C (SIGINT), by ``timeout`` or a job
scheduler (SIGTERM) or a closed terminal (SIGHUP). What finished before is already kept by the caller (it records each
run as it comes back); what is in flight is ended with SIGKILL, its process and the processes it started (they die
with their parent), and the caller says so in one line.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing.connection import wait

from lrl.pipeline.backends.spawn import die_with_parent

NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}


class Stopped(Exception):
    """The command was asked to stop by a signal (``signum``)."""

    def __init__(self, signum: int):
        super().__init__(NAMES.get(signum, f"signal {signum}"))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def stop_on_signals():
    """Within it, SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` in the main thread (the handlers before it
    are put back after it)."""

    def stop(signum, _frame):
        raise Stopped(signum)

    before = {s: signal.signal(s, stop) for s in NAMES}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _run(conn, fn, cell) -> None:
    """A run's process: it dies with the command, leaves the command's signals to the command, and sends back
    ``("ok", result)`` or ``("err", exception)``."""
    die_with_parent()
    for s in NAMES:  # the command ends its runs itself, at once (a process group gets a terminal's Ctrl-C)
        signal.signal(s, signal.SIG_IGN)
    try:
        answer = ("ok", fn(cell))
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the command, in words
        answer = ("err", err)
    try:
        conn.send(answer)
    except Exception:  # an exception (or result) that does not pickle: its words
        conn.send(("err", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
    conn.close()


def each_in_its_own_process(cells: list, jobs: int, fn, started=None):
    """Run `fn` on every cell, `jobs` at a time, each in a fresh spawned process -> (cell, its finished Future), in
    the order they finish; `started(cell)` is called as each run is handed its process. A process serves one run
    only: a run's memory is gone before the next one plans its own, and no state of one run reaches the next. A run
    whose process dies without an answer (killed for memory, most often) comes back as ``BrokenProcessPool``.
    Stopped early (a signal, an exception, the generator closed), it kills the runs in flight and waits for them."""
    context = multiprocessing.get_context("spawn")
    pending, running = list(cells), {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                cell = pending.pop(0)
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(target=_run, args=(writer, fn, cell))
                process.start()
                writer.close()  # the run's end: once its process is gone, reading says so
                running[reader] = (cell, process)
                if started is not None:
                    started(cell)
            for reader in wait(list(running)):
                cell, process = running.pop(reader)
                future: Future = Future()
                try:
                    kind, value = reader.recv()
                except (EOFError, OSError):
                    process.join()
                    future.set_exception(BrokenProcessPool(f"its process died (exit code {process.exitcode})"))
                else:
                    process.join()
                    future.set_result(value) if kind == "ok" else future.set_exception(value)
                reader.close()
                yield cell, future
    finally:
        for _, process in running.values():
            process.kill()
        for reader, (_, process) in running.items():
            process.join()
            reader.close()

