"""StalenessMonitor: how many updates old the trained data are, per token and per episode."""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics import CatMetric, MeanMetric

from callbacks._common import integer_bins, last_step, log_scalars, log_step, step_version, tensorboard
from callbacks.stats import episode_staleness, token_staleness


class StalenessMonitor(L.Callback):
    """Logs ``staleness/*`` scalars and ``staleness/token`` and ``staleness/episode`` histograms per trained batch.

    Staleness is measured from the version tags of the batch, never from the config: a token's staleness is
    the trainer's version at the start of the step (``pl_module.last_step_version``) minus the version that
    generated it; an episode's is that of its oldest action token. Scalars: ``token_mean`` (token-weighted),
    ``token_max``, ``episode_mean``, ``episode_max``, ``token_mean_run`` (since the start of the fit), and the
    mean length of trained episodes against sampled ones, ``length_trained`` and ``length_sampled``.

    Trained episodes are those with at least one action token of non-zero correction weight
    (``pl_module.last_weights``; every episode when it is absent). Sampled ones are the whole batch, unless the
    batch carries ``sampled_length`` (the lengths [M] of every episode launched for it, for a stream that
    drops or filters episodes): a gap between the two is the length bias of filtering.

    Args:
        histogram_every: write the histograms every N batches, over all episodes of those N batches.
    """

    def __init__(self, histogram_every: int = 1):
        super().__init__()
        if histogram_every < 1:
            raise ValueError(f"histogram_every must be >= 1; got {histogram_every}")
        self.histogram_every = histogram_every
        self.run_mean = MeanMetric()
        self.tokens = CatMetric(nan_strategy="disable")
        self.episodes = CatMetric(nan_strategy="disable")
        self.batches = 0
        self.last: dict[str, float] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        for metric in (self.run_mean, self.tokens, self.episodes):
            metric.reset()
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        got = last_step(pl_module, "StalenessMonitor")
        if got is None:
            return
        batch, _ = got
        mask, version = batch["action_mask"], batch["version"]
        now = step_version(pl_module, batch)
        tok = token_staleness(version, mask, now).float()  # [N]
        ep = episode_staleness(version, mask, now).float()  # [B']
        weights = getattr(pl_module, "last_weights", None)
        on = mask.bool() if weights is None else (weights.detach() != 0) & mask.bool()
        trained = on.any(-1)  # [B]
        length = batch["length"].float()
        sampled = batch.get("sampled_length", length).float()
        nan = tok.new_tensor(float("nan"))
        stats = {
            "token_mean": tok.mean() if tok.numel() else nan,
            "token_max": tok.max() if tok.numel() else nan,
            "episode_mean": ep.mean() if ep.numel() else nan,
            "episode_max": ep.max() if ep.numel() else nan,
            "length_trained": length[trained].mean() if trained.any() else nan,
            "length_sampled": sampled.mean(),
        }
        if tok.numel():
            self.run_mean.to(tok.device).update(stats["token_mean"], weight=tok.numel())
            stats["token_mean_run"] = self.run_mean.compute()
        values = torch.stack([v.float() for v in stats.values()]).tolist()
        self.last = {f"staleness/{k}": v for k, v in zip(stats, values)}
        log_scalars(trainer, pl_module, self.last, ("staleness/token_mean", "staleness/episode_max"))
        self.batches += 1
        writer = tensorboard(trainer)
        if writer is None:
            return
        if tok.numel():
            self.tokens.to(tok.device).update(tok)
            self.episodes.to(ep.device).update(ep)
        if self.batches % self.histogram_every == 0 and self.tokens.update_count > 0:
            step = log_step(trainer)
            for tag, metric in (("staleness/token", self.tokens), ("staleness/episode", self.episodes)):
                values = metric.compute().detach().cpu()
                writer.add_histogram(tag, values, step, bins=integer_bins(values))
                metric.reset()
