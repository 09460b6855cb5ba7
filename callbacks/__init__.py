"""Monitoring callbacks: mismatch, staleness, a step-0 health check, and timing.

Each is an ordinary Lightning callback, usable alone in any ``Trainer(callbacks=[...])``. They take nothing
from the batch Lightning passes to the hooks; after every training step they read what the module publishes:

- ``pl_module.last_batch``: the trained batch dict (``ids``, ``action_mask`` [B, T-1], ``sample_logp``
  [B, T-1] = log mu, ``version`` [B, T-1] with -1 off the mask, ``length`` [B]; optionally
  ``sampled_length`` [M], the lengths of every episode launched for the batch);
- ``pl_module.last_old_logp``: the trainer's log pi_old [B, T-1] of that batch, computed before the update;
- ``pl_module.last_weights``: the correction weights [B, T-1] that multiplied the advantages (optional);
- ``pl_module.last_step_version``: the trainer's version at the start of the step (else ``version``);
- ``pl_module.history[-1]``: the step's logged dict, for the ``time/<phase>`` values (TimingMonitor);
- ``pl_module.cfg``: optional, for the TIS cap and the MIS band.

Scalars go to every logger of the trainer through ``logger.log_metrics``, at the step Lightning gives the
batch's own metrics and on its ``log_every_n_steps`` schedule; a few headline keys also go through
``pl_module.log`` (so they reach ``trainer.callback_metrics`` and the progress bar shows ``mismatch``):
``pl_module.log`` costs about half a millisecond a key, too much for forty keys a step. Histograms go to
the TensorBoard logger's writer when there is one. ``build_callbacks(cfg)`` makes the set a Config
switches on.
"""

from __future__ import annotations

from callbacks.health import HealthCheck, HealthCheckError
from callbacks.mismatch import MismatchMonitor
from callbacks.staleness import StalenessMonitor
from callbacks.timing import TimingMonitor


def build_callbacks(cfg) -> list:
    """The monitoring callbacks a Config switches on, in hook order (TimingMonitor last, to time the others)."""
    from lrl.config import ConfigError

    for name in ("health_threshold", "health_threshold_p99"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"{name}: {getattr(cfg, name)!r} is not allowed; it must be > 0")
    if cfg.histogram_every < 1:
        raise ConfigError(f"histogram_every: {cfg.histogram_every!r} is not allowed; it must be >= 1")
    out: list = []
    if cfg.health_check:
        out.append(HealthCheck(cfg.health_threshold, cfg.health_threshold_p99, cfg.health_strict))
    if cfg.monitor_mismatch:
        out.append(MismatchMonitor(cfg.cap, cfg.low, cfg.high, histogram_every=cfg.histogram_every))
    if cfg.monitor_staleness:
        out.append(StalenessMonitor(histogram_every=cfg.histogram_every))
    if cfg.monitor_timing:
        out.append(TimingMonitor())
    return out


__all__ = ["HealthCheck", "HealthCheckError", "MismatchMonitor", "StalenessMonitor", "TimingMonitor",
           "build_callbacks"]  # fmt: skip
