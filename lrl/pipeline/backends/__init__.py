"""Where the rollout workers run (``--rollout-backend``): a registry of backends, chosen like samplers.

Each backend is one class with the methods of :class:`lrl.pipeline.backends.base.Workers` (and a board with those
of :class:`~lrl.pipeline.backends.base.Board`), registered here with the config keys it reads (``uses``), its own
checks of the values and what it needs of the machine (memory, a package: run by the preflight). Built in:

- ``local``: processes on this machine (:mod:`lrl.pipeline.backends.local`), a shared-memory board;
- ``thread``: threads of the trainer's process (:mod:`lrl.pipeline.backends.thread`), for a debugger, a notebook,
  or a machine where spawning is costly;
- ``ray``: Ray actors (:mod:`lrl.pipeline.backends.ray`), weights through the object store (docs/scaling.md).

This module imports nothing heavy (a rollout worker process imports it before anything else): each factory
imports its backend when a run asks for it.
"""

from __future__ import annotations

import importlib.util

from lrl.registry import BACKENDS

register_backend = BACKENDS.register


def make_workers(cfg):
    """The run's rollout workers (not started yet)."""
    return BACKENDS.get(cfg.rollout_backend).factory(cfg)


def _memory_check(cfg) -> list[str]:
    """Workers with a copy of the model each must fit in this machine's memory (the preflight's check: it reads
    the machine's memory and the model's weights)."""
    if cfg.pipeline != "async":
        return []
    from lrl.budget import check_workers

    return check_workers(cfg)


@register_backend("local", check_machine=_memory_check)
def _local(cfg):
    """rollout workers as processes on this machine, spawned, weights in shared memory"""
    from lrl.pipeline.backends.local import LocalWorkers

    return LocalWorkers(cfg.worker_timeout)


def _ray_check(cfg) -> list[str]:
    """Ray actors: resources in Ray's steps; an address that is auto or HOST:PORT."""
    if cfg.pipeline != "async":
        return []
    problems = []
    for name in ("worker_cpus", "worker_gpus"):  # Ray counts resources in units of 1/10,000
        value = getattr(cfg, name)
        steps = value * 10_000
        if value and abs(steps - round(steps)) > 1e-6 * max(1.0, steps):
            problems.append(
                f"{name}: {value!r} is not allowed; Ray counts resources in steps of 0.0001 (e.g. 0.25, 0.0001)"
            )
        elif value and round(steps) == 0:
            problems.append(
                f"{name}: {value!r} is not allowed; it must be 0.0001 or more (Ray's smallest step)"
            )
    address = cfg.ray_address
    if address is not None and address != "auto":
        host, _, port = address.rpartition(":")
        if "://" in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(
                f"ray_address: {address!r} is not allowed; give HOST:PORT of the cluster's head (e.g. "
                "127.0.0.2:6379) or auto"
            )
    return problems


def _ray_machine(cfg) -> list[str]:
    """Ray actors: the package is installed; the actors fit this machine's memory when the run starts its own Ray
    here (with an address, they run on the cluster's machines)."""
    if cfg.pipeline != "async":
        return []
    problems = []
    if importlib.util.find_spec("ray") is None:
        problems.append(
            "rollout_backend: 'ray' needs the ray package, which is not installed: pip install -e \".[ray]\""
        )
    if cfg.ray_address is None:
        problems += _memory_check(cfg)
    return problems


@register_backend(
    "ray",
    uses=("worker_cpus", "worker_gpus", "ray_address", "worker_restarts"),
    check=_ray_check,
    check_machine=_ray_machine,
)
def _ray(cfg):
    """rollout workers as Ray actors, on a Ray this run starts or on a cluster (--ray-address)"""
    from lrl.pipeline.backends.ray.workers import RayWorkers

    return RayWorkers(cfg)


@register_backend("thread")
def _thread(cfg):
    """rollout workers as threads of the trainer's process: one process, for a debugger or a notebook"""
    from lrl.pipeline.backends.thread import ThreadWorkers

    return ThreadWorkers(cfg.worker_timeout)


__all__ = ["BACKENDS", "make_workers", "register_backend"]
