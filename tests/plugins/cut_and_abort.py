"""A test plugin: a staleness policy registered as a user registers one (``--plugins cut_and_abort``). When a worker
sees a newer version it first sends its groups at their last trainable version without their unfinished episodes
(as ``cut``), then stops what can no longer be trained within the bound (as ``abort``): no built-in policy does
both, so a simulation of it shows whether its own hook ran."""

from __future__ import annotations

from lrl.pipeline.policies import Drop, register_stale_policy


@register_stale_policy("cut-and-abort")
class CutAndAbort(Drop):
    """cut a group at its last trainable version, then abort what is past the bound (then drop)"""

    def published(self, worker, version):
        worker.cut_stragglers(version)
        worker.abort_stale(version)
