"""Temporary files that go with the process that made them, however it ends: ``python -m lrl.reaper``.

A process killed with SIGKILL runs no cleanup code, so what it wrote under the temporary folder (an engine's
scratch copy of the model, multiprocessing's folders, the files of its workers) would stay there for good. The
reaper is a small process in a session of its own (signals to the run's process group do not reach it) that
watches the process that started it: once that one is gone (its parent changes), or on SIGTERM (a normal end),
it removes the paths it was given and exits. It imports nothing but the standard library.

:func:`process_tempdir` gives a process one such folder: ``TMPDIR`` points into it from then on, for the process
and every process it starts, and the reaper removes it once the process is gone, however it ended (``train.py``
takes one at its start). It is removed after the process, not before its end: multiprocessing keeps its own
folder in it until its last finalizer has run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

POLL = 0.2  # seconds between looks at the watched process
OUTER_TMPDIR = "LRL_OUTER_TMPDIR"  # the temporary folder in force before a run's own (for Ray's short paths)


def remove(paths: list[str]) -> None:
    for path in paths:
        remove_tree(path)


def remove_tree(path: str) -> None:
    """Remove a file, or a folder and everything under it, however deep (no recursion, and no path longer than
    one name: each step is relative to an open folder), following no link; what cannot be removed is left."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return
    except OSError:  # not a folder (a file, a link): removed as one
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    names: list[str] = []  # the folders from `path` down to the one open
    stuck: list[set] = [set()]  # per level: the folders in it that could not be removed
    while True:
        sub = None
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                if entry.name in stuck[-1]:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    sub = entry.name
                    break
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
        if sub is not None:
            with contextlib.suppress(OSError):  # a folder its owner made unreadable or unwritable
                os.chmod(sub, 0o700, dir_fd=fd, follow_symlinks=False)
            try:
                child = os.open(sub, flags, dir_fd=fd)
            except OSError:
                stuck[-1].add(sub)
                continue
            os.close(fd)
            fd = child
            names.append(sub)
            stuck.append(set())
            continue
        if not names:
            break
        parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = parent
        name = names.pop()
        stuck.pop()
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            stuck[-1].add(name)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def start_reaper(paths: list[str]) -> subprocess.Popen:
    """A reaper that removes `paths` when this process is gone (or when it is terminated)."""
    return subprocess.Popen(
        [sys.executable, "-m", "lrl.reaper", "--parent", str(os.getpid()), *paths],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # lrl importable from there
    )


def stop_reaper(reaper: subprocess.Popen | None) -> None:
    """End a reaper now (it removes its paths as it goes)."""
    if reaper is None or reaper.poll() is not None:
        return
    reaper.terminate()
    try:
        reaper.wait(timeout=5)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait(timeout=2)


_OWN: dict[int, str] = {}  # pid -> the folder process_tempdir made for it


def process_tempdir(prefix: str = "lrl-run-") -> str:
    """This process's temporary folder, made (with its reaper) on the first call -> its path. TMPDIR and
    tempfile's default point into it from then on; the temporary folder in force before is kept in
    LRL_OUTER_TMPDIR (Ray's sockets need its short paths)."""
    pid = os.getpid()
    if pid in _OWN:
        return _OWN[pid]
    outer = tempfile.gettempdir()
    folder = tempfile.mkdtemp(prefix=prefix)
    start_reaper([folder])
    os.environ.setdefault(OUTER_TMPDIR, outer)
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder
    _OWN[pid] = folder
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lrl.reaper", description=__doc__.splitlines()[0])
    parser.add_argument("--parent", type=int, required=True, help="the process whose life the paths follow")
    parser.add_argument("paths", nargs="+", help="files or folders to remove once it is gone")
    args = parser.parse_args(argv)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while not stopping and os.getppid() == args.parent:
        time.sleep(POLL)
    remove(args.paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
