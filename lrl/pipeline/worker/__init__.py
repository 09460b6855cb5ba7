"""A rollout worker: the process shell (:mod:`.shell`) and its two scheduling modes (:mod:`.free`,
:mod:`.deterministic`, on :mod:`.mode`), each owning its checkpoint format.

Names load on first use: a spawned worker imports this package before anything heavy.
"""

from __future__ import annotations

from lrl.lazy import lazy_names

_LAZY = {
    "worker_main": "lrl.pipeline.worker.shell",
    "Worker": "lrl.pipeline.worker.shell",
    "shadow_model": "lrl.pipeline.worker.shell",
    "held_work": "lrl.pipeline.worker.modes",
    "mode_class": "lrl.pipeline.worker.modes",
}

__all__ = list(_LAZY)


__getattr__ = lazy_names(__name__, _LAZY)
