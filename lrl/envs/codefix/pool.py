"""The environment worker pool: ``--env-workers`` processes that run sandboxed test runs, off the decode loop.

The episode loop's tool threads (:class:`lrl.envs.workers.ThreadTools`) call :meth:`EnvPool.run`, which waits for
an idle worker, sends it the run and waits for its verdict; meanwhile the engine keeps decoding. A sandbox's
crash, hang or memory blow-up is a verdict and never takes a worker down. A worker's own death (it was killed,
it stopped answering, it ran out of memory) is an *infrastructure* failure: the worker is replaced, and the run
is tried again on a fresh one up to ``--env-retries`` times; what the retries cost is counted
(:attr:`EnvPool.stats`). The pool is per process: each rollout worker of the asynchronous pipeline has its own.

Workers are plain processes (``python -I -S worker.py``, no torch); each reads its requests from a pipe and
exits when that pipe closes, so a trainer killed with SIGKILL takes its workers, and with them every sandbox
(each dies with its parent), down within one test timeout. The pool's folder has a reaper (:mod:`lrl.reaper`):
it is removed when the pool's process is gone, even if its workers were killed before they could clean up.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict

from lrl.envs.codefix.sandbox import harness, levels
from lrl.envs.codefix.sandbox.harness import Limits, Verdict
from lrl.reaper import remove_tree

WORKER = os.path.join(os.path.dirname(os.path.abspath(harness.__file__)), "worker.py")
START_SECONDS = 30.0  # a worker that is not ready by then is an infrastructure failure
HUNG_GRACE = 10.0  # seconds past the test timeout after which a silent worker is declared hung
UID_BASE = 1_200_000  # as root, sandboxes run as UID_BASE + pool * 64 + worker (ids no account uses)


def reachable_tmp() -> str:
    """A temporary folder every user can traverse (the sandboxes' users must reach their folders): the run's
    own temporary folder (removed with the run, however it ends), made traversable where it is one of lrl's own
    (``lrl-*``, ours: others may pass through, not list it); else the system's."""
    own = tempfile.gettempdir()
    parts = os.path.realpath(own).split(os.sep)
    for i in range(2, len(parts) + 1):
        folder = os.sep.join(parts[:i])
        try:
            st = os.stat(folder)
            if not st.st_mode & 0o001 and st.st_uid == os.geteuid() and parts[i - 1].startswith("lrl-"):
                os.chmod(folder, (st.st_mode & 0o7777) | 0o011)
        except OSError:
            break
    for candidate in (own, "/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(candidate) and levels.accessible_to_others(candidate, traverse_only=True):
            return candidate
    return tempfile.gettempdir()


def default_workers() -> int:
    return max(os.cpu_count() or 1, 1)


class _Worker:
    def __init__(self, pool: EnvPool, index: int, probe: bool = False):
        self.index = index
        self.pool_grace = pool.limits.wall_seconds + 2.0
        self.root = os.path.join(pool.root, f"w{index}")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,  # a ctrl-C of the terminal reaches the trainer, which closes the pool
        )
        uid = pool.uid_of(index) if probe or pool.uid_base is not None else None
        setup = {
            "root": self.root,
            "level": pool.level,
            "limits": asdict(pool.limits),
            "uid": uid,
            "probe": probe,
            "own_root": pool.own_root,
            "plan": pool.plan,  # what a run's own filesystem holds, as the first worker found it
        }
        self.send(setup)
        self.ready = self.receive(START_SECONDS)
        if not self.ready or not self.ready.get("ready"):
            self.kill()
            why = (self.ready or {}).get("error", "it did not start")
            raise OSError(f"an environment worker could not start: {why}")

    def send(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict | None:
        """The worker's next line; None if it said nothing for `timeout` seconds (:attr:`ended` tells whether
        its pipe closed: the worker is gone)."""
        self.ended = False
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        self.ended = not line
        return json.loads(line) if line else None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        remove_tree(self.root)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=self.pool_grace)
        except subprocess.TimeoutExpired:
            self.kill()
        remove_tree(self.root)


class EnvPool:
    """``n`` environment workers sharing one sandbox configuration (see the module)."""

    _count = 0

    def __init__(self, n: int, level: str, limits: Limits, retries: int = 1, uid: bool | None = None):
        if n < 1:
            raise ValueError(f"env workers must be >= 1; got {n}")
        if retries < 0:
            raise ValueError(f"env retries must be >= 0; got {retries}")
        self.n = n
        self.limits = limits
        self.retries = retries
        from lrl.reaper import start_reaper

        self.root = tempfile.mkdtemp(prefix="lrl-env-", dir=reachable_tmp())
        os.chmod(self.root, 0o711)
        self.reaper = start_reaper([self.root])  # the folder goes with this process, however its workers end
        EnvPool._count += 1
        as_root = (os.geteuid() == 0) if uid is None else uid
        self.uid_base = (
            UID_BASE + (os.getpid() % 10_000) * 256 + (EnvPool._count % 4) * 64 if as_root else None
        )
        self.level = level
        self.own_root, self.plan = True, None  # the first worker's probe says
        self.lock = threading.Lock()
        self.idle: queue.Queue[_Worker] = queue.Queue()
        self.workers: list[_Worker] = []
        self.closed = False
        self.next_id = 0
        self.stats = {"runs": 0, "retries": 0, "retry_seconds": 0.0, "replaced": 0}
        try:
            first = _Worker(self, 0, probe=True)  # finds out which level works here; the others are told
            self.level, self.notes = first.ready["level"], first.ready["notes"]
            self.own_root, self.plan = first.ready["own_root"], first.ready["plan"]
            if first.ready["uid"] is None:
                self.uid_base = None
            self.workers.append(first)
            self.idle.put(first)
            for i in range(1, n):
                w = _Worker(self, i)
                self.workers.append(w)
                self.idle.put(w)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def uid_of(self, index: int) -> int | None:
        return self.uid_base + index if self.uid_base is not None else None

    def describe(self) -> str:
        """One line: the sandbox level in force, what the probe found, the limits and the workers."""
        lim = self.limits
        as_root = self.uid_base is None and os.geteuid() == 0
        what = levels.isolation(self.level, self.own_root, as_root and self.level == "rlimits")
        uid = " (runs as root)" if as_root else ""
        return (
            f"sandbox: {self.level}: {what}{uid}; probe: {'; '.join(self.notes)}; limits: {lim.wall_seconds:g} s "
            f"wall, {lim.cpu_seconds} CPU s, {lim.memory_bytes >> 20} MiB, {lim.processes} processes, "
            f"{lim.file_bytes >> 20} MiB files, {lim.open_files} files; {self.n} env worker(s)"
        )

    def run(
        self, files: dict, module: str, calls: list, expect: list, name: str = "run"
    ) -> tuple[Verdict, int, float]:
        """One sandboxed test run on an idle worker -> (verdict, retries it took, seconds the retries cost)."""
        retries, retry_seconds = 0, 0.0
        while True:
            start = time.monotonic()
            verdict = self._once(files, module, calls, expect, name)
            if not verdict.infrastructure or retries >= self.retries or self.closed:
                with self.lock:
                    self.stats["runs"] += 1 + retries
                    self.stats["retries"] += retries
                    self.stats["retry_seconds"] += retry_seconds
                return verdict, retries, retry_seconds
            retries += 1
            retry_seconds += time.monotonic() - start

    def _once(self, files, module, calls, expect, name) -> Verdict:
        if self.closed:
            return Verdict(harness.START_FAILED, detail="the environment pool is closed")
        worker = self.idle.get()
        with self.lock:
            self.next_id += 1
            rid = self.next_id
        keep = True
        try:
            worker.send(
                {"id": rid, "files": files, "module": module, "calls": calls, "expect": expect, "name": name}
            )
            reply = worker.receive(self.limits.wall_seconds + HUNG_GRACE)
            if reply is None or reply.get("id") != rid:
                kind = harness.WORKER_DIED if worker.ended or not worker.alive else harness.WORKER_HUNG
                keep = False
                return Verdict(
                    kind,
                    detail=f"environment worker {worker.index} {'died' if kind == harness.WORKER_DIED else 'stopped answering'}",
                )
            return Verdict(**reply["verdict"])
        except (OSError, ValueError) as err:
            keep = False
            return Verdict(harness.WORKER_DIED, detail=f"environment worker {worker.index}: {err}")
        finally:
            if keep:
                self.idle.put(worker)
            else:
                self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        if self.closed:
            return
        try:
            fresh = _Worker(self, worker.index)
        except OSError:
            fresh = None
        with self.lock:
            self.stats["replaced"] += 1
            if fresh is not None:
                self.workers[worker.index] = fresh
        if fresh is not None:
            self.idle.put(fresh)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def close(self) -> None:
        if getattr(self, "closed", True):
            return
        self.closed = True
        from lrl.reaper import stop_reaper

        for w in list(getattr(self, "workers", [])):
            w.close()
        remove_tree(self.root)
        stop_reaper(getattr(self, "reaper", None))
