"""Where the rollout workers run, as the config says (``--rollout-backend``): processes on this machine
(:class:`lrl.pipeline.local.LocalWorkers`) or Ray actors (:class:`lrl.pipeline.ray_backend.RayWorkers`). Both
have one interface, the controller's only way to reach its workers: ``make_board``, ``start``, ``send``,
``receive``, ``check``, ``close``, ``running``."""

from __future__ import annotations


def make_workers(cfg):
    """The run's rollout workers (not started yet)."""
    if cfg.rollout_backend == "ray":
        from lrl.pipeline.ray_backend import RayWorkers

        return RayWorkers(cfg)
    from lrl.pipeline.local import LocalWorkers

    return LocalWorkers(cfg.worker_timeout)
