"""One sandboxed test run: a fresh folder, a new process group, resource limits, and the kernel's isolation where
the machine allows it; the verdict decided here, from values the sandbox reports, against expectations it never sees.

Levels (:data:`LEVELS`, ``--sandbox``):

- ``namespaces``: a network namespace of its own (no interface up: every connect fails, loopback included), a PID
  namespace (the run is process 2 under an init of ours; when that init ends, the kernel kills every process of
  the namespace, however it detached), a mount namespace in which the whole filesystem is read-only except the
  sandbox folder, an unprivileged user id (when started as root: a user id of its own per worker, no
  capabilities; otherwise a user namespace), and the resource limits below;
- ``rlimits``: the resource limits, a process group killed as a whole, a fresh folder, and (as root, where the
  interpreter is readable by others) the unprivileged user id, whose processes are all killed after the run. No
  network isolation, no read-only filesystem: resource limits are not a security boundary.

:func:`probe` finds out which level works here by running a tiny sandbox that tries the network and a write
outside its folder. Standard library only: the environment workers import this file without torch.
"""

from __future__ import annotations

import ctypes
import errno
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

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD = 0x1, 0x8000, -100
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (the unified syscall table)
PR_SET_PDEATHSIG = 1


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

    def __post_init__(self):
        if self.level not in ("namespaces", "rlimits"):
            raise ValueError(f"sandbox level must be namespaces or rlimits; got {self.level!r}")
        self.python = self.python or os.path.realpath(sys.executable)


# -- the kernel's interfaces, through libc ---------------------------------------------------------------
_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(libc().unshare(flags), "unshare")


def _mount(source, target, fstype, flags) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(
        libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), None), f"mount {target}"
    )


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]  # fmt: skip


def _mount_setattr(path: str, flags: int, attr_set: int = 0, attr_clr: int = 0) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    res = libc().syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    _check(res, f"mount_setattr {path}")


def _pdeathsig() -> None:
    libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


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
            python = _enter_namespaces(box, folder, report)  # returns in the run's own process (pid 2)
            env["LD_LIBRARY_PATH"] = os.path.join(box.root, "python", "lib")  # its runpath may be unreachable
        _limit(box.limits)
        if box.uid is not None:
            os.setgroups([])
            os.setgid(box.uid)
            os.setuid(box.uid)
        _pdeathsig()  # cleared by the change of user: set again, so the run dies with its parent
        os.chdir(folder)
        env.update(PATH="/usr/bin:/bin", HOME=folder, TMPDIR=folder, PYTHONHASHSEED="0", LANG="C.UTF-8")
        os.execve(python, [python, "-I", "-S", "-B", os.path.join(folder, "runner.py"), module], env)
    except BaseException as err:  # noqa: BLE001 (anything before exec is the harness's failure)
        try:
            os.write(report, f"setup {type(err).__name__}: {err}\n".encode())
        finally:
            os._exit(SETUP_FAILED)


def _enter_namespaces(box: Sandbox, folder: str, report: int) -> str:
    """New user (if not root), mount, network and PID namespaces; an init of ours waits for the run and reports
    its status. Returns, in the run's process, the interpreter's path inside the new mount namespace."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if uid != 0:
        _unshare(CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _unshare(flags)
    init = os.fork()  # process 1 of the new PID namespace
    if init:
        _pdeathsig()
        _, status = os.waitpid(init, 0)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    _pdeathsig()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    home = _python_home(box.python)
    inner_home = os.path.join(box.root, "python")
    _mount(home, inner_home, None, MS_BIND | MS_REC)
    _mount(folder, folder, None, MS_BIND)
    _mount_setattr("/", AT_RECURSIVE, attr_set=MOUNT_ATTR_RDONLY)
    _mount_setattr(folder, 0, attr_clr=MOUNT_ATTR_RDONLY)
    run = os.fork()  # process 2: the run; process 1 stays to report its end
    if run:
        _, status = os.waitpid(run, 0)
        os.write(report, f"status {status}\n".encode())
        os._exit(0)
    _pdeathsig()
    return os.path.join(inner_home, os.path.relpath(box.python, home))


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
    folder = tempfile.mkdtemp(prefix=f"{name}-", dir=box.root)
    start = time.monotonic()
    try:
        for rel, text in files.items():
            path = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write(path, text)
        shutil.copyfile(RUNNER, os.path.join(folder, "runner.py"))
        _write(
            os.path.join(folder, "tests.json"), json.dumps(calls)
        )  # a record of the calls; never read back
        if box.uid is not None:
            for dirpath, _, names in os.walk(folder):
                os.chown(dirpath, box.uid, box.uid)
                for n in names:
                    os.chown(os.path.join(dirpath, n), box.uid, box.uid)
        return _run_in(box, folder, module, calls, expect, start, values)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_in(box, folder, module, calls, expect, start, values=False) -> Verdict:
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
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for fd in streams:
        os.close(fd)
    if len(streams[result_r]) >= RESULT_BYTES:
        streams[result_r] = bytearray(b"overflow\n")  # more than any honest report: not a result
    verdict = judge(box, status, timed_out, streams[result_r], streams[report_r], expect, cpu)
    verdict.seconds = time.monotonic() - start
    verdict.cpu_seconds = cpu
    verdict.output = bytes(streams[out_r][: box.limits.output_bytes]).decode("utf-8", "replace")
    if values and verdict.kind in (PASSED, FAILED):
        verdict.values = [json.loads(line).get("value") for line in streams[result_r].splitlines()][
            : len(calls)
        ]
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
    box: Sandbox, status, timed_out: bool, results: bytes, report: bytes, expect: list, cpu: float = 0.0
) -> Verdict:
    """The verdict from the run's end, its result lines and its report (see the module)."""
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
    got: dict[int, dict] = {}
    done = None
    for raw in results.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(raw)
        except ValueError:
            return Verdict(ERROR, 0, total, detail="its result channel held something that is not a result")
        if not isinstance(item, dict):
            return Verdict(ERROR, 0, total, detail="its result channel held something that is not a result")
        if "done" in item:
            done = item["done"]
            continue
        i = item.get("i")
        if not isinstance(i, int) or not 0 <= i < total or i in got:
            return Verdict(ERROR, 0, total, detail="its result channel held a result twice or out of range")
        got[i] = item
    code = os.WEXITSTATUS(run_status)
    if done != total or len(got) != total:
        return Verdict(ERROR, 0, total, detail=f"ended (exit {code}) after {len(got)} of {total} results")
    if code != 0:
        return Verdict(ERROR, 0, total, detail=f"reported every result, then exited {code}")
    passed = sum(_matches(got[i], expect[i]) for i in range(total))
    kind = PASSED if passed == total else FAILED
    return Verdict(kind, passed, total, detail="" if kind == PASSED else f"{total - passed} of {total} wrong")


def _matches(result: dict, expected: dict) -> bool:
    if "raises" in expected:
        return result.get("raised") == expected["raises"]
    if "value" not in result:
        return False
    return _equal(result["value"], expected["value"])


def _equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# -- which level works here ------------------------------------------------------------------------------
PROBE = """
import os, socket
def net():
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.connect(("127.0.0.1", 9))
        return "open"
    except ConnectionRefusedError:
        return "open"
    except OSError:
        return "closed"
def outside():
    path = os.path.join(os.path.dirname(os.getcwd()), "probe-open", "x")
    try:
        with open(path, "w") as f:
            f.write("x")
        return "writable"
    except OSError:
        return "protected"
"""


def probe(box: Sandbox) -> tuple[bool, str]:
    """Run a tiny sandbox at this box's level -> (it gives what the level promises, what it found)."""
    files = {"probe.py": PROBE}
    calls = ["net()", "outside()", "os.getuid()"]
    open_dir = os.path.join(box.root, "probe-open")  # anyone may write here: only a read-only mount stops it
    os.makedirs(open_dir, exist_ok=True)
    os.chmod(open_dir, 0o777)
    try:
        v = run(box, files, "probe", calls, [{"value": None}] * 3, "probe", values=True)
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)
    if v.values is None:
        return False, v.detail or v.kind
    net, disk, uid = v.values
    found = f"network {net}, writes outside its folder {disk}, uid {uid}"
    promised = box.level != "namespaces" or (net == "closed" and disk == "protected")
    return promised, found


def accessible_to_others(path: str, traverse_only: bool = False) -> bool:
    """Whether a user with no rights of its own can reach and read `path` (every folder above it traversable;
    with `traverse_only`, `path` itself too)."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        st = os.stat(os.sep.join(parts[:i]) or os.sep)
        last = i == len(parts) and not traverse_only
        if not st.st_mode & (0o004 if last else 0o001):
            return False
    return True


def make_root() -> str:
    """The folder under which runs' folders are made: reachable, not listable, by the sandboxes' users."""
    root = tempfile.mkdtemp(prefix="lrl-sandbox-")
    os.chmod(root, 0o711)
    os.mkdir(os.path.join(root, "python"), 0o755)
    return root


def choose(level: str, root: str, limits: Limits, uid: int | None) -> tuple[Sandbox, list[str]]:
    """The sandbox a ``--sandbox`` value asks for, probed -> (sandbox, lines that say what is in force).

    ``auto`` takes namespaces where they work here, else rlimits; a level asked for by name that does not work
    raises OSError with the reason."""
    if level not in LEVELS:
        raise ValueError(f"--sandbox must be one of {', '.join(LEVELS)}; got {level!r}")
    notes = []
    rl_uid = uid if uid is not None and accessible_to_others(sys.executable) else None
    if uid is not None and rl_uid is None:
        notes.append(f"the interpreter {os.path.realpath(sys.executable)} is not readable by other users")
    wanted = ["namespaces", "rlimits"] if level == "auto" else [level]
    for name in wanted:
        box = Sandbox(root, name, limits, uid if name == "namespaces" else rl_uid)
        ok, found = probe(box)
        if ok:
            return box, notes + [found]
        notes.append(f"{name} does not work here ({found})")
        if level != "auto":
            raise OSError(errno.EPERM, "; ".join(notes))
    raise OSError(errno.EPERM, "; ".join(notes))
