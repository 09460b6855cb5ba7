"""Exact resume: atomic checkpoint files, the per-step history file, and the checks made before resuming.

What a checkpoint holds (so that a run killed after step k and resumed gives the same curves, step for step):
the policy and Adam state (Lightning), the loop counters (Lightning), the module's version counter, shuffle
generator, skipped-batch count, history and the sampler's kept weight versions (``OffPolicyModule``
``on_save_checkpoint``), every rank's rollout and env generators, batch count and carried tasks
(``RolloutDataModule.state_dict``), and each rank's global torch / Python RNG states. It is written in the
step's ``on_train_batch_end``, after the update and the weight sync.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pickle
import shutil
import signal
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lrl.config import OPTIONS, Config, ConfigError
from lrl.errors import OutputError
from lrl.sections import RunOptions
from lrl.stopping import (  # noqa: F401 (StoppedBeforeTraining: re-exported)
    STOP_SIGNALS,
    StoppedBeforeTraining,
    received_at_start,
    say,
    stopped_now_line,
    stopping_notice,
)

# keys that may differ between the run that wrote a checkpoint and the run that resumes it: the options declared
# resumable (lrl.options.option), such as where the run writes, how long it runs and what it logs
RESUMABLE_CHANGES = frozenset(name for name, opt in OPTIONS.items() if opt.resumable)


def atomic_write(path: str | Path, write) -> None:
    """Call `write(file)` on a temporary file next to `path`, fsync it, then rename it over `path`.

    A reader (or a process killed half-way) sees either the old file or the complete new one, never a part.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the pid in the name lets a later run remove what a killed write left (lrl.runs.clean_stale_temporaries)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        full = isinstance(err, (OSError, RuntimeError)) and nearly_full(
            path.parent
        )  # before the space is freed
        Path(tmp).unlink(missing_ok=True)
        if full and not (isinstance(err, OSError) and err.errno == errno.ENOSPC):
            # a writer that reports a failed write in its own words (torch's zip writer): say what it was
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO, but a new file replaces the old one only once it is complete.

    Lightning's own write goes through an fsspec transaction whose temporary file lives in the system temp
    directory; where that is another filesystem the final move is a copy into the target path, and a kill
    during that copy leaves a truncated checkpoint in place of the good one. Here the temporary file is in
    the target's folder, fsynced, and renamed with ``os.replace``.
    """

    written: tuple[str, int] | None = None  # (path, step) of the last checkpoint written whole

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        try:
            atomic_write(path, lambda f: torch.save(checkpoint, f))
        except (OSError, RuntimeError) as err:  # torch's zip writer reports a failed write as a RuntimeError
            raise OutputError(
                f"cannot write the checkpoint {str(path)!r}: {write_failure(path, err)}; the last complete "
                "checkpoint is intact"
            ) from None
        self.written = (str(path), int(checkpoint.get("global_step", 0)))


def nearly_full(folder: Path) -> bool:
    """Whether the file system of `folder` has (almost) no space left: under 256 KiB or 0.1% of it free."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return False
    return usage.free < max(2**18, usage.total // 1000)


def write_failure(path, err: Exception) -> str:
    """Why a write under `path` failed, in words (a full disk is named as one)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    return " ".join(str(err).split())[:200]


class HistoryFile(L.Callback):
    """Appends ``module.history`` to a JSONL file: one line per step, flushed as the step ends (rank 0 only).

    The file is only ever appended to (a user's own file keeps its content), and what is appended starts on a
    line of its own: a last line without its newline (a kill in the middle of a write) stays a line apart, so
    every later line still parses, and later runs know it for a cut record of their own (lrl.runs.cut_record). Lines are strict JSON: a value that is not a finite number (NaN, inf) is
    written as null. Every line names the run folder it belongs to (``run``); a resumed run appends the steps it
    replays after its checkpoint again, and :func:`read_history` keeps the last line of each step of the newest
    run.
    """

    def __init__(self, path: str | Path, run: str | None = None):
        self.path = Path(path)
        self.run = run
        self._file = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a+b")  # noqa: SIM115 (kept open for the run, closed at fit end)
        if self._file.tell() > 0:
            self._file.seek(-1, os.SEEK_END)
            if self._file.read(1) != b"\n":
                self._file.write(b"\n")
                self._file.flush()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._file is not None and pl_module.history:
            line = {**pl_module.history[-1], **({"run": self.run} if self.run else {})}
            try:
                self._file.write((json.dumps(finite_json(line), allow_nan=False) + "\n").encode())
                self._file.flush()
            except OSError as err:
                self._file = None  # closing it would flush the failed write again
                raise OutputError(
                    f"cannot append to the history file {str(self.path)!r}: {write_failure(self.path, err)}"
                ) from None

    def on_fit_end(self, trainer, pl_module) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def finite_json(value):
    """`value` with every float that is not finite (NaN, inf) replaced by None, in nested dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def read_history(path: str | Path, every_line: bool = False) -> list[dict]:
    """A history file -> the newest run's steps, one dict per step (the last line written for it), in step
    order; lines that are not JSON objects (a user's own notes) are skipped. ``every_line``: all JSON lines."""
    lines = []
    for text in Path(path).read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and "step" in line:
            lines.append(line)
    if every_line or not lines:
        return lines
    run = lines[-1].get("run")
    steps = {line["step"]: line for line in lines if line.get("run") == run}
    return [steps[k] for k in sorted(steps)]


class GracefulStop(L.Callback):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP stops the run at the end of the current step, after writing a last
    checkpoint when checkpoints are on; ``stopped`` is the signal's number. The run says so at once, and how to
    stop it now: a second signal, which ends the process at once with one line naming the last checkpoint
    written and how to continue from it (``resume_command``, set by train.py). A signal that arrives before
    training has started stops the run there (:class:`StoppedBeforeTraining`), with nothing to save."""

    def __init__(self, checkpoints: Path | None):
        self.checkpoints = checkpoints
        self.stopped: int | None = None
        self.prefix = "lrl"  # what its lines start with (train.py: its program's name)
        # how to continue from the last checkpoint (train.py's command line, for a second signal's line)
        self.resume_command: Callable[[], str | None] | None = None
        self._training = False
        self._previous: dict = {}
        self._trainer = None
        self._module = None

    def setup(self, trainer, pl_module, stage) -> None:
        if stage != "fit" or self._previous:
            return
        # a start-up signal whose exception landed where Python ignores exceptions (a weakref or import-lock
        # callback, a __del__) was swallowed there: it stops the run here, before these handlers replace it
        signum = received_at_start()
        if signum is not None:
            raise StoppedBeforeTraining(signum)
        for signum in STOP_SIGNALS:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals to the caller
                return

    def on_train_start(self, trainer, pl_module) -> None:
        if self.stopped is not None:  # a signal before training whose exception was swallowed where it landed
            raise StoppedBeforeTraining(self.stopped)
        self._training = True
        self._trainer, self._module = trainer, pl_module
        # Lightning wraps SIGTERM between setup and here; its handler ends fit with a SystemExit (status 0) at
        # the epoch's end, so the stop would look like success: ours alone decides from now on
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.stopped is not None:  # the second one: stop now, saying what was kept
            say(self._stopped_now(signum))
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.stopped = signum
        if not self._training:
            raise StoppedBeforeTraining(signum)
        say(stopping_notice(self.prefix, signum, self.checkpoints is not None))

    def _stopped_now(self, signum: int) -> str:
        io = getattr(getattr(self._trainer, "strategy", None), "checkpoint_io", None)
        kept = getattr(io, "written", None)
        how = None
        if kept is not None and self.resume_command is not None:
            try:
                how = self.resume_command()
            except Exception:  # noqa: BLE001 (the line is printed whatever the hint's trouble)
                how = None
        done = len(getattr(self._module, "history", []))
        return stopped_now_line(self.prefix, signum, done, kept, self.checkpoints is not None, how)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.stopped is None:
            return
        if self.checkpoints is not None:
            # weights_only given: Lightning logs a line of its own ("`weights_only` was not set") without it
            trainer.save_checkpoint(self.checkpoints / "last.ckpt", weights_only=False)
        trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self._training = False
        self._restore()

    def teardown(self, trainer, pl_module, stage) -> None:
        self._training = False
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


def robustness_callbacks(run: RunOptions, checkpoints: Path | None, run_dir: str | None = None) -> list:
    """The checkpoint writer (every checkpoint_every steps, into `checkpoints`) and the history file (which
    records `run_dir`, the run's folder)."""
    out: list = []
    if run.checkpoint_every > 0:
        from lightning.pytorch.callbacks import ModelCheckpoint

        # Lightning warns that with manual optimization the checkpoint holds the weights after the optimizer
        # step: that is what exact resume needs (it is written after the step's update and weight sync)
        warnings.filterwarnings("ignore", ".*ModelCheckpoint with manual optimization.*")
        out.append(
            ModelCheckpoint(
                dirpath=checkpoints,
                every_n_train_steps=run.checkpoint_every,
                save_top_k=0,
                save_last=True,
                enable_version_counter=False,
            )
        )
    if run.history_file:
        out.append(HistoryFile(run.history_file, run_dir))
    out.append(GracefulStop(checkpoints if run.checkpoint_every > 0 else None))
    return out


def unreadable_reason(path: str, err: Exception) -> str:
    """Why torch could not load `path`, in a few words of lrl's own (torch's text advises loading the file
    with weights_only=False, i.e. running whatever code it holds: never repeat that advice)."""
    if isinstance(err, pickle.UnpicklingError):
        if zipfile.is_zipfile(path):
            return "it holds objects other than tensors and plain data (it was not written by lrl)"
        return "it is not a torch checkpoint file (random or foreign bytes)"
    if isinstance(err, EOFError):
        return "the file is empty or cut short"
    if isinstance(err, OSError):
        return err.strerror or type(err).__name__
    if isinstance(err, RuntimeError) and "zip" in str(err).lower():
        return "its archive is damaged or cut short (a partial copy?)"
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    if not first or "weights_only" in first:
        return f"torch cannot load it ({type(err).__name__})"
    return f"{type(err).__name__}: {first}"


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint's contents (tensors and plain data only); ConfigError naming the file and why not."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols of foreign files
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a file that is not a checkpoint
        reason = unreadable_reason(str(path), err)
        raise ConfigError(f"resume: {str(path)!r} cannot be read as an lrl checkpoint: {reason}") from None
    if not isinstance(ckpt, dict):
        raise ConfigError(
            f"resume: {str(path)!r} cannot be read as an lrl checkpoint: it holds a {type(ckpt).__name__}"
        )
    return ckpt


def check_resume(path: str, cfg: Config) -> None:
    """Refuse, before anything is trained, a checkpoint that is unreadable or was written by another setup."""
    ckpt = load_checkpoint(path)
    state = ckpt.get("lrl")
    saved = state.get("config") if isinstance(state, dict) else None
    if saved is None:
        raise ConfigError(f"resume: {path!r} was not written by lrl's trainer (no 'lrl' state in it)")
    now = cfg.to_dict()
    changed = [
        k
        for k in sorted(set(saved) | set(now))
        if k not in RESUMABLE_CHANGES and not _same(saved.get(k), now.get(k))
    ]
    if changed:
        diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ConfigError(
            f"resume: {path!r} was written with other settings ({diffs}); resume with the same ones"
        )


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def check_contents(path: str, module, datamodule) -> None:
    """Refuse, before anything is restored, a checkpoint whose entries do not fit this run: a missing entry, a
    weight of another shape or dtype, optimizer state that does not match the weights. ConfigError naming the
    file and the first problem (a crafted or damaged file would otherwise fail deep inside the restore)."""
    ckpt = load_checkpoint(path)
    problem = _content_problem(ckpt, module, type(datamodule).__qualname__)
    if problem:
        raise ConfigError(f"resume: {path!r} cannot be resumed: {problem}")


def _shape(value) -> str:
    return str(list(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def _content_problem(ckpt: dict, module, datamodule_key: str) -> str | None:
    for key, kind in (
        ("state_dict", dict),
        ("optimizer_states", list),
        ("loops", dict),
        ("lrl", dict),
        (datamodule_key, dict),
    ):
        if not isinstance(ckpt.get(key), kind):
            return f"its {key!r} entry is {'missing' if key not in ckpt else 'not a ' + kind.__name__}"
    expected = module.state_dict()
    saved = ckpt["state_dict"]
    for name in sorted(set(expected) ^ set(saved)):
        return f"the weight {name!r} is {'missing from it' if name in expected else 'not one of the model'}"
    for name, tensor in expected.items():
        value = saved[name]
        if not isinstance(value, torch.Tensor) or value.shape != tensor.shape or value.dtype != tensor.dtype:
            return (
                f"the weight {name!r} is {_shape(value)} {getattr(value, 'dtype', '')}, the model's is "
                f"{list(tensor.shape)} {tensor.dtype}"
            )
    params = list(module.parameters())
    for opt in ckpt["optimizer_states"]:
        if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and "param_groups" in opt):
            return "its optimizer state is not an optimizer's state dict"
        for index, state in opt["state"].items():
            if not (isinstance(index, int) and 0 <= index < len(params) and isinstance(state, dict)):
                return f"its optimizer state names parameter {index!r}, which the model does not have"
            for name, value in state.items():
                if name != "step" and isinstance(value, torch.Tensor) and value.shape != params[index].shape:
                    return (
                        f"its optimizer state {name!r} of parameter {index} is {_shape(value)}, the parameter "
                        f"is {list(params[index].shape)}"
                    )
    missing = [
        k
        for k in ("version", "skipped", "shuffle", "history", "weights", "rng", "config")
        if k not in ckpt["lrl"]
    ]
    if missing:
        return f"its 'lrl' entry has no {', '.join(missing)}"
    if not isinstance(ckpt[datamodule_key].get("ranks"), list):
        return f"its {datamodule_key!r} entry has no state of its ranks"
    return None
