"""Small helpers shared by the monitoring callbacks: the module's published step, logging, TensorBoard."""

from __future__ import annotations

import numpy as np
import torch


def published(pl_module, who: str):
    """The module's last published step (``lrl.module.StepRecord``), or None before the first step.

    Raises a clear error when the module does not publish ``last_step`` at all (the callbacks' contract).
    """
    if not hasattr(pl_module, "last_step"):
        raise AttributeError(
            f"{who} reads pl_module.last_step (an lrl.module.StepRecord) after each training step; "
            f"{type(pl_module).__name__} does not publish one. See docs/monitoring.md for the contract."
        )
    return pl_module.last_step


def log_step(trainer) -> int:
    """The step Lightning's logger connector gives the scalars of the current batch, for histograms to match."""
    loop = getattr(trainer, "fit_loop", None)
    steps = getattr(getattr(loop, "epoch_loop", None), "_batches_that_stepped", None)
    return int(steps) if steps is not None else int(trainer.global_step)


def should_log(trainer) -> bool:
    """Whether Lightning writes this batch's step metrics (every ``log_every_n_steps`` batches, and the last)."""
    every = getattr(trainer, "log_every_n_steps", 1) or 0
    return every > 0 and ((log_step(trainer) + 1) % every == 0 or bool(trainer.should_stop))


def log_scalars(trainer, pl_module, metrics: dict[str, float], headline: tuple[str, ...] = ()) -> None:
    """Write scalars to every logger of the trainer, at the step Lightning gives the batch's own metrics.

    ``logger.log_metrics`` costs a few microseconds a key; ``pl_module.log`` costs about half a millisecond,
    so only the ``headline`` keys also go through it (they then reach ``trainer.callback_metrics``, where
    EarlyStopping or ModelCheckpoint can monitor them; ``logger=False`` avoids writing them twice).
    """
    if headline:
        picked = {k: metrics[k] for k in headline if k in metrics}
        pl_module.log_dict(picked, on_step=True, on_epoch=False, logger=False, batch_size=1)
    if not trainer.loggers or not should_log(trainer):
        return
    step = log_step(trainer)
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def tensorboard(trainer):
    """The SummaryWriter of the trainer's TensorBoardLogger, or None when there is none (histograms are skipped)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None


def integer_bins(values: torch.Tensor) -> np.ndarray:
    """Histogram bin edges centred on the integers from min to max of `values` (for staleness)."""
    lo, hi = (int(values.min()), int(values.max())) if values.numel() else (0, 0)
    return np.arange(lo - 0.5, hi + 1.5, 1.0)


class RunningMean:
    """A weighted mean over the fit that survives a resume (its two numbers go into the checkpoint)."""

    def __init__(self):
        self.total = 0.0
        self.weight = 0.0

    def update(self, value: float, weight: float) -> float:
        self.total += value * weight
        self.weight += weight
        return self.total / self.weight if self.weight else float("nan")

    def state_dict(self) -> dict:
        return {"total": self.total, "weight": self.weight}

    def load_state_dict(self, state: dict) -> None:
        self.total = state["total"]
        self.weight = state["weight"]
