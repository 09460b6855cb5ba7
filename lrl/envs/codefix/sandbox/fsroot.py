"""A filesystem of its own for one sandboxed run (the ``namespaces`` level): what the run sees as ``/``.

The root is a fresh tmpfs holding, read-only, what the interpreter needs and nothing else: its executable, its
standard library (without site-packages: the run is ``python -I -S``), the folders of the shared libraries it
and its extension modules load, the dynamic loader (with the chain of links that leads to it), ``/dev/null``,
``/dev/zero``, ``/dev/full``, ``/dev/random`` and ``/dev/urandom``, and a ``/proc`` of the run's own PID
namespace; the run's folder, read-write, at its own path. No task folder, no package data, no other run's
folder, no home: what the machine lets other users read is not there to read. The host's root is detached after
``pivot_root``, so no path leads back to it.

:func:`plan` finds out what to bind, once per process (it starts the interpreter once, importing every
extension module of its standard library, and reads which shared objects it mapped); :func:`enter` builds the
root in the calling process, which must be alone in new mount and PID namespaces. Standard library only.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sysconfig
from dataclasses import dataclass

if __package__:
    from . import kernel
else:  # the environment worker imports the sandbox's modules from their folder
    import kernel

DEVICES = ("null", "zero", "full", "random", "urandom")
MAX_LINKS = 40  # links followed in one path, as the kernel's own bound

LOADED = r"""
import importlib, os, sys, sysconfig
folder = os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload")
for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    if name.endswith(".so") and not name.startswith(("_test", "xx")):
        try:
            importlib.import_module(name.split(".")[0])
        except BaseException:
            pass
for line in open("/proc/self/maps"):
    parts = line.split(None, 5)
    if len(parts) == 6 and parts[5].startswith("/"):
        print(parts[5].rstrip("\n"))
"""


@dataclass(frozen=True)
class Plan:
    """What a run's root holds: links to make, folders and files to bind read-only, folders to cover."""

    python: str  # the executable, as the run starts it
    links: tuple = ()  # (path, target): the links on the way to what is bound
    dirs: tuple = ()  # folders bound read-only at their own path
    files: tuple = ()  # files bound read-only at their own path
    masks: tuple = ()  # folders inside a bound one, covered by an empty one (site-packages)
    library_path: str = ""  # LD_LIBRARY_PATH: the bound folders of shared libraries

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                      for k, v in d.items()})  # fmt: skip


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF executable names (its PT_INTERP), or None (static, or not ELF)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            return None
        wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
        if wide:
            (phoff,), (size, count) = (
                struct.unpack(end + "Q", head[32:40]),
                struct.unpack(end + "HH", head[54:58]),
            )
        else:
            (phoff,), (size, count) = (
                struct.unpack(end + "I", head[28:32]),
                struct.unpack(end + "HH", head[42:46]),
            )
        for i in range(min(count, 256)):
            f.seek(phoff + i * size)
            ph = f.read(size)
            if len(ph) < 32 or struct.unpack(end + "I", ph[:4])[0] != 3:  # PT_INTERP
                continue
            if wide:
                offset, length = struct.unpack(end + "Q", ph[8:16])[0], struct.unpack(end + "Q", ph[32:40])[0]
            else:
                offset, length = struct.unpack(end + "I", ph[4:8])[0], struct.unpack(end + "I", ph[16:20])[0]
            f.seek(offset)
            return f.read(min(length, 4096)).rstrip(b"\0").decode("utf-8", "replace")
    return None


def follow(path: str, links: list) -> str:
    """`path`'s real path; every link met on the way is appended to `links` as (path, target)."""
    parts = [p for p in path.split("/") if p]
    real, hops = "/", 0
    while parts:
        name = parts.pop(0)
        if name == ".":
            continue
        if name == "..":
            real = os.path.dirname(real)
            continue
        here = os.path.join(real, name)
        if os.path.islink(here):
            hops += 1
            if hops > MAX_LINKS:
                raise OSError(f"{path}: more than {MAX_LINKS} links")
            target = os.readlink(here)
            if (here, target) not in links:
                links.append((here, target))
            parts = [p for p in target.split("/") if p] + parts
            real = "/" if target.startswith("/") else real
            continue
        real = here
    return real


def _inside(path: str, folders) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in folders)


def _site_folders(stdlib: str) -> set[str]:
    found = {os.path.join(stdlib, "site-packages"), os.path.join(stdlib, "dist-packages")}
    for scheme in sysconfig.get_scheme_names():
        try:
            paths = sysconfig.get_paths(scheme)
        except (KeyError, ValueError):
            continue
        found.update(paths[k] for k in ("purelib", "platlib") if k in paths)
    return {os.path.realpath(p) for p in found if os.path.isdir(p)}


def plan(python: str) -> Plan:
    """What a run of `python` needs in its root (see the module); raises OSError where it cannot be found."""
    python = os.path.realpath(python)
    try:
        out = subprocess.run([python, "-I", "-S", "-B", "-c", LOADED], capture_output=True, text=True,
                             timeout=60, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/")  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise OSError(f"the interpreter's libraries: {err}") from None
    if out.returncode != 0:
        raise OSError(f"the interpreter's libraries: exit {out.returncode}: {out.stderr.strip()[-200:]}")
    mapped = {p for p in out.stdout.splitlines() if ".so" in os.path.basename(p) and os.path.isfile(p)}
    links: list = []
    stdlib = {follow(sysconfig.get_path(k), links) for k in ("stdlib", "platstdlib")}
    library_dirs = sorted({os.path.dirname(follow(p, links)) for p in mapped})
    wanted = sorted(stdlib | set(library_dirs), key=len)
    dirs: list[str] = []
    for d in wanted:
        if os.path.isdir(d) and not _inside(d, dirs):
            dirs.append(d)
    files = []
    loader = elf_interpreter(python)
    for path in [python] + ([loader] if loader else []):
        real = follow(path, links)
        if not _inside(real, dirs):
            files.append(real)
    site = set().union(*(_site_folders(s) for s in stdlib))
    masks = sorted(p for p in site if _inside(p, dirs))
    links = [(path, target) for path, target in links if not _inside(os.path.dirname(path), dirs)]
    libraries = [d for d in library_dirs if not _inside(d, stdlib)]  # not the extension modules' own folder
    return Plan(python, tuple(links), tuple(dirs), tuple(files), tuple(masks), ":".join(libraries))


def _file(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path, "a"):
        pass


def enter(p: Plan, folder: str, staging: str) -> None:
    """Build the run's root on a tmpfs at `staging` and make it this process's root (see the module). Call it
    alone in new mount and PID namespaces (the /proc mounted is that of this process's PID namespace)."""
    if kernel.refused("root"):
        raise OSError(1, f"a filesystem of its own: refused ({kernel.REFUSE})")
    kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
    kernel.mount(
        "tmpfs", staging, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, "size=1m,nr_inodes=4096,mode=755"
    )
    new = lambda path: staging + path  # noqa: E731  (every path here is absolute)
    for path, target in p.links:
        os.makedirs(new(os.path.dirname(path)), mode=0o755, exist_ok=True)
        if not os.path.lexists(new(path)):
            os.symlink(target, new(path))
    for d in p.dirs:
        os.makedirs(new(d), mode=0o755, exist_ok=True)
        kernel.mount(d, new(d), None, kernel.MS_BIND | kernel.MS_REC)
    for f in p.files:
        _file(new(f))
        kernel.mount(f, new(f), None, kernel.MS_BIND)
    for d in p.masks:
        kernel.mount(
            "tmpfs", new(d), "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, "size=4k,nr_inodes=8,mode=755"
        )
    for name in DEVICES:
        _file(new(f"/dev/{name}"))
        kernel.mount(f"/dev/{name}", new(f"/dev/{name}"), None, kernel.MS_BIND)
    os.makedirs(new(folder), mode=0o755, exist_ok=True)
    kernel.mount(folder, new(folder), None, kernel.MS_BIND)
    os.mkdir(new("/proc"), 0o555)
    kernel.mount("proc", new("/proc"), "proc", kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC)
    os.chdir(staging)
    kernel.pivot_root(".", ".")  # the old root is stacked under the new one, at the same place
    kernel.umount_detach(".")  # and detached: nothing of the host's filesystem is reachable from here on
    os.chdir("/")
    kernel.mount_setattr(
        "/", kernel.AT_RECURSIVE, attr_set=kernel.MOUNT_ATTR_RDONLY | kernel.MOUNT_ATTR_NOSUID
    )
    kernel.mount_setattr(folder, 0, attr_clr=kernel.MOUNT_ATTR_RDONLY)
