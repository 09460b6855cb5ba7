"""One sandboxed test run: a fresh folder, a new process group, resource limits, and the kernel's isolation where
the machine allows it; the verdict decided here, from values the sandbox reports, against expectations it never sees.

Levels (:data:`LEVELS`, ``--sandbox``):

- ``namespaces``: a network namespace of its own (no interface up: every connect fails, loopback included), a PID
  namespace (the run is process 2 under an init of ours; when that init ends, the kernel kills every process of
  the namespace, however it detached), a mount namespace with a filesystem of its own (:mod:`fsroot`: the
  interpreter and its standard library read-only, the run's folder writable, a /proc of its PID namespace,
  nothing else of the machine), an unprivileged user id (when started as root: a user id of its own per worker,
  no capabilities; otherwise a user namespace), and the resource limits below. Where the kernel allows the
  namespaces but not a root of their own, ``auto`` takes them with the machine's filesystem read-only instead
  (``own_root`` false): candidates can then read what the machine lets other users read;
- ``rlimits``: the resource limits, a process group killed as a whole, a fresh folder, and (as root, where the
  interpreter is readable by others) the unprivileged user id, whose processes are all killed after the run. No
  network isolation, no filesystem isolation: resource limits are not a security boundary.

At every level, an environment worker adopts what its runs leave (:func:`adopt_orphans`, a child subreaper) and
kills it when the run ends, and a run's folder is removed without recursion, however deep the candidate made it.
:mod:`levels` finds out which level works here. Standard library only: the environment workers import this
file without torch.
"""

from __future__ import annotations

import json
import math
import os
import resource
import selectors
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from lrl.reaper import remove_tree

if __package__:
    from . import fsroot, kernel, results
else:  # the environment worker imports the sandbox's modules from their folder
    import fsroot
    import kernel
    import results

LEVELS = ("auto", "namespaces", "rlimits")
RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
SETUP_FAILED = 125  # exit code of a sandbox whose setup failed before the candidate ran
RESULT_BYTES = 4 << 20  # the most a result channel may carry

# verdicts: the agent's (scored by the reward) and the infrastructure's (no gradient, task carried)
PASSED, FAILED, ERROR, TIMEOUT = "passed", "failed", "error", "timeout"
AGENT_KINDS = (PASSED, FAILED, ERROR, TIMEOUT)
START_FAILED, WORKER_DIED, HARNESS_OOM, WORKER_HUNG = (
    "start_failed",
    "worker_died",
    "harness_oom",
    "worker_hung",
)
INFRA_KINDS = (START_FAILED, WORKER_DIED, HARNESS_OOM, WORKER_HUNG)
_ADOPTING = []  # [True] once this process adopts its runs' orphans (an environment worker)


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use. ``wall_seconds`` is the test timeout: past it the run is killed as a whole."""

    wall_seconds: float = 2.0
    cpu_seconds: int = 2
    memory_bytes: int = 512 << 20  # address space
    file_bytes: int = 8 << 20  # largest file it may write
    open_files: int = 64
    processes: int = 32  # per user id: bounds a fork storm
    output_bytes: int = 16 << 10  # stdout and stderr kept (the rest is read and dropped)

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"sandbox limit {name} must be a positive number; got {value!r}")


@dataclass
class Verdict:
    """What one sandboxed run came to. ``kind`` is one of AGENT_KINDS or INFRA_KINDS."""

    kind: str
    passed: int = 0
    total: int = 0
    seconds: float = 0.0  # wall time of the sandbox, start to end
    cpu_seconds: float = 0.0  # user + system time of the sandbox's processes
    detail: str = ""  # why it failed, in one line
    output: str = ""  # what it printed, up to the output limit
    values: list | None = None  # the reported values, when the caller asked for them (the probe)

    @property
    def infrastructure(self) -> bool:
        return self.kind in INFRA_KINDS

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Sandbox:
    """Where and how runs happen: a root folder for the runs' folders, the level, the limits, the user id."""

    root: str
    level: str = "rlimits"
    limits: Limits = field(default_factory=Limits)
    uid: int | None = None  # run as this unprivileged user id (as root); None: as ourselves
    python: str = ""  # the interpreter; default: this one
    own_root: bool = True  # namespaces: a filesystem of its own (False: the machine's, read-only)
    plan: fsroot.Plan | None = None  # what that filesystem holds (found on first use)

    def __post_init__(self):
        if self.level not in ("namespaces", "rlimits"):
            raise ValueError(f"sandbox level must be namespaces or rlimits; got {self.level!r}")
        self.python = self.python or os.path.realpath(sys.executable)

    @property
    def private_files(self) -> bool:
        """Whether a run sees a filesystem of its own (else: what the machine lets its user read)."""
        return self.level == "namespaces" and self.own_root

    def root_plan(self) -> fsroot.Plan:
        if self.plan is None:
            self.plan = fsroot.plan(self.python)
        return self.plan


def adopt_orphans() -> bool:
    """Make this process (an environment worker, which starts no other processes) the parent of whatever its
    runs leave behind, so that each run's end kills every process it started -> whether the kernel agreed."""
    if not _ADOPTING and kernel.child_subreaper():
        _ADOPTING.append(True)
    return bool(_ADOPTING)


# -- the processes of one run ----------------------------------------------------------------------------
def _python_home(python: str) -> str:
    """The installation folder of an interpreter: the parent of its bin/."""
    return os.path.dirname(os.path.dirname(python))


def _in_child(box: Sandbox, folder: str, module: str, fds: dict[str, int]) -> None:
    """The sandbox's side of the fork; never returns (exec, or _exit with a line on the report pipe)."""
    report = fds["report_w"]
    try:
        os.setsid()
        os.dup2(fds["stdin_r"], 0)
        os.dup2(fds["out_w"], 1)
        os.dup2(fds["out_w"], 2)
        os.dup2(fds["result_w"], 3)
        os.set_inheritable(3, True)
        keep = {0, 1, 2, 3, report}
        for fd in os.listdir("/proc/self/fd"):
            if int(fd) not in keep:
                try:
                    os.close(int(fd))
                except OSError:
                    pass
        python, env = box.python, {}
        if box.level == "namespaces":
            # returns in the run's own process (pid 2); the interpreter's runpath may be unreachable there
            python, env["LD_LIBRARY_PATH"] = _enter_namespaces(box, folder, report)
        _limit(box.limits)
        if box.uid is not None:
            os.setgroups([])
            os.setgid(box.uid)
            os.setuid(box.uid)
        kernel.pdeathsig()  # cleared by the change of user: set again, so the run dies with its parent
        os.chdir(folder)
        env.update(PATH="/usr/bin:/bin", HOME=folder, TMPDIR=folder, PYTHONHASHSEED="0", LANG="C.UTF-8")
        os.execve(python, [python, "-I", "-S", "-B", os.path.join(folder, "runner.py"), module], env)
    except BaseException as err:  # noqa: BLE001 (anything before exec is the harness's failure)
        try:
            os.write(report, f"setup {type(err).__name__}: {err}\n".encode())
        finally:
            os._exit(SETUP_FAILED)


def _enter_namespaces(box: Sandbox, folder: str, report: int) -> tuple[str, str]:
    """New user (if not root), mount, network and PID namespaces; an init of ours waits for the run and reports
    its status. Returns, in the run's process, the interpreter's path and library path in its filesystem."""
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        kernel.unshare(kernel.CLONE_NEWUSER)
        kernel.write("/proc/self/setgroups", "deny")
        kernel.write("/proc/self/uid_map", f"{uid} {uid} 1")
        kernel.write("/proc/self/gid_map", f"{gid} {gid} 1")
    kernel.unshare(kernel.CLONE_NEWNS | kernel.CLONE_NEWNET | kernel.CLONE_NEWPID)
    init = os.fork()  # process 1 of the new PID namespace
    if init:
        kernel.pdeathsig()
        _, status = os.waitpid(init, 0)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    kernel.pdeathsig()
    staging = os.path.join(box.root, "python")
    if box.own_root:
        fsroot.enter(box.plan, folder, staging)
        python, library_path = box.plan.python, box.plan.library_path
    else:  # the machine's filesystem, read-only but the run's folder
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        home = _python_home(box.python)
        kernel.mount(home, staging, None, kernel.MS_BIND | kernel.MS_REC)
        kernel.mount(folder, folder, None, kernel.MS_BIND)
        kernel.mount_setattr("/", kernel.AT_RECURSIVE, attr_set=kernel.MOUNT_ATTR_RDONLY)
        kernel.mount_setattr(folder, 0, attr_clr=kernel.MOUNT_ATTR_RDONLY)
        python = os.path.join(staging, os.path.relpath(box.python, home))
        library_path = os.path.join(staging, "lib")
    run = os.fork()  # process 2: the run; process 1 stays to report its end
    if run:
        _, status = os.waitpid(run, 0)
        os.write(report, f"status {status}\n".encode())
        os._exit(0)
    kernel.pdeathsig()
    return python, library_path


def _limit(limits: Limits) -> None:
    cpu = int(math.ceil(limits.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _sweep(uid: int) -> None:
    """Kill every process of `uid` (what left the process group): a child that becomes `uid` and signals -1."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def run(
    box: Sandbox,
    files: dict[str, str],
    module: str,
    calls: list[str],
    expect: list,
    name: str = "run",
    values: bool = False,
) -> Verdict:
    """Write `files` into a fresh folder, run the calls against `module` there, and judge -> Verdict.

    `expect` holds, per call, ``{"value": v}`` or ``{"raises": "Name"}``; it stays in this process."""
    if box.private_files:
        box.root_plan()  # found once, before the fork
    folder = tempfile.mkdtemp(prefix=f"{name}-", dir=box.root)
    start = time.monotonic()
    try:
        for rel, text in files.items():
            path = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            kernel.write(path, text)
        shutil.copyfile(RUNNER, os.path.join(folder, "runner.py"))
        kernel.write(
            os.path.join(folder, "tests.json"), json.dumps(calls)
        )  # a record of the calls; never read
        if box.uid is not None:
            for dirpath, _, names in os.walk(folder):
                os.chown(dirpath, box.uid, box.uid)
                for n in names:
                    os.chown(os.path.join(dirpath, n), box.uid, box.uid)
        verdict = _run_in(box, folder, module, calls, expect, start)
        if not values:
            verdict.values = None
        return verdict
    finally:
        remove_tree(folder)  # however deep the candidate made it


def _run_in(box, folder, module, calls, expect, start) -> Verdict:
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    result_r, result_w = os.pipe()
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    fds = {"stdin_r": stdin_r, "out_w": out_w, "result_w": result_w, "report_w": report_w}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        _in_child(box, folder, module, fds)
    for fd in fds.values():
        os.close(fd)
    try:
        os.write(stdin_w, json.dumps(calls).encode())
    except OSError:
        pass  # it ended before reading its calls: judged by what it reported
    os.close(stdin_w)
    streams = {out_r: bytearray(), result_r: bytearray(), report_r: bytearray()}
    caps = {out_r: box.limits.output_bytes, result_r: RESULT_BYTES, report_r: 4096}
    status, timed_out = _watch(box, pid, streams, caps, start)
    if box.uid is not None:
        _sweep(box.uid)
    if _ADOPTING:
        kernel.reap_children()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for fd in streams:
        os.close(fd)
    if len(streams[result_r]) >= RESULT_BYTES:
        streams[result_r] = bytearray(b"overflow\n")  # more than any honest report: not a result
    verdict = judge(box, status, timed_out, bytes(streams[result_r]), bytes(streams[report_r]), expect, cpu)
    verdict.seconds = time.monotonic() - start
    verdict.cpu_seconds = cpu
    verdict.output = bytes(streams[out_r][: box.limits.output_bytes]).decode("utf-8", "replace")
    return verdict


def _watch(
    box: Sandbox, pid: int, streams: dict[int, bytearray], caps: dict[int, int], start: float
) -> tuple[int | None, bool]:
    """Read the pipes until the sandbox ends or the timeout -> (wait status or None, timed out)."""
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ, None)
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, fd)
    deadline = start + box.limits.wall_seconds
    status, timed_out, ended_at = None, False, None
    try:
        while True:
            now = time.monotonic()
            if ended_at is None and now >= deadline:
                timed_out = True
                _kill_group(pid)
                ended_at = now
            # after the end, read what is left for a moment: a process that kept a pipe open is killed by then
            wait = (deadline - now) if ended_at is None else 0.2 - (now - ended_at)
            if wait <= 0 and ended_at is not None:
                break
            events = sel.select(timeout=max(wait, 0.0))
            for key, _ in events:
                if key.data is None:  # the sandbox's first process ended
                    _, status = os.waitpid(pid, 0)
                    sel.unregister(pidfd)
                    _kill_group(pid)  # whatever it left in its group goes with it
                    if _ADOPTING:
                        kernel.reap_children()  # and whatever left the group, so its pipes close now
                    ended_at = time.monotonic()
                    continue
                fd = key.data
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                elif len(streams[fd]) < caps[fd]:  # past its cap a stream is read and dropped
                    streams[fd] += chunk
            if ended_at is not None and len(sel.get_map()) == 0:
                break
        if status is None:
            _, status = os.waitpid(pid, 0)
    finally:
        sel.close()
        os.close(pidfd)
    return status, timed_out


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def judge(
    box: Sandbox, status, timed_out: bool, channel: bytes, report: bytes, expect: list, cpu: float = 0.0
) -> Verdict:
    """The verdict from the run's end, its result channel and its report (see the module). What the channel
    holds is the candidate's: a line the harness cannot parse, or a value it cannot compare, is an error."""
    total = len(expect)
    lines = report.decode("utf-8", "replace").splitlines()
    setup = [line for line in lines if line.startswith("setup ")]
    if setup:
        return Verdict(START_FAILED, 0, total, detail=f"the sandbox could not start: {setup[0][6:]}")
    if timed_out:
        return Verdict(TIMEOUT, 0, total, detail=f"killed after {box.limits.wall_seconds:g} s")
    run_status = status
    if box.level == "namespaces":  # the run's own status, from the namespace's init
        found = [int(line.split()[1]) for line in lines if line.startswith("status ")]
        if not found:
            return Verdict(START_FAILED, 0, total, detail="the sandbox's init ended without the run's status")
        run_status = found[0]
    if os.WIFSIGNALED(run_status):
        sig = os.WTERMSIG(run_status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= box.limits.cpu_seconds):
            return Verdict(TIMEOUT, 0, total, detail=f"past its {box.limits.cpu_seconds} CPU seconds")
        return Verdict(ERROR, 0, total, detail=f"killed by {signal.Signals(sig).name}")
    try:
        got, done = results.parse(channel, total)
    except results.Unparseable as err:
        return Verdict(ERROR, 0, total, detail=f"its result channel held {err}")
    code = os.WEXITSTATUS(run_status)
    if done != total or len(got) != total:
        return Verdict(ERROR, 0, total, detail=f"ended (exit {code}) after {len(got)} of {total} results")
    if code != 0:
        return Verdict(ERROR, 0, total, detail=f"reported every result, then exited {code}")
    passed = 0
    for i in range(total):
        try:
            passed += results.matches(got[i], expect[i])
        except results.Incomparable as err:
            return Verdict(ERROR, 0, total, detail=f"call {i} reported {err}")
    kind = PASSED if passed == total else FAILED
    detail = "" if kind == PASSED else f"{total - passed} of {total} wrong"
    return Verdict(kind, passed, total, detail=detail, values=[got[i].get("value") for i in range(total)])
