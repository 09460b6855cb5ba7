"""MismatchMonitor: per trained batch, the distribution of log pi_old - log mu over action tokens."""

from __future__ import annotations

import lightning as L
from torchmetrics import CatMetric, MeanMetric

from callbacks._common import last_step, log_scalars, log_step, tensorboard
from callbacks.stats import mismatch_stats

HEADLINE = ("mismatch/abs_mean", "mismatch/abs_p99")  # also in trainer.callback_metrics


class MismatchMonitor(L.Callback):
    """Logs ``mismatch/*`` scalars and a ``mismatch/log_ratio`` histogram after every training batch.

    All statistics come from the raw ratios pi_old/mu (before TIS truncation or MIS masking); see
    :func:`callbacks.stats.mismatch_stats` for the list (quantiles by nearest rank, from
    :mod:`lrl.mismatch_stats`). ``mismatch/ess_weighted`` uses the module's
    correction weights (``pl_module.last_weights``) when it publishes them. ``mismatch/abs_mean_run`` is the
    token-weighted mean |log ratio| since the start of the fit. The progress bar shows ``mismatch`` (the
    batch's mean |log ratio|).

    Args:
        cap, low, high: the TIS cap and the MIS band [low, high] for the over/under shares; None takes them
            from ``pl_module.cfg`` when there is one, else 2.0, 0.5 and 5.0.
        histogram_every: write the histogram every N batches, over all tokens of those N batches.
        prog_bar: show ``mismatch`` in the progress bar.
    """

    def __init__(self, cap: float | None = None, low: float | None = None, high: float | None = None,
                 histogram_every: int = 1, prog_bar: bool = True):  # fmt: skip
        super().__init__()
        if histogram_every < 1:
            raise ValueError(f"histogram_every must be >= 1; got {histogram_every}")
        self.cap, self.low, self.high = cap, low, high
        self.histogram_every, self.prog_bar = histogram_every, prog_bar
        self.run_mean = MeanMetric()  # token-weighted mean |log ratio| over the fit
        self.window = CatMetric(nan_strategy="disable")  # log ratios waiting for the next histogram
        self.batches = 0
        self.last: dict[str, float] = {}

    def _band(self, pl_module) -> tuple[float, float, float]:
        cfg = getattr(pl_module, "cfg", None)
        pick = lambda mine, key, default: mine if mine is not None else getattr(cfg, key, default)  # noqa: E731
        return pick(self.cap, "cap", 2.0), pick(self.low, "low", 0.5), pick(self.high, "high", 5.0)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.run_mean.reset()
        self.window.reset()
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        got = last_step(pl_module, "MismatchMonitor")
        if got is None:
            return
        batch, old_logp = got
        cap, low, high = self._band(pl_module)
        weights = getattr(pl_module, "last_weights", None)
        stats, log_ratio = mismatch_stats(
            old_logp, batch["sample_logp"], batch["action_mask"], weights, cap, low, high
        )
        if log_ratio.numel():
            self.run_mean.to(log_ratio.device).update(stats["abs_mean"], weight=stats["tokens"])
            stats["abs_mean_run"] = float(self.run_mean.compute())
        self.last = {f"mismatch/{k}": v for k, v in stats.items()}
        log_scalars(trainer, pl_module, self.last, HEADLINE)
        if self.prog_bar:
            pl_module.log("mismatch", self.last["mismatch/abs_mean"], prog_bar=True, logger=False,
                          on_step=True, on_epoch=False, batch_size=1)  # fmt: skip
        self.batches += 1
        writer = tensorboard(trainer)
        if writer is None:
            return
        if log_ratio.numel():
            self.window.to(log_ratio.device).update(log_ratio)
        if self.batches % self.histogram_every == 0 and self.window.update_count > 0:
            writer.add_histogram(
                "mismatch/log_ratio", self.window.compute().detach().cpu(), log_step(trainer)
            )
            self.window.reset()
