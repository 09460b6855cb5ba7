"""Building a training run from a Config: policy, environment, rollout source, module, datamodule, Trainer.

Shared by train.py, the experiments and the tests: ``build_run(cfg)`` then ``fit(run)``.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from lrl.checkpoint import GracefulStop, StoppedBeforeTraining
from lrl.config import Config, ConfigError
from lrl.envs import run_tokenizer  # noqa: F401  (the run's tokenizer; imported from here by tools)
from lrl.sections import EnvironmentOptions, PolicyOptions, RunOptions, SamplingOptions

if TYPE_CHECKING:
    from lrl.budget import MemoryPlan
    from lrl.data import RolloutDataModule
    from lrl.envs.base import EnvSpec
    from lrl.module import OffPolicyModule
    from lrl.runs import RunFolder
    from lrl.sources.base import RolloutSource


@dataclass
class Run:
    """Everything a training run is made of."""

    cfg: Config
    spec: EnvSpec
    policy: torch.nn.Module
    source: RolloutSource  # where the batches come from
    module: OffPolicyModule
    datamodule: RolloutDataModule
    trainer: L.Trainer
    ckpt_path: str | None = None  # the checkpoint fit() resumes from (cfg.resume, resolved)
    folder: RunFolder | None = None  # where the run writes, when it writes anything

    @property
    def tok(self):
        return self.spec.tok

    @property
    def sampler(self):
        """The behavior sampler of a synchronous run (None in async mode, where the workers hold their own)."""
        return getattr(self.source, "sampler", None)

    @property
    def stopped_by(self) -> int | None:
        """The signal that stopped the run early (SIGINT, SIGTERM), if one did."""
        stop = next((c for c in self.trainer.callbacks if isinstance(c, GracefulStop)), None)
        return stop.stopped if stop is not None else None


def load_model(policy: PolicyOptions, tok):
    """The --model policy (None without one), with clear errors for a directory that does not hold one."""
    from lrl.policy import ModelLoadError, load_policy

    if not policy.model:
        return None
    try:
        return load_policy(policy.model, tok)[0]
    except ModelLoadError as err:
        raise ConfigError(str(err)) from None


def plan_run(cfg: Config) -> tuple[EnvSpec, object, MemoryPlan]:
    """What a run checks before it loads a model: its named models resolved to folders (into `cfg`), the paths
    it reads and writes, its environment built, its synchronous sampler built (not set up; None in async mode,
    where the workers build their own) and its memory plan -> (spec, sampler, plan); ConfigError for the first
    thing that does not hold. Cheap next to a run: a caller may check many configs with it first."""
    from lrl import preflight, samplers
    from lrl.envs import make_env

    preflight.resolve(cfg)  # named models -> folders; what must exist; each entry's needs of the machine
    preflight.check_paths(cfg.run, cfg.policy)
    spec = make_env(cfg, run_tokenizer(cfg.policy))
    # a synchronous run's sampler: built, not set up; the memory plan asks it for its copies
    sampler = None if cfg.rollout.pipeline == "async" else samplers.make_sampler(cfg, spec.tok)
    return spec, sampler, preflight.check_environment(cfg, spec, sampler)


def build_run(cfg: Config, callbacks: list | None = None, logger=True, policy=None, **trainer_kw) -> Run:
    """Config -> policy, environment, rollout source, module, datamodule and a Lightning Trainer.

    The preflight (lrl.preflight) resolves the config's named models (the config takes their folders) and checks
    it against the file system, the environment, the machine's memory and the model before anything is trained, each as soon as what it checks exists (ConfigError). The run
    writes to its own folder (lrl.runs): always when it logs to TensorBoard or keeps its checkpoints there.
    ``policy`` overrides the model that ``cfg.model`` (or the environment's warm start) would give, e.g. a
    small fresh one in tests; ``logger`` is True (TensorBoard), False, or a Lightning logger.
    """
    from lrl import preflight
    from lrl.checkpoint import check_resume, robustness_callbacks
    from lrl.data import RolloutDataModule
    from lrl.module import OffPolicyModule
    from lrl.policy import make_policy
    from lrl.runs import clean_run_temporaries, clean_stale_temporaries, open_run

    run = cfg.run
    torch.set_num_threads(run.threads)
    torch.manual_seed(run.seed)
    spec, sampler, memory = plan_run(cfg)
    asynchronous = cfg.rollout.pipeline == "async"
    loaded = policy if policy is not None else load_model(cfg.policy, spec.tok)
    if loaded is None:
        loaded = spec.warm_start() if spec.warm_start is not None else make_policy(spec.tok, seed=run.seed)
    preflight.check_model(cfg, spec, loaded)
    wants_folder = (
        logger is True or run.resume is not None or (run.checkpoint_every > 0 and not run.checkpoint_dir)
    )
    folder = open_run(run, lambda path: check_resume(path, cfg)) if wants_folder else None
    checkpoints = Path(run.checkpoint_dir) if run.checkpoint_dir else folder.checkpoints if folder else None
    if checkpoints is not None:
        clean_stale_temporaries(checkpoints)
    if folder is not None:
        clean_run_temporaries(run)
    if asynchronous:  # rollout workers, set up with the whole config: each builds its environment, sampler
        from lrl.pipeline.source import AsyncSource

        source = AsyncSource(cfg, spec, loaded)
    else:
        from lrl.sources.sync import SyncSource

        sections = dict(run=run, batch=cfg.batch, environment=cfg.environment, rollout=cfg.rollout)
        source = SyncSource(sampler, spec, **sections)
    datamodule = RolloutDataModule(source, run.max_steps)
    module = OffPolicyModule(cfg, loaded, source, spec, memory)
    module.run_dir = str(folder.path) if folder is not None else None
    if logger is True:
        from lightning.pytorch.loggers import TensorBoardLogger

        # a resumed run writes into its folder again; TensorBoard drops what the killed run wrote past the checkpoint
        purge = {"purge_step": folder.step} if folder.checkpoint is not None else {}
        logger = TensorBoardLogger(
            run.log_dir, run.run_name, folder.version, default_hp_metric=False, **purge
        )
    if callbacks is None:  # the monitoring callbacks the config switches on
        from lrl.callbacks import build_callbacks

        callbacks = build_callbacks(cfg)
    run_dir = str(folder.path) if folder is not None else None
    callbacks = [*(callbacks or []), *robustness_callbacks(run, checkpoints, run_dir)]
    trainer = make_trainer(run, cfg.evaluation.eval_every, logger, callbacks, folder, **trainer_kw)
    ckpt = str(folder.checkpoint) if folder is not None and folder.checkpoint is not None else None
    if ckpt is not None:
        try:
            preflight.check_checkpoint(ckpt, module, datamodule)
        except ConfigError:
            folder.release()
            raise
    return Run(cfg, spec, loaded, source, module, datamodule, trainer, ckpt, folder)


def make_trainer(run: RunOptions, eval_every: int, logger, callbacks: list, folder, **trainer_kw) -> L.Trainer:
    """The run's Lightning Trainer, validating every `eval_every` steps; what Lightning refuses (e.g.
    --accelerator gpu without one) is a ConfigError."""
    from lrl.checkpoint import AtomicCheckpointIO

    kw = dict(
        accelerator=run.accelerator,
        devices=run.devices,
        num_nodes=run.num_nodes,
        strategy="ddp" if run.strategy == "auto" and run.world_size > 1 else run.strategy,
        plugins=[AtomicCheckpointIO()],
        max_epochs=1,
        max_steps=-1,
        log_every_n_steps=1,
        val_check_interval=min(eval_every, run.max_steps),
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # every rank samples its own batch per step (lrl.data)
        enable_checkpointing=run.checkpoint_every > 0,
        enable_model_summary=False,
        enable_progress_bar=run.progress,
        logger=logger,
        callbacks=callbacks,
    )
    kw.update(trainer_kw)
    try:
        return L.Trainer(**kw)
    except (MisconfigurationException, ValueError, RuntimeError) as err:  # e.g. --accelerator gpu without one
        if folder is not None:
            folder.release()
        raise ConfigError(f"accelerator/devices/num_nodes/strategy: {err}") from None


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` reports: how training went, and the held-out evaluation of the final policy.

    The held-out fields are those of the run's last evaluation (:func:`lrl.evaluation.summarize`); a run stopped
    by a signal before one ran has none: ``evaluated_at`` is None, ``pass_rate`` and ``invalid`` NaN,
    ``episodes`` 0 and ``metrics`` empty.
    """

    steps: int  # training steps taken (this run's and, resumed, the ones before the checkpoint)
    skipped: int  # steps skipped for want of any learning signal (no group had a reward variance)
    wall_s: float  # seconds fit() took, the final evaluation included
    stopped_by: int | None = None  # the signal (SIGINT, SIGTERM) that stopped the run early, if one did
    # whether no step had a single episode its environment answered (e.g. every tool call timed out)
    all_env_failures: bool = False
    env_timeouts: float = 0.0  # env/timeouts, the share of episodes whose tool timed out, averaged over steps
    env_errors: float = 0.0  # env/errors, the share of episodes whose tool raised, averaged over steps
    evaluated_at: int | None = None  # the policy version the held-out fields measure
    pass_rate: float = math.nan  # held-out mean reward
    invalid: float = math.nan  # held-out share of malformed episodes
    episodes: int = 0  # held-out episodes evaluated
    metrics: dict[str, float] = field(default_factory=dict)  # held-out means of the environment's own metrics


def fit(run: Run) -> FitResult:
    """Train, then report (:class:`FitResult`) the held-out evaluation of the final policy, the steps taken and
    skipped for want of any learning signal, and what stopped the run early if anything did."""
    start = time.time()
    stopped_by = None
    try:
        with warnings.catch_warnings():
            # Lightning's own pytree helper builds torch's deprecated LeafSpec for every dataloader it wraps
            # (lightning/pytorch/utilities/_pytree.py); nothing in lrl can avoid it until Lightning changes
            warnings.filterwarnings(
                "ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning
            )
            try:
                run.trainer.fit(run.module, run.datamodule, ckpt_path=run.ckpt_path)
            except StoppedBeforeTraining as stop:  # nothing was trained, nothing is saved
                stopped_by = stop.signum
            stopped_by = run.stopped_by or stopped_by
            last = run.module.last_eval
            if stopped_by is None and (last is None or last["step"] != run.module.version):
                run.trainer.validate(run.module, run.datamodule, verbose=False)
                last = run.module.last_eval
    finally:
        if run.folder is not None:
            run.folder.release()
    history = run.module.history
    steps = max(len(history), 1)
    held = last or {}
    return FitResult(
        steps=len(history),
        skipped=int(sum(h["train/skipped"] for h in history)),
        wall_s=time.time() - start,
        stopped_by=stopped_by,
        all_env_failures=bool(history) and all(h.get("env/failures") == 1.0 for h in history),
        env_timeouts=sum(h.get("env/timeouts", 0.0) for h in history) / steps,
        env_errors=sum(h.get("env/errors", 0.0) for h in history) / steps,
        evaluated_at=held.get("step"),
        pass_rate=held.get("pass_rate", math.nan),
        invalid=held.get("invalid", math.nan),
        episodes=held.get("episodes", 0),
        metrics={m: held[m] for m in run.spec.metrics if m in held},
    )


def startup_notes(
    policy: PolicyOptions,
    sampling: SamplingOptions,
    environment: EnvironmentOptions,
    accelerator: str,
    run: Run | None = None,
) -> list[str]:
    """What a user should know at the start of a run that the options alone do not say."""
    from lrl.envs.latency import parse_latency
    from lrl.envs.workers import DEFAULT_TOOL_TIMEOUT
    from lrl.precision import LARGE_MODEL, accelerator_device, describe, parameters, resolve_decode
    from lrl.registry import SAMPLERS

    notes = []
    if run is not None and (policy.model is not None or parameters(run.policy) > LARGE_MODEL):
        size = parameters(run.policy)
        notes.append(f"model: {policy.model or 'the environment policy'} ({size / 1e6:.1f}M parameters)")
        auto = " (auto)" if policy.precision == "auto" else ""
        # the module is moved to its accelerator when fit starts: name the device it will compute on
        notes.append(describe(run.module.precision, accelerator_device(accelerator)) + auto)
        if sampling.sampler in SAMPLERS.users("decode"):
            notes.append(f"sampler decode: {resolve_decode(sampling.decode, run.policy)}")
        if run.module.memory is not None and run.module.memory.chunked:
            notes.append(run.module.memory.describe())
    if environment.tool_timeout is None and not parse_latency(environment.tool_latency).off:
        notes.append(
            f"tool calls run on threads without --tool-timeout: each is bounded at {DEFAULT_TOOL_TIMEOUT:g} s "
            "and then counted as an environment failure (env/timeouts)"
        )
    return notes
