"""StalenessMonitor: how many updates old the trained data are, per episode, over the fit, as histograms."""

from __future__ import annotations

import lightning as L
import torch

from lrl.callbacks._common import RunningMean, integer_bins, log_scalars, log_step, published, tensorboard
from lrl.distributed import Ranks
from lrl.stats import episode_staleness, token_staleness


class StalenessMonitor(L.Callback):
    """Logs ``staleness/*`` scalars and ``staleness/token`` and ``staleness/episode`` histograms per trained batch.

    Staleness is measured from the version tags of the batch, never from the config: a token's staleness is
    the trainer's version at the start of the step (``StepRecord.version``) minus the version that generated
    it; an episode's is that of its oldest action token. The trainer logs ``token_mean`` and ``token_max``;
    this callback adds ``episode_mean``, ``episode_max``, ``token_mean_run`` (since the start of the fit, kept
    across a resume), and the mean length of trained episodes against sampled ones, ``length_trained`` and
    ``length_sampled``, over every rank.

    Trained episodes are those with at least one action token of non-zero correction weight. Sampled ones are
    the whole batch, unless the batch carries ``sampled_length`` (the lengths [M] of every episode launched
    for it, for a stream that drops or filters episodes): a gap between the two is the length bias of
    filtering.

    Args:
        histogram_every: write the histograms every N batches, over all episodes of those N batches.
    """

    def __init__(self, histogram_every: int = 1):
        super().__init__()
        if histogram_every < 1:
            raise ValueError(f"histogram_every must be >= 1; got {histogram_every}")
        self.histogram_every = histogram_every
        self.run_mean = RunningMean()
        self.tokens: list[torch.Tensor] = []
        self.episodes: list[torch.Tensor] = []
        self.batches = 0
        self.last: dict[str, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = published(pl_module, "StalenessMonitor")
        if record is None:
            return
        ranks = Ranks.of(pl_module)
        b = record.batch
        mask = b["action_mask"]
        version = b["version"]
        tok = ranks.gather(token_staleness(version, mask, record.version).float())  # [N]
        ep = ranks.gather(episode_staleness(version, mask, record.version).float())  # [B']
        trained = ((record.weights.detach() != 0) & mask.bool()).any(-1)  # [B]
        length = b["length"].float()
        length_trained = ranks.gather(length[trained])
        sampled = ranks.gather(b.get("sampled_length", length).float())
        nan = float("nan")
        self.last = {
            "staleness/episode_mean": ep.mean().item() if ep.numel() else nan,
            "staleness/episode_max": ep.max().item() if ep.numel() else nan,
            "staleness/length_trained": length_trained.mean().item() if length_trained.numel() else nan,
            "staleness/length_sampled": sampled.mean().item() if sampled.numel() else nan,
        }
        if tok.numel():
            self.last["staleness/token_mean_run"] = self.run_mean.update(
                tok.mean().item(), float(tok.numel())
            )
        log_scalars(trainer, pl_module, self.last, ("staleness/episode_max",))
        self.batches += 1
        writer = tensorboard(trainer)
        if writer is None:
            return
        if tok.numel():
            self.tokens.append(tok.cpu())
            self.episodes.append(ep.cpu())
        if self.batches % self.histogram_every == 0 and self.tokens:
            step = log_step(trainer)
            for tag, parts in (("staleness/token", self.tokens), ("staleness/episode", self.episodes)):
                values = torch.cat(parts)
                writer.add_histogram(tag, values, step, bins=integer_bins(values))
            self.tokens = []
            self.episodes = []

    def state_dict(self) -> dict:
        return {"run_mean": self.run_mean.state_dict(), "batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.run_mean.load_state_dict(state["run_mean"])
        self.batches = state["batches"]
