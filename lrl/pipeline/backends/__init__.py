"""Where the rollout workers run (``--rollout-backend``): a registry of backends, chosen like samplers.

Each backend is one class with the methods of :class:`lrl.pipeline.backends.base.Workers` (and a board with those
of :class:`~lrl.pipeline.backends.base.Board`), registered here with the config keys it reads (``uses``), its own
checks of the values and what it needs of the machine (memory, a package: run by the preflight). A backend's
factory is given the run's :class:`lrl.sections.RolloutOptions`, which hold every option of the workers, and its
checks the sections their parameters name (:func:`lrl.registry.supply`). Built in:

- ``local``: processes on this machine (:mod:`lrl.pipeline.backends.local`), a shared-memory board;
- ``thread``: threads of the trainer's process (:mod:`lrl.pipeline.backends.thread`), for a debugger, a notebook,
  or a machine where spawning is costly;
- ``ray``: Ray actors (:mod:`lrl.pipeline.backends.ray`), weights through the object store (docs/scaling.md).

This module imports nothing heavy (a rollout worker process imports it before anything else): each factory
imports its backend when a run asks for it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from lrl.registry import BACKENDS

if TYPE_CHECKING:
    from lrl.sections import PolicyOptions, RolloutOptions, RunOptions

register_backend = BACKENDS.register


def make_workers(rollout: RolloutOptions):
    """The run's rollout workers (not started yet), made by the chosen backend from the rollout options."""
    return BACKENDS.get(rollout.rollout_backend).factory(rollout)


def _memory_check(rollout: RolloutOptions, policy: PolicyOptions, run: RunOptions) -> list[str]:
    """Workers with a copy of the model each must fit in this machine's memory (the preflight's check: it reads
    the machine's memory and the model's weights)."""
    if rollout.pipeline != "async":
        return []
    from lrl.budget import check_workers

    return check_workers(rollout, policy, run.devices)


@register_backend("local", check_machine=_memory_check)
def _local(rollout: RolloutOptions):
    """rollout workers as processes on this machine, spawned, weights in shared memory"""
    from lrl.pipeline.backends.local import LocalWorkers

    return LocalWorkers(rollout.worker_timeout)


def _ray_check(rollout: RolloutOptions) -> list[str]:
    """Ray actors: resources in Ray's steps; an address that is auto or HOST:PORT."""
    if rollout.pipeline != "async":
        return []
    problems = []
    for name in ("worker_cpus", "worker_gpus"):  # Ray counts resources in units of 1/10,000
        value = getattr(rollout, name)
        steps = value * 10_000
        if value and abs(steps - round(steps)) > 1e-6 * max(1.0, steps):
            problems.append(
                f"{name}: {value!r} is not allowed; Ray counts resources in steps of 0.0001 (e.g. 0.25, 0.0001)"
            )
        elif value and round(steps) == 0:
            problems.append(
                f"{name}: {value!r} is not allowed; it must be 0.0001 or more (Ray's smallest step)"
            )
    address = rollout.ray_address
    if address is not None and address != "auto":
        host, _, port = address.rpartition(":")
        if "://" in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(
                f"ray_address: {address!r} is not allowed; give HOST:PORT of the cluster's head (e.g. "
                "127.0.0.2:6379) or auto"
            )
    return problems


def _ray_machine(rollout: RolloutOptions, policy: PolicyOptions, run: RunOptions) -> list[str]:
    """Ray actors: the package is installed; the actors fit this machine's memory when the run starts its own Ray
    here (with an address, they run on the cluster's machines)."""
    if rollout.pipeline != "async":
        return []
    problems = []
    if importlib.util.find_spec("ray") is None:
        problems.append(
            "rollout_backend: 'ray' needs the ray package, which is not installed: pip install -e \".[ray]\""
        )
    if rollout.ray_address is None:
        problems += _memory_check(rollout, policy, run)
    return problems


@register_backend(
    "ray",
    uses=("worker_cpus", "worker_gpus", "ray_address", "worker_restarts"),
    check=_ray_check,
    check_machine=_ray_machine,
)
def _ray(rollout: RolloutOptions):
    """rollout workers as Ray actors, on a Ray this run starts or on a cluster (--ray-address)"""
    from lrl.pipeline.backends.ray.workers import RayWorkers

    return RayWorkers(rollout)


@register_backend("thread")
def _thread(rollout: RolloutOptions):
    """rollout workers as threads of the trainer's process: one process, for a debugger or a notebook"""
    from lrl.pipeline.backends.thread import ThreadWorkers

    return ThreadWorkers(rollout.worker_timeout)


__all__ = ["BACKENDS", "make_workers", "register_backend"]
