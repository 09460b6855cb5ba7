"""Where the trainer's batches come from: the rollout-source seam (:mod:`lrl.sources.base`), the synchronous
source (:mod:`lrl.sources.sync`) and, in :mod:`lrl.pipeline`, the asynchronous one.

``make_source(cfg, spec, policy)`` chooses the source and its matching sampler for a config.
"""

from __future__ import annotations

from lrl.sources.base import RolloutSource, TaskPicker, rank_seed, score_batch


def make_source(cfg, spec, policy) -> RolloutSource:
    """The run's source: the synchronous one around the configured sampler, or the asynchronous pipeline."""
    if cfg.pipeline == "async":
        from lrl.pipeline.source import AsyncSource

        return AsyncSource(cfg, spec, policy)
    from lrl.sources.sync import SyncSource
    from samplers import make_sampler

    return SyncSource(make_sampler(cfg, spec.tok), spec, cfg)


__all__ = ["RolloutSource", "TaskPicker", "make_source", "rank_seed", "score_batch"]
