"""A rollout worker: the process shell (:mod:`.shell`) and its two scheduling modes (:mod:`.free`,
:mod:`.deterministic`, on :mod:`.mode`), each owning its checkpoint format.

Names load on first use: a spawned worker imports this package before anything heavy.
"""

from __future__ import annotations

from importlib import import_module

_LAZY = {
    "worker_main": "lrl.pipeline.worker.shell",
    "Worker": "lrl.pipeline.worker.shell",
    "shadow_model": "lrl.pipeline.worker.shell",
    "held_work": "lrl.pipeline.worker.modes",
    "mode_class": "lrl.pipeline.worker.modes",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lrl.pipeline.worker' has no attribute {name!r}")
