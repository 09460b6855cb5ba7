"""Monitoring callbacks: mismatch, staleness, a step-0 health check, and timing.

Each is an ordinary Lightning callback, usable alone in any ``Trainer(callbacks=[...])``. They take nothing
from the batch Lightning passes to the hooks; after every training step they read the record the module
publishes, ``pl_module.last_step`` (an :class:`lrl.module.StepRecord`: the trained ``batch``, the trainer's
``old_logp`` computed before the update, the correction ``weights``, the step's ``version`` and its reduced
``metrics``). Their statistics are taken over every rank's tokens. Scalars go to every logger of the trainer
through ``logger.log_metrics``, at the step Lightning gives the batch's own metrics; a few headline keys also
go through ``pl_module.log`` (so they reach ``trainer.callback_metrics`` and the progress bar shows
``mismatch``). Histograms go to the TensorBoard logger's writer when there is one. ``build_callbacks(cfg)``
makes the set a Config switches on; docs/monitoring.md lists every key.
"""

from __future__ import annotations

from lrl.lazy import lazy_names
from lrl.registry import CALLBACKS, supply

# the callbacks load on first use: importing this package (as the config's validation does, to know the registered
# names) imports nothing of Lightning
_LAZY = {
    "EnvironmentMonitor": "lrl.callbacks.environment",
    "HealthCheck": "lrl.callbacks.health",
    "HealthCheckError": "lrl.callbacks.health",
    "JumpMonitor": "lrl.callbacks.jumps",
    "MismatchMonitor": "lrl.callbacks.mismatch",
    "MismatchSplit": "lrl.callbacks.mismatch_split",
    "StalenessMonitor": "lrl.callbacks.staleness",
    "TimingMonitor": "lrl.callbacks.timing",
}


__getattr__ = lazy_names(__name__, _LAZY)


def build_callbacks(cfg) -> list:
    """The monitoring callbacks a Config switches on, in hook order (TimingMonitor last, to time the others)."""
    from lrl.callbacks.environment import EnvironmentMonitor
    from lrl.callbacks.health import HealthCheck
    from lrl.callbacks.jumps import JumpMonitor
    from lrl.callbacks.mismatch import MismatchMonitor
    from lrl.callbacks.staleness import StalenessMonitor
    from lrl.callbacks.timing import TimingMonitor

    m, w = cfg.monitoring, cfg.weighting  # the monitoring section; the correction's cap and band, monitored
    out: list = []
    if m.health_check:
        out.append(HealthCheck(m.health_threshold, m.health_threshold_p99, m.health_strict))
    if m.monitor_mismatch:
        out.append(MismatchMonitor(w.cap, w.low, w.high, histogram_every=m.histogram_every))
    if m.monitor_staleness:
        out.append(StalenessMonitor(histogram_every=m.histogram_every))
    if m.monitor_jumps:
        out.append(JumpMonitor(m.jump_factor))
    if m.monitor_env:  # logs only where the environment reports its tools' times
        out.append(EnvironmentMonitor(histogram_every=m.histogram_every))
    if m.mismatch_split_every:
        from lrl.callbacks.mismatch_split import MismatchSplit

        out.append(MismatchSplit(m.mismatch_split_every, m.mismatch_split_rows))
    out += [supply(CALLBACKS.get(name).factory, cfg) for name in m.callbacks]  # each takes what it names
    if m.monitor_timing:
        out.append(TimingMonitor())
    return out


register = CALLBACKS.register  # @callbacks.register("name") on fn(monitoring, ...) -> a Lightning callback


__all__ = [
    "register",
    "HealthCheck",
    "HealthCheckError",
    "JumpMonitor",
    "MismatchMonitor",
    "MismatchSplit",
    "StalenessMonitor",
    "TimingMonitor",
    "build_callbacks",
]
