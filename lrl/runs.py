"""Where a run's files go, which run a resume continues, and the checks on every path a user gives.

A run owns one folder, ``<log_dir>/<run_name>/version_N/``: its TensorBoard events and ``checkpoints/``. Folders
are claimed with an atomic ``mkdir`` and held with a lock for the life of the run, so two runs, one after the
other or at the same time, never share a file. ``--resume last`` continues the newest run of ``<log_dir>/
<run_name>`` that was written with the same settings and is not in use; ``--resume PATH`` takes a run folder
or a checkpoint file. A resumed run writes into its own folder again, and TensorBoard drops the points the
killed run wrote after its checkpoint, so the curve is one line without overlapping steps.

Nothing a user points lrl at is replaced: the history file is appended to (and must be an lrl history when it
already holds something), a path that is a directory where a file is wanted (or the reverse), a device, a pipe,
or a link to one, is refused before the run starts. A ``--checkpoint-dir`` is locked for the life of the run
like a run folder, so a second run cannot write into it at the same time.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lrl.config import ConfigError
from lrl.pathkinds import VIRTUAL
from lrl.pathkinds import kind as _kind
from lrl.sections import PolicyOptions, RunOptions

HISTORY_PREFIX = (
    64 * 2**10
)  # bytes of an existing history file that are checked: a huge file is not read whole
RUN_DIR_ENV = "LRL_RUN_DIR"  # rank 0's run folder, for the other ranks of a data-parallel run


@dataclass
class RunFolder:
    """The folder a run writes to, and where it continues from when it resumes."""

    path: Path
    version: int
    checkpoint: Path | None = None  # the checkpoint this run resumes from
    step: int = 0  # the step it resumes at (0 for a fresh run)
    note: str = ""  # what happened to --resume, for the console
    _lock: int | None = None
    _checkpoint_dir_lock: int | None = None  # held on --checkpoint-dir when the run has one

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def release(self) -> None:
        """Let go of the run folder's lock and the checkpoint folder's (the run has ended)."""
        for name in ("_lock", "_checkpoint_dir_lock"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


# -- paths a user gives -----------------------------------------------------------------------------
def check_output(name: str, value: str | None, want: str) -> list[str]:
    """Problems of a path lrl will write (`want` 'file' or 'dir'): it must be one, or be creatable."""
    if value is None:
        return []
    try:
        p = Path(value).expanduser()
        resolved = p.resolve()
    except (OSError, RuntimeError, ValueError) as err:
        return [f"{name}: {value!r} cannot be used ({err})"]
    if any(str(resolved) == v or str(resolved).startswith(v + "/") for v in VIRTUAL):
        return [
            f"{name}: {value!r} is under /{resolved.parts[1]}, a kernel file system, not a place for files"
        ]
    kind = _kind(p)
    if kind == "missing":
        parent = p.parent
        while _kind(parent) == "missing":
            parent = parent.parent
        if _kind(parent) != "dir":
            found = {"file": "a file"}.get(_kind(parent), _kind(parent))
            return [f"{name}: {value!r} cannot be created: {str(parent)!r} is {found}, not a folder"]
        if not os.access(parent, os.W_OK | os.X_OK):
            return [f"{name}: {value!r} cannot be created: {str(parent)!r} is not writable"]
        return []
    if kind != want:
        wanted = "a file" if want == "file" else "a folder"
        found = {"file": "a file", "dir": "a folder"}.get(kind, kind)
        return [f"{name}: {value!r} is {found}; it must be {wanted}"]
    if not os.access(p, os.W_OK):
        return [f"{name}: {value!r} is not writable"]
    return []


def check_input(name: str, value: str | None, want: str) -> list[str]:
    """Problems of a path lrl will read (`want` 'file', 'dir' or 'any')."""
    if value is None:
        return []
    kind = _kind(Path(value))
    if kind == "missing":
        return [f"{name}: {value!r} does not exist"]
    found = {"file": "a file", "dir": "a folder"}.get(kind, kind)
    if want != "any" and kind != want:
        return [f"{name}: {value!r} is {found}; it must be {'a file' if want == 'file' else 'a folder'}"]
    if kind not in ("file", "dir"):
        return [f"{name}: {value!r} is {found}; it must be a file or a folder"]
    return []


def check_paths(run: RunOptions, policy: PolicyOptions) -> None:
    """Every path option, checked before anything is built; one ConfigError listing every problem."""
    problems = check_output("log_dir", run.log_dir, "dir") + check_output(
        "checkpoint_dir", run.checkpoint_dir, "dir"
    )
    problems += check_output("history_file", run.history_file, "file") or check_history(run.history_file)
    if run.resume not in (None, "last"):
        problems += check_input("resume", run.resume, "any")
    for name in ("model", "tokenizer"):
        problems += check_input(name, getattr(policy, name), "dir")
    if run.checkpoint_dir is not None and not _another_rank(run) and _in_use(Path(run.checkpoint_dir)):
        problems.append(_in_use_message(run.checkpoint_dir))
    if run.checkpoint_dir is not None and not run.overwrite and run.resume is None:
        existing = Path(run.checkpoint_dir) / "last.ckpt"
        if existing.exists():
            problems.append(
                f"checkpoint_dir: {run.checkpoint_dir!r} already holds last.ckpt; resume it "
                "(--resume last), choose another folder, or replace it with --overwrite"
            )
    if problems:
        raise ConfigError("; ".join(problems))


# how every history record starts (lrl.checkpoint.HistoryFile writes json.dumps of a dict whose first key is step)
RECORD_START = b'{"step": '


def cut_record(line: bytes) -> bool:
    """A line that is the start of a history record cut short (a kill in the middle of a write, which a later run
    terminated with its own newline): lrl's own, never a sign of a foreign file."""
    return line.startswith(RECORD_START) or RECORD_START.startswith(line)


def check_history(value: str | None) -> list[str]:
    """Problems of an existing history file: one that holds anything must be an lrl history (every line a JSON
    object with a "step", or a record that a kill cut short), so that a user's own file is never appended to by
    mistake. Only the first HISTORY_PREFIX bytes are read; a last line without its newline (a kill in the middle
    of a write, or the end of the prefix) is not judged when complete lines come before it."""
    if value is None or _kind(Path(value)) != "file":
        return []
    try:
        with open(value, "rb") as f:
            head = f.read(HISTORY_PREFIX)
    except OSError as err:
        return [f"history_file: {value!r} cannot be read ({err.strerror})"]
    lines = head.split(b"\n")
    if len(lines) > 1 and not head.endswith(b"\n"):
        lines = lines[:-1]
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            record = None
        if not (isinstance(record, dict) and "step" in record) and not (record is None and cut_record(line)):
            return [
                f"history_file: {value!r} is not an lrl history (line {number} is not a JSON object with a "
                '"step" key); lrl appends to a history file and leaves any other file alone: give a new '
                "path or an existing history"
            ]
    return []


# -- the run folder ---------------------------------------------------------------------------------
def _lock(folder: Path, create: bool = True) -> int | None:
    """Hold <folder>/.lock for the life of this process; None when another live process holds it (or, with
    ``create`` false, when there is no lock file at all)."""
    try:
        fd = os.open(folder / ".lock", os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _in_use(folder: Path) -> bool:
    """Whether a live process holds <folder>/.lock now (the lock is tried, then let go at once)."""
    if not (folder / ".lock").is_file():
        return False
    try:
        fd = _lock(folder, create=False)
    except OSError:  # a lock file this user cannot open: whether it is held cannot be told
        return False
    if fd is not None:
        os.close(fd)
    return fd is None


def _in_use_message(checkpoint_dir: str) -> str:
    return (
        f"checkpoint_dir: {checkpoint_dir!r} is in use by another run that is still going (its .lock is "
        "held); give each run its own --checkpoint-dir, or wait for that run to end"
    )


def _another_rank(run: RunOptions) -> bool:
    """This process is a second rank of rank 0's data-parallel run (it shares rank 0's folders and locks). A
    run of one process is always rank 0, whatever LOCAL_RANK and LRL_RUN_DIR it inherited from a parent."""
    return (
        run.world_size > 1 and bool(os.environ.get(RUN_DIR_ENV)) and os.environ.get("LOCAL_RANK", "0") != "0"
    )


def _hold_checkpoint_dir(run: RunOptions) -> int | None:
    """Lock --checkpoint-dir for the life of the run (None without one); ConfigError when a live run has it."""
    if run.checkpoint_dir is None:
        return None
    folder = Path(run.checkpoint_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _lock(folder)
    except OSError as err:
        raise ConfigError(
            f"checkpoint_dir: {run.checkpoint_dir!r} cannot be locked ({err.strerror})"
        ) from None
    if fd is None:
        raise ConfigError(_in_use_message(run.checkpoint_dir))
    return fd


def _versions(base: Path) -> list[tuple[int, Path]]:
    """The version_N folders of a run name, newest first."""
    out = []
    if base.is_dir():
        for child in base.iterdir():
            if child.name.startswith("version_") and child.name[8:].isdigit() and child.is_dir():
                out.append((int(child.name[8:]), child))
    return sorted(out, reverse=True)


def new_folder(run: RunOptions) -> RunFolder:
    """Claim the next free version_N folder of <log_dir>/<run_name> (atomic mkdir, then a lock)."""
    base = Path(run.log_dir) / run.run_name
    try:
        base.mkdir(parents=True, exist_ok=True)
        version = (_versions(base)[0][0] + 1) if _versions(base) else 0
        while True:
            path = base / f"version_{version}"
            try:
                path.mkdir()
            except FileExistsError:
                version += 1
                continue
            return RunFolder(path, version, _lock=_lock(path))
    except OSError as err:
        raise ConfigError(
            f"log_dir: cannot create a run folder under {str(base)!r} ({err.strerror})"
        ) from None


def checkpoint_info(path: Path) -> tuple[int, Path | None]:
    """(the step a checkpoint was written at, the run folder that wrote it when it recorded one)."""
    from lrl.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    state = ckpt.get("lrl")
    run = state.get("run_dir") if isinstance(state, dict) else None
    return int(ckpt.get("global_step", 0)), Path(run) if run else None


def checkpoint_step(path: Path) -> int:
    return checkpoint_info(path)[0]


def open_run(run: RunOptions, check_resume: Callable[[str], None]) -> RunFolder:
    """The folder this run writes to: a new one, or, when resuming, the folder of the checkpoint's run.
    `check_resume(path)` raises ConfigError for a checkpoint this run may not continue
    (:func:`lrl.checkpoint.check_resume` with the run's config)."""
    if _another_rank(run):  # another rank of rank 0's run
        path = Path(os.environ[RUN_DIR_ENV]).expanduser()
        if not (path.is_dir() and path.name.startswith("version_") and path.name[8:].isdigit()):
            raise ConfigError(
                f"{RUN_DIR_ENV}: {str(path)!r} is not a run folder (version_N); it is set by rank 0 of a "
                "data-parallel run for its other ranks; unset it to start a run of your own"
            )
        ckpt = path / "checkpoints" / "last.ckpt"
        resumed = run.resume is not None and ckpt.is_file()
        return RunFolder(
            path, int(path.name[8:]), ckpt if resumed else None, checkpoint_step(ckpt) if resumed else 0
        )
    held = _hold_checkpoint_dir(run)
    folder = None
    try:
        folder = _resume_folder(run, check_resume) if run.resume is not None else None
        if folder is None:
            folder = new_folder(run)
            folder.note = f"started fresh in {folder.path}"
            if run.resume == "last":
                folder.note = (
                    f"resume last: no run of {Path(run.log_dir) / run.run_name} to continue; " + folder.note
                )
        folder._checkpoint_dir_lock = held
        if folder.checkpoint is not None and run.max_steps < folder.step:
            raise ConfigError(
                f"max_steps: {run.max_steps} is below the step of the checkpoint it resumes "
                f"({folder.step}, {folder.checkpoint}); give --max-steps {folder.step} or more"
            )
    except BaseException:
        if folder is not None:
            folder.release()
        if held is not None and (folder is None or folder._checkpoint_dir_lock is None):
            os.close(held)
        raise
    os.environ[RUN_DIR_ENV] = str(folder.path)
    return folder


def _resume_folder(run: RunOptions, check_resume: Callable[[str], None]) -> RunFolder | None:
    """The run a --resume continues (None: 'last' found none), locked; a clear error for anything else."""
    if run.resume == "last":
        return _resume_last(run, check_resume)
    path = Path(run.resume)
    ckpt = (
        path
        if path.is_file()
        else next((c for c in (path / "checkpoints" / "last.ckpt", path / "last.ckpt") if c.is_file()), None)
    )
    if ckpt is None:
        raise ConfigError(
            f"resume: {run.resume!r} is a folder without a checkpoint (no checkpoints/last.ckpt "
            "or last.ckpt in it); give a run folder, a checkpoint file, or 'last'"
        )
    check_resume(str(ckpt))
    folder = _claim(ckpt, run)
    if folder is None:
        raise ConfigError(
            f"resume: {str(ckpt)!r} belongs to a run that is still going (its folder is locked)"
        )
    return folder


def _resume_last(run: RunOptions, check_resume: Callable[[str], None]) -> RunFolder | None:
    """The newest checkpoint of <log_dir>/<run_name> (--checkpoint-dir's first), locked; None when there is
    none to continue. One that a live run holds is left to it; the newest of the others must be resumable:
    one that cannot be read or was written with other settings is an error, never a silent fresh start."""
    base = Path(run.log_dir) / run.run_name
    candidates = [p / "checkpoints" / "last.ckpt" for _, p in _versions(base)]
    if run.checkpoint_dir is not None:  # this run holds that folder's lock already (open_run)
        candidates.insert(0, Path(run.checkpoint_dir) / "last.ckpt")
    in_use = []
    for ckpt in [c for c in candidates if c.is_file()]:
        if ckpt.parent.name == "checkpoints" and _in_use(ckpt.parent.parent):
            in_use.append(str(ckpt))
            continue
        try:
            check_resume(str(ckpt))
        except ConfigError as err:
            raise ConfigError(
                f"{err} (it is the newest checkpoint of {str(base)!r} that --resume last would continue; "
                "resume another with --resume PATH, or leave out --resume to start fresh)"
            ) from None
        folder = _claim(ckpt, run)
        if folder is not None:
            return folder
        in_use.append(str(ckpt))  # claimed by another run between the check and the lock
    if in_use:
        print(
            f"resume last: left {len(in_use)} checkpoint(s) in use by a live run alone: {', '.join(in_use)}"
        )
    return None


def _claim(ckpt: Path, run: RunOptions) -> RunFolder | None:
    """Lock the run folder a checkpoint belongs to (its own, or a new one when it lives elsewhere)."""
    step, recorded = checkpoint_info(ckpt)
    own = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else recorded  # its own run's folder
    if own is None or not own.is_dir() or not own.name.startswith("version_") or not own.name[8:].isdigit():
        folder = new_folder(run)
    else:
        lock = _lock(own)
        if lock is None:
            return None
        folder = RunFolder(own, int(own.name[8:]), _lock=lock)
    folder.checkpoint = ckpt
    folder.step = step
    folder.note = f"resumed from step {folder.step} of {ckpt}; writing to {folder.path}"
    return folder


def clean_run_temporaries(run: RunOptions) -> list[Path]:
    """The temporary files of killed checkpoint writes in every run folder of <log_dir>/<run_name> that no live
    run holds (a run killed during its first write has no checkpoint, so nothing resumes that folder)."""
    removed = []
    for _, folder in _versions(Path(run.log_dir) / run.run_name):
        if not _in_use(folder):
            removed += clean_stale_temporaries(folder / "checkpoints")
    return removed


def clean_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files of checkpoint writes whose process died (their pid is in the name)."""
    removed = []
    for tmp in folder.glob(".*.tmp") if folder.is_dir() else []:
        parts = tmp.name.split(".")
        pid = int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else None
        if pid is None or _alive(pid):
            continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
