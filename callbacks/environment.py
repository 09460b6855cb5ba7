"""EnvironmentMonitor: the distribution of the environment's own tool-call times, as quantiles and a histogram.

Environments whose steps are real programs (codefix) report each call's own time (``Episode.tool_times``, the
batch's ``tool_times``). Per trained batch this logs ``env/tool_p50``, ``env/tool_p95``, ``env/tool_p99`` and
``env/tool_max`` (seconds, this rank's calls) and, every ``histogram_every`` batches, the ``env/tool_seconds``
histogram of those batches' calls on a log scale (``env/tool_log10_seconds``), where a long tail is visible.
The counts of each verdict and failure kind are logged by the trainer itself (``env/verdict_*``,
``env/infra_*``, ``env/sandbox_runs``, ``env/retries``). A batch without tool times logs nothing.
"""

from __future__ import annotations

import lightning as L
import torch

from lrl.callbacks._common import log_scalars, log_step, published, tensorboard


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` by the nearest rank (what a p99 means for a few hundred calls)."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class EnvironmentMonitor(L.Callback):
    def __init__(self, histogram_every: int = 1):
        super().__init__()
        if histogram_every < 1:
            raise ValueError(f"histogram_every must be >= 1; got {histogram_every}")
        self.histogram_every = histogram_every
        self.pending: list[float] = []
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = published(pl_module, "EnvironmentMonitor")
        if record is None:
            return
        times = list(record.batch.get("tool_times", []))
        if not times:
            return
        metrics = {f"env/tool_p{int(q * 100)}": quantile(times, q) for q in (0.5, 0.95, 0.99)}
        metrics["env/tool_max"] = max(times)
        log_scalars(trainer, pl_module, metrics)
        self.batches += 1
        self.pending += times
        writer = tensorboard(trainer)
        if writer is not None and self.batches % self.histogram_every == 0:
            values = torch.tensor(self.pending, dtype=torch.float64)
            step = log_step(trainer)
            writer.add_histogram("env/tool_seconds", values, step)
            writer.add_histogram("env/tool_log10_seconds", values.clamp(min=1e-6).log10(), step)
            self.pending = []
