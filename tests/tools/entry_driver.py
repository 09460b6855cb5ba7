"""Runs many entry points as ``python ARGV`` would, each in a fork of this one interpreter, which has imported
torch, lightning and transformers once: most of an entry point's start is those imports (seconds each, tens of
seconds over every entry point), and a fork inherits them.

Reads a JSON list of ``{"name", "argv", "cwd"}`` on stdin, runs a few at a time, and writes a JSON object of
name -> ``{"returncode", "stdout", "stderr"}`` on stdout. An argv of ``["-m", MODULE, ...]`` runs a module (a
package's ``__main__``), any other a script with its own folder first on the path, as the interpreter does. A child
past the timeout is killed (returncode -9). The parent starts no thread and runs no torch operation before it
forks, so no thread pool is copied half-made.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import tempfile
import time
import traceback

import lightning  # noqa: F401  (the imports every entry point shares, paid here once)
import torch  # noqa: F401
import transformers  # noqa: F401


def run_entry(argv: list[str], cwd: str, out: str, err: str) -> None:
    """In the child: run argv in cwd with stdout and stderr in the files out and err, then exit with its code."""
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    jobs = json.load(sys.stdin)
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 180.0
    at_once = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    scratch = tempfile.mkdtemp(prefix="lrl-entries-")
    waiting, running, done = list(enumerate(jobs)), {}, {}
    while waiting or running:
        while waiting and len(running) < at_once:
            index, job = waiting.pop(0)
            out, err = (os.path.join(scratch, f"{index}.{stream}") for stream in ("out", "err"))
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                run_entry(job["argv"], job["cwd"], out, err)
            running[pid] = (job["name"], out, err, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for child, (_, _, _, started) in running.items():
                if time.monotonic() - started > timeout:
                    os.kill(child, 9)
            time.sleep(0.05)
            continue
        name, out, err, _ = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        texts = []
        for path in (out, err):
            with open(path, errors="replace") as f:
                texts.append(f.read())
            os.remove(path)
        done[name] = {"returncode": code, "stdout": texts[0], "stderr": texts[1]}
    os.rmdir(scratch)
    json.dump(done, sys.stdout)


if __name__ == "__main__":
    main()
