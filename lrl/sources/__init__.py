"""Where the trainer's batches come from: the rollout-source seam (:mod:`lrl.sources.base`), the synchronous
source (:mod:`lrl.sources.sync`) and, in :mod:`lrl.pipeline`, the asynchronous one.

The run chooses its source (``lrl.run.build_run``); nothing here imports the asynchronous pipeline.
"""

from __future__ import annotations

from lrl.sources.base import RolloutSource, TaskPicker, rank_seed, score_batch

__all__ = ["RolloutSource", "TaskPicker", "rank_seed", "score_batch"]
