"""Building a run from a Config, shared by train.py, the experiments and the tests."""

from __future__ import annotations

import time
from dataclasses import dataclass

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from lrl.config import Config, ConfigError


@dataclass
class Run:
    """Everything a training run is made of."""

    cfg: Config
    tok: object
    policy: torch.nn.Module
    sampler: object
    module: object
    datamodule: object
    trainer: L.Trainer
    ckpt_path: str | None = None  # the checkpoint fit() resumes from (cfg.resume, resolved)


def build_run(cfg: Config, callbacks: list | None = None, logger=True, policy=None, **trainer_kw) -> Run:
    """Config -> policy, sampler, module, datamodule and a Lightning Trainer (CPU unless cfg.accelerator says).

    ``policy`` overrides the model that ``cfg.model`` (or the RL base) would give, e.g. a small fresh one in tests.
    """
    from lrl.base import make_rl_base
    from lrl.checkpoint import AtomicCheckpointIO, check_resume, resume_path, robustness_callbacks
    from lrl.data import RolloutDataModule
    from lrl.gym import build_tokenizer, make_tasks
    from lrl.module import OffPolicyModule
    from lrl.policy import ModelLoadError, load_policy
    from samplers import make_sampler

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tok = build_tokenizer(make_tasks("all"))
    train_tasks = make_tasks("train")
    if cfg.tasks_per_step > len(train_tasks):
        raise ConfigError(f"tasks_per_step: {cfg.tasks_per_step} is more than the {len(train_tasks)} train tasks")
    ckpt_path = resume_path(cfg)
    if ckpt_path is not None:
        check_resume(ckpt_path, cfg)
    if policy is not None:
        pass
    elif cfg.model:
        try:
            policy, model_tok = load_policy(cfg.model, tok)
        except ModelLoadError as err:
            raise ConfigError(str(err)) from None
        tok = model_tok or tok
    else:
        policy = make_rl_base(tok, verbose=True)
    sampler = make_sampler(cfg, tok)
    module = OffPolicyModule(cfg, policy, sampler, tok, make_tasks("heldout"))
    datamodule = RolloutDataModule(sampler, train_tasks, tok, cfg)
    if logger is True:
        from lightning.pytorch.loggers import TensorBoardLogger

        logger = TensorBoardLogger(cfg.log_dir, name=cfg.run_name, default_hp_metric=False)
    if callbacks is None:  # the monitoring callbacks the config switches on
        from callbacks import build_callbacks

        callbacks = build_callbacks(cfg)
    callbacks = [*(callbacks or []), *robustness_callbacks(cfg)]
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
        enable_checkpointing=cfg.checkpoint_every > 0,
        enable_model_summary=False,
        enable_progress_bar=cfg.progress,
        logger=logger,
        callbacks=callbacks or [],
    )
    kw.update(trainer_kw)
    try:
        trainer = L.Trainer(**kw)
    except (MisconfigurationException, ValueError, RuntimeError) as err:  # e.g. --accelerator gpu without one
        raise ConfigError(f"accelerator/devices/num_nodes/strategy: {err}") from None
    return Run(cfg, tok, policy, sampler, module, datamodule, trainer, ckpt_path)


def fit(run: Run) -> dict:
    """Train, then report the held-out evaluation of the final policy."""
    start = time.time()
    run.trainer.fit(run.module, run.datamodule, ckpt_path=run.ckpt_path)
    last = getattr(run.module, "last_eval", None)
    if last is None or last["step"] != run.module.version:
        run.trainer.validate(run.module, run.datamodule, verbose=False)
        last = run.module.last_eval
    return {**last, "wall_s": time.time() - start}
