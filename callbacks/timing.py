"""TimingMonitor: wall time of a training step and the share of each phase the module reports."""

from __future__ import annotations

import time

import lightning as L

from lrl.callbacks._common import RunningMean, log_scalars

PHASES = ("sample", "old_logp", "update", "shift", "sync")


class TimingMonitor(L.Callback):
    """Logs ``time/step`` (seconds), ``time/step_mean`` (since the start of the fit) and ``time/share_<phase>``.

    ``time/step`` is the wall time from this callback's ``on_train_batch_start`` to its ``on_train_batch_end``;
    with the ``dataloader_iter`` module, sampling happens inside that window. The phases are the module's
    own ``time/<phase>`` values of the step (read from ``pl_module.history[-1]``, else from
    ``trainer.callback_metrics``); ``time/share_other`` is what they do not cover (loss bookkeeping, logging,
    and the callbacks that run before this one: put it last to include them).
    """

    def __init__(self, phases: tuple[str, ...] = PHASES):
        super().__init__()
        self.phases = phases
        self.step_mean = RunningMean()
        self.start: float | None = None
        self.last: dict[str, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.start = time.perf_counter()

    def _phase_times(self, trainer, pl_module) -> dict[str, float]:
        record = getattr(pl_module, "last_step", None)
        source = record.metrics if record is not None else trainer.callback_metrics
        return {p: float(source[f"time/{p}"]) for p in self.phases if f"time/{p}" in source}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.start is None:
            return
        step = time.perf_counter() - self.start
        self.start = None
        phases = self._phase_times(trainer, pl_module)
        record = {"time/step": step, "time/step_mean": self.step_mean.update(step, 1.0)}
        for name, seconds in phases.items():
            record[f"time/share_{name}"] = seconds / step
        record["time/share_other"] = max(0.0, 1.0 - sum(phases.values()) / step)
        self.last = record
        log_scalars(trainer, pl_module, record, ("time/step",))
