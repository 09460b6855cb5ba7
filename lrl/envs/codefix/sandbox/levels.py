"""Which sandbox level works on this machine: a probe run at each level, and the words for what is in force.

:func:`choose` resolves ``--sandbox`` (``auto``, ``namespaces``, ``rlimits``): it runs :func:`probe` at each
level it may take, best first, and takes the first that gives what it promises. The probe is a tiny sandboxed
run that tries to connect to the loopback, to write into a folder anyone may write to and to read a file
anyone may read, both outside its own folder. Standard library only (the environment workers import it).
"""

from __future__ import annotations

import os
import sys
import tempfile

from lrl.reaper import remove_tree

if __package__:
    from . import kernel
    from .harness import LEVELS, Limits, Sandbox, run
else:  # the environment worker imports the sandbox's modules from their folder
    import kernel
    from harness import LEVELS, Limits, Sandbox, run

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
def read():
    path = os.path.join(os.path.dirname(os.getcwd()), "probe-open", "known")
    try:
        with open(path) as f:
            return "readable" if f.read() == "known" else "changed"
    except OSError:
        return "hidden"
"""


def probe(box: Sandbox) -> tuple[bool, str]:
    """Run a tiny sandbox at this box's level -> (it gives what the level promises, what it found). It tries
    the loopback, a write into a folder anyone may write to, and a read of a file anyone may read, both
    outside its own folder."""
    files = {"probe.py": PROBE}
    calls = ["net()", "outside()", "read()", "os.getuid()"]
    open_dir = os.path.join(box.root, "probe-open")  # anyone may write here: only a read-only mount stops it
    os.makedirs(open_dir, exist_ok=True)
    os.chmod(open_dir, 0o777)
    known = os.path.join(open_dir, "known")
    kernel.write(known, "known")
    os.chmod(known, 0o644)
    try:
        v = run(box, files, "probe", calls, [{"value": None}] * len(calls), "probe", values=True)
    except OSError as err:  # what a filesystem of its own would hold could not be found
        return False, f"the sandbox could not start: {err}"
    finally:
        remove_tree(open_dir)
    if v.values is None:
        return False, v.detail or v.kind
    net, disk, read, uid = v.values
    found = f"network {net}, writes outside its folder {disk}, files outside its folder {read}, uid {uid}"
    promised = box.level != "namespaces" or (net == "closed" and disk == "protected")
    if box.private_files:
        promised = promised and read == "hidden"
    return promised, found


def isolation(level: str, own_root: bool, as_root: bool = False) -> str:
    """What a level in force isolates, in words for the run's first line."""
    readable = "candidates can read what the machine lets other users read, expected values included"
    if as_root:
        readable = "candidates run as root: they can read and write everything, expected values included"
    if level == "namespaces" and own_root:
        return ("own network, PID and mount namespaces, a filesystem of its own (the interpreter read-only, its "
                "folder writable, nothing else of the machine), unprivileged user")  # fmt: skip
    if level == "namespaces":
        return (f"own network, PID and mount namespaces, the machine's filesystem read-only but its folder "
                f"(a filesystem of its own does not work here: {readable}), unprivileged user")  # fmt: skip
    return f"resource limits and a process group only (no network or filesystem isolation: {readable})"


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

    ``auto`` takes namespaces with a filesystem of their own where they work here, else namespaces on the
    machine's filesystem read-only, else rlimits; a level asked for by name that does not work (namespaces: with
    a filesystem of its own) raises OSError with the reason."""
    if level not in LEVELS:
        raise ValueError(f"--sandbox must be one of {', '.join(LEVELS)}; got {level!r}")
    notes = []
    rl_uid = uid if uid is not None and accessible_to_others(sys.executable) else None
    tries = {
        "auto": [("namespaces", True), ("namespaces", False), ("rlimits", False)],
        "namespaces": [("namespaces", True)],
        "rlimits": [("rlimits", False)],
    }[level]
    for name, own_root in tries:
        if name == "rlimits" and uid is not None and rl_uid is None:  # why rlimits runs as this user
            notes.append(f"the interpreter {os.path.realpath(sys.executable)} is not readable by other users")
        box = Sandbox(root, name, limits, uid if name == "namespaces" else rl_uid, own_root=own_root)
        ok, found = probe(box)
        if ok:
            return box, notes + [found]
        what = "namespaces with a filesystem of their own" if box.private_files else name
        if name == "namespaces" and not own_root:
            what = "namespaces on the machine's filesystem"
        notes.append(f"{what} do{'es' if name == 'rlimits' else ''} not work here ({found})")
        if level != "auto":
            raise OSError("; ".join(notes))
    raise OSError("; ".join(notes))
