"""Building a training run from a Config: policy, environment, sampler, module, datamodule, Lightning Trainer.

Shared by train.py, the experiments and the tests: ``build_run(cfg)`` then ``fit(run)``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from lrl.config import Config, ConfigError


@dataclass
class Run:
    """Everything a training run is made of."""

    cfg: Config
    spec: object  # lrl.envs.EnvSpec
    policy: torch.nn.Module
    sampler: object
    module: object
    datamodule: object
    trainer: L.Trainer
    ckpt_path: str | None = None  # the checkpoint fit() resumes from (cfg.resume, resolved)

    @property
    def tok(self):
        return self.spec.tok


def load_run_policy(cfg: Config):
    """The run's tokenizer (None: the environment's own) and policy (None: the environment's warm start)."""
    from lrl.policy import ModelLoadError, load_policy
    from lrl.tokenizers import load_tokenizer

    tok = None
    if cfg.tokenizer:
        try:
            tok = load_tokenizer(cfg.tokenizer)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if not cfg.model:
        return tok, None
    try:
        policy, model_tok = load_policy(cfg.model, tok)
    except ModelLoadError as err:
        raise ConfigError(str(err)) from None
    return tok or model_tok, policy


def build_run(cfg: Config, callbacks: list | None = None, logger=True, policy=None, **trainer_kw) -> Run:
    """Config -> policy, environment, sampler, module, datamodule and a Lightning Trainer.

    ``policy`` overrides the model that ``cfg.model`` (or the environment's warm start) would give, e.g. a
    small fresh one in tests.
    """
    from lrl.checkpoint import AtomicCheckpointIO, check_resume, resume_path, robustness_callbacks
    from lrl.data import RolloutDataModule
    from lrl.envs import make_env
    from lrl.module import OffPolicyModule
    from lrl.policy import check_vocabulary, make_policy
    from samplers import make_sampler

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ckpt_path = resume_path(cfg)
    if ckpt_path is not None:
        check_resume(ckpt_path, cfg)
    if policy is None:
        tok, loaded = load_run_policy(cfg)
    else:  # a policy given in code; the tokenizer still comes from the config
        tok, loaded = load_run_policy(cfg.replace(model=None))[0], policy
    spec = make_env(cfg, tok)
    if loaded is None:
        loaded = spec.warm_start() if spec.warm_start is not None else make_policy(spec.tok, seed=cfg.seed)
    try:
        check_vocabulary(loaded, spec.tok)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    sampler = make_sampler(cfg, spec.tok)
    module = OffPolicyModule(cfg, loaded, sampler, spec)
    datamodule = RolloutDataModule(sampler, spec, cfg)
    if logger is True:
        from lightning.pytorch.loggers import TensorBoardLogger

        logger = TensorBoardLogger(cfg.log_dir, name=cfg.run_name, default_hp_metric=False)
    if callbacks is None:  # the monitoring callbacks the config switches on
        from callbacks import build_callbacks

        callbacks = build_callbacks(cfg)
    kw = dict(
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        strategy="ddp" if cfg.strategy == "auto" and cfg.world_size > 1 else cfg.strategy,
        plugins=[AtomicCheckpointIO()],
        max_epochs=1,
        max_steps=-1,
        log_every_n_steps=1,
        val_check_interval=min(cfg.eval_every, cfg.max_steps),
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # every rank samples its own batch per step (lrl.data)
        enable_checkpointing=cfg.checkpoint_every > 0,
        enable_model_summary=False,
        enable_progress_bar=cfg.progress,
        logger=logger,
        callbacks=[*(callbacks or []), *robustness_callbacks(cfg)],
    )
    kw.update(trainer_kw)
    try:
        trainer = L.Trainer(**kw)
    except (MisconfigurationException, ValueError, RuntimeError) as err:  # e.g. --accelerator gpu without one
        raise ConfigError(f"accelerator/devices/num_nodes/strategy: {err}") from None
    return Run(cfg, spec, loaded, sampler, module, datamodule, trainer, ckpt_path)


def fit(run: Run) -> dict:
    """Train, then report the held-out evaluation of the final policy."""
    start = time.time()
    with warnings.catch_warnings():
        # Lightning's own pytree helper builds torch's deprecated LeafSpec for every dataloader it wraps
        # (lightning/pytorch/utilities/_pytree.py); nothing in lrl can avoid it until Lightning changes
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        run.trainer.fit(run.module, run.datamodule, ckpt_path=run.ckpt_path)
        last = run.module.last_eval
        if last is None or last["step"] != run.module.version:
            run.trainer.validate(run.module, run.datamodule, verbose=False)
            last = run.module.last_eval
    return {**last, "wall_s": time.time() - start}
