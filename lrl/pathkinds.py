"""What a path a user gives is, in a light module (the cache checks of lrl.models and the path checks of lrl.runs
share it; it imports nothing of lrl)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

VIRTUAL = ("/proc", "/sys", "/dev")  # kernel file systems: nothing of a run belongs there


def kind(p: Path) -> str | None:
    """'file', 'dir', 'missing', or what else the path is (a device, a pipe, a socket, a broken link)."""
    try:
        mode = os.stat(p).st_mode  # follows links: a link is what it points to
    except (FileNotFoundError, NotADirectoryError):
        return "a broken link" if os.path.islink(p) else "missing"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a pipe or socket"
