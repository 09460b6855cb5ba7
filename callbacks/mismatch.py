"""MismatchMonitor: per trained batch, the distribution of log pi_old - log mu over action tokens."""

from __future__ import annotations

import lightning as L
import torch

from lrl.callbacks._common import RunningMean, log_scalars, log_step, published, tensorboard
from lrl.distributed import Ranks
from lrl.stats import mismatch_stats


class MismatchMonitor(L.Callback):
    """Logs ``mismatch/*`` distribution scalars and a ``mismatch/log_ratio`` histogram after every training batch.

    All statistics come from the raw ratios pi_old/mu (before TIS truncation or MIS masking), over the action
    tokens of every rank (see :func:`lrl.stats.mismatch_stats` for the list). The trainer itself logs the
    mean (``mismatch/abs_mean``) and the share above the cap (``mismatch/over_cap``); this callback adds the
    quantiles, KL estimates, effective sample sizes, band shares, probability bins and
    ``mismatch/abs_mean_run``, the token-weighted mean |log ratio| since the start of the fit (kept across a
    resume). The progress bar shows ``mismatch`` (the batch's mean |log ratio|).

    Args:
        cap, low, high: the MIS band [low, high] for the below/above shares; None takes them from
            ``pl_module.cfg`` when there is one, else 0.5 and 5.0 (cap is accepted for compatibility).
        histogram_every: write the histogram every N batches, over all tokens of those N batches.
        prog_bar: show ``mismatch`` in the progress bar.
    """

    def __init__(
        self,
        cap: float | None = None,
        low: float | None = None,
        high: float | None = None,
        histogram_every: int = 1,
        prog_bar: bool = True,
    ):
        super().__init__()
        if histogram_every < 1:
            raise ValueError(f"histogram_every must be >= 1; got {histogram_every}")
        self.cap = cap
        self.low = low
        self.high = high
        self.histogram_every = histogram_every
        self.prog_bar = prog_bar
        self.run_mean = RunningMean()
        self.window: list[torch.Tensor] = []  # log ratios waiting for the next histogram
        self.batches = 0
        self.last: dict[str, float] = {}

    def _band(self, pl_module) -> tuple[float, float, float]:
        cfg = getattr(pl_module, "cfg", None)
        pick = lambda mine, key, default: mine if mine is not None else getattr(cfg, key, default)  # noqa: E731
        return pick(self.cap, "cap", 2.0), pick(self.low, "low", 0.5), pick(self.high, "high", 5.0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = published(pl_module, "MismatchMonitor")
        if record is None:
            return
        ranks = Ranks.of(pl_module)
        b = record.batch
        on = record.monitored_mask().bool()  # the rows whose old_logp is the trainer's own
        d = (record.old_logp.detach().float() - b["sample_logp"].float()) * on  # [B, T-1], 0 off the actions
        log_ratio = ranks.gather(d[on])  # [N] over every rank
        seq = ranks.gather(d.sum(-1)[on.any(-1)])  # [B'] log of each episode's sequence ratio
        cap, low, high = self._band(pl_module)
        stats = mismatch_stats(
            log_ratio,
            ranks.gather(b["sample_logp"][on]),
            seq,
            ranks.gather(record.weights[on]),
            cap,
            low,
            high,
        )
        mean = record.metrics.get("mismatch/abs_mean", float("nan"))
        if log_ratio.numel():
            stats["abs_mean_run"] = self.run_mean.update(mean, float(log_ratio.numel()))
        self.last = {f"mismatch/{k}": v for k, v in stats.items()}
        log_scalars(trainer, pl_module, self.last, ("mismatch/abs_p99",))
        if self.prog_bar:
            pl_module.log(
                "mismatch", mean, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1
            )
        self.batches += 1
        writer = tensorboard(trainer)
        if writer is None:
            return
        if log_ratio.numel():
            self.window.append(log_ratio.cpu())
        if self.batches % self.histogram_every == 0 and self.window:
            writer.add_histogram("mismatch/log_ratio", torch.cat(self.window), log_step(trainer))
            self.window = []

    def state_dict(self) -> dict:
        return {"run_mean": self.run_mean.state_dict(), "batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.run_mean.load_state_dict(state["run_mean"])
        self.batches = state["batches"]
