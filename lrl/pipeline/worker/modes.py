"""The two scheduling modes of a rollout worker, chosen by the config, and the work a saved state holds."""

from __future__ import annotations

from lrl.pipeline.messages import Work


def mode_class(deterministic: bool):
    """The mode class of a run: deterministic, or free-running."""
    if deterministic:
        from lrl.pipeline.worker.deterministic import Deterministic

        return Deterministic
    from lrl.pipeline.worker.free import FreeRunning

    return FreeRunning


def held_work(deterministic: bool, episodes_per_task: int, state: dict | None) -> list[Work] | None:
    """The work a worker restored from a checkpoint state holds, to give again to a replacement -> [Work]; [] for
    a fresh worker; None when the state does not say. The mode that wrote the state reads it."""
    if state is None:
        return []
    return mode_class(deterministic).held_work(state, episodes_per_task)
