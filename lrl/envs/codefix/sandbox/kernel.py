"""The kernel's interfaces the sandbox uses, through libc: namespaces, mounts, pivot_root, prctl.

Standard library only (the environment workers import it without torch). Every call raises OSError with the
kernel's reason when it fails. ``LRL_SANDBOX_REFUSE`` (a comma-separated list: ``namespaces``, ``root``) makes
the named features fail here as a kernel that does not allow them would, so that the levels' fallbacks can be
seen working on a machine that allows everything.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_RECURSIVE, AT_FDCWD = 0x1, 0x2, 0x8000, -100
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (the unified syscall table)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217, "i686": 217,
                  "armv7l": 218}  # fmt: skip
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
REFUSE = "LRL_SANDBOX_REFUSE"

_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def refused(feature: str) -> bool:
    """Whether ``LRL_SANDBOX_REFUSE`` names `feature` (the kernel is to be taken as refusing it)."""
    return feature in os.environ.get(REFUSE, "").split(",")


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    if refused("namespaces"):
        raise OSError(errno.EPERM, f"unshare: refused ({REFUSE})")
    _check(libc().unshare(flags), "unshare")


def mount(source, target, fstype, flags, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    result = libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(result, f"mount {target}")


def umount_detach(target: str) -> None:
    _check(libc().umount2(target.encode(), MNT_DETACH), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: no syscall number known for {platform.machine()}")
    _check(libc().syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]  # fmt: skip


def mount_setattr(path: str, flags: int, attr_set: int = 0, attr_clr: int = 0) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    res = libc().syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    _check(res, f"mount_setattr {path}")


def pdeathsig() -> None:
    """Die with SIGKILL when the parent does (cleared by a change of user: set it again after one)."""
    libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_subreaper() -> bool:
    """Adopt this process's orphaned descendants (instead of init) -> whether the kernel agreed."""
    return libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def children() -> list[int]:
    """This process's children (with the subreaper set: also every orphaned descendant, adopted)."""
    found: list[int] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                found += [int(x) for x in f.read().split()]
        return found
    except FileNotFoundError:  # a kernel without the children file: the parent of every process
        me = str(os.getpid())
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        found.append(int(pid))
            except (OSError, IndexError):
                pass
        return found


def reap_children() -> int:
    """Kill and reap every child of this process until none is left -> how many; a child's children come to
    this process as it dies (the subreaper), so with it set nothing a run started outlives this call."""
    count = 0
    while True:
        pids = children()
        if not pids:
            return count
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        count += len(pids)
