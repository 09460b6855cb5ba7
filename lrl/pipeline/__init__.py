"""The asynchronous rollout pipeline: workers beside the trainer (``--pipeline async``), see docs/pipeline.md.

- :mod:`lrl.pipeline.source`: the asynchronous rollout source, the controller in the trainer's process
  (throttle, bound, ledger, resume);
- :mod:`lrl.pipeline.schedule`: free-running and deterministic scheduling, on both sides;
- :mod:`lrl.pipeline.worker`: a rollout worker process; :mod:`lrl.pipeline.backends.spawn`, the first code it runs;
- :mod:`lrl.pipeline.backends.local`: worker processes on this machine; :mod:`lrl.pipeline.backends.shared_board`: the weights the
  trainer publishes, in shared memory; :mod:`lrl.pipeline.messages`: what they say to each other.

Names load on first use: a worker process imports this package before anything heavy.
"""

from lrl.lazy import lazy_names

_LAZY = {
    "AsyncSource": "lrl.pipeline.source",
    "WorkerError": "lrl.errors",
    "WeightBoard": "lrl.pipeline.backends.shared_board",
}

__all__ = list(_LAZY)


__getattr__ = lazy_names(__name__, _LAZY)
