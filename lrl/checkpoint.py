"""Exact resume: atomic checkpoint files, the per-step history file, and the checks made before resuming.

What a checkpoint holds (so that a run killed after step k and resumed gives the same curves, step for step):
the policy and Adam state (Lightning), the loop counters (Lightning), the module's version counter, shuffle
generator, skipped-batch count, history and the sampler's kept weight versions (``OffPolicyModule``
``on_save_checkpoint``), every rank's rollout and env generators, batch count and carried tasks
(``RolloutDataModule.state_dict``), and each rank's global torch / Python RNG states. It is written in the
step's ``on_train_batch_end``, after the update and the weight sync.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lrl.config import Config, ConfigError

# keys that may differ between the run that wrote a checkpoint and the run that resumes it
RESUMABLE_CHANGES = {
    "max_steps",
    "log_dir",
    "run_name",
    "threads",
    "progress",
    "checkpoint_every",
    "checkpoint_dir",
    "resume",
    "history_file",
    "eval_every",
    "eval_episodes",
    "eval_at_start",
    "step_kl",
    "accelerator",
    "monitor_mismatch",
    "monitor_staleness",
    "monitor_timing",
    "health_check",
    "health_threshold",
    "health_threshold_p99",
    "health_strict",
    "histogram_every",
    "overwrite",
    "monitor_jumps",
    "jump_factor",
    # where the rollout workers run: the controller's checkpointed state is the same for every backend
    "rollout_backend",
    "worker_cpus",
    "worker_gpus",
    "ray_address",
    "worker_restarts",
}


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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_write(path, lambda f: torch.save(checkpoint, f))


class HistoryFile(L.Callback):
    """Appends ``module.history`` to a JSONL file: one line per step, flushed as the step ends (rank 0 only).

    The file is only ever appended to (a user's own file keeps its content). Every line names the run folder it
    belongs to (``run``); a resumed run appends the steps it replays after its checkpoint again, and
    :func:`read_history` keeps the last line of each step of the newest run.
    """

    def __init__(self, path: str | Path, run: str | None = None):
        self.path = Path(path)
        self.run = run
        self._file = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")  # noqa: SIM115 (kept open for the run, closed at fit end)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._file is not None and pl_module.history:
            line = {**pl_module.history[-1], **({"run": self.run} if self.run else {})}
            self._file.write(json.dumps(line) + "\n")
            self._file.flush()

    def on_fit_end(self, trainer, pl_module) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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


class StoppedBeforeTraining(Exception):
    """A signal arrived while the run was still starting (loading, building the data, starting workers)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum} before the first step")
        self.signum = signum


class GracefulStop(L.Callback):
    """SIGINT (Ctrl-C) or SIGTERM stops the run at the end of the current step, after writing a last checkpoint
    when checkpoints are on; ``stopped`` is the signal's number. A second signal stops at once. A signal that
    arrives before training has started stops the run there (:class:`StoppedBeforeTraining`), with nothing
    to save."""

    def __init__(self, checkpoints: Path | None):
        self.checkpoints = checkpoints
        self.stopped: int | None = None
        self._training = False
        self._previous: dict = {}

    def setup(self, trainer, pl_module, stage) -> None:
        if stage != "fit" or self._previous:
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals to the caller
                return

    def on_train_start(self, trainer, pl_module) -> None:
        self._training = True
        # Lightning wraps SIGTERM between setup and here; its handler ends fit with a SystemExit (status 0) at
        # the epoch's end, so the stop would look like success: ours alone decides from now on
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.stopped is not None:  # the second one: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.stopped = signum
        if not self._training:
            raise StoppedBeforeTraining(signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.stopped is None:
            return
        if self.checkpoints is not None:
            trainer.save_checkpoint(self.checkpoints / "last.ckpt")
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


def robustness_callbacks(cfg: Config, checkpoints: Path | None, run: str | None = None) -> list:
    """The checkpoint writer (every cfg.checkpoint_every steps, into `checkpoints`) and the history file."""
    out: list = []
    if cfg.checkpoint_every > 0:
        from lightning.pytorch.callbacks import ModelCheckpoint

        # Lightning warns that with manual optimization the checkpoint holds the weights after the optimizer
        # step: that is what exact resume needs (it is written after the step's update and weight sync)
        warnings.filterwarnings("ignore", ".*ModelCheckpoint with manual optimization.*")
        out.append(
            ModelCheckpoint(
                dirpath=checkpoints,
                every_n_train_steps=cfg.checkpoint_every,
                save_top_k=0,
                save_last=True,
                enable_version_counter=False,
            )
        )
    if cfg.history_file:
        out.append(HistoryFile(cfg.history_file, run))
    out.append(GracefulStop(checkpoints if cfg.checkpoint_every > 0 else None))
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
