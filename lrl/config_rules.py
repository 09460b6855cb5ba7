"""The config's cross-key rules: each a function of a whole, well-typed config -> the problems it finds, in words
that name the keys, from the values alone (no file, no process, nothing of the machine: that is the preflight's,
:mod:`lrl.preflight`). The config runs them all (:meth:`lrl.config.Config.validate`) once every field has its type;
an entry's own rules (a sampler's, an environment's, a backend's) live next to its code, in its registry entry.
"""

from __future__ import annotations

import os
import unicodedata

from lrl.registry import REGISTRIES, supply
from lrl.sections import OPTIONS


def _registry_rules(cfg) -> list[str]:
    """An option scoped to a registry is set only for an entry that reads it; each chosen entry's own checks."""
    problems = []
    for f in OPTIONS.values():
        scope = f.meta.get("scope")
        if scope is None or getattr(cfg, f.name) == f.default:
            continue
        if any(getattr(cfg, key) != wanted for key, wanted in f.meta.get("when", {}).items()):
            continue  # an option of another mode altogether: _mode_rules says so
        chosen = getattr(cfg, scope)
        registry = REGISTRIES[scope]
        if not any(f.name in entry.uses for entry in registry.chosen(chosen)):
            users = ", ".join(registry.users(f.name)) or "none"
            value = getattr(cfg, f.name)
            problems.append(f"{f.name}: {value!r} is not used by {scope} {chosen!r}; it applies to: {users}")
    for scope, registry in REGISTRIES.items():
        for entry in registry.chosen(getattr(cfg, scope)):
            if entry.check is not None:
                problems += list(supply(entry.check, cfg))
    return problems


def _mode_rules(cfg) -> list[str]:
    """An option that belongs to a mode (``option(..., when=...)``) is set only in that mode."""
    problems = []
    for f in OPTIONS.values():
        when = f.meta.get("when")
        value = getattr(cfg, f.name)
        if not when or value == f.default:
            continue
        unmet = [key for key, wanted in when.items() if getattr(cfg, key) != wanted]
        if unmet:
            here = ", ".join(f"{key}: {_yaml(getattr(cfg, key))}" for key in unmet)
            needed = ", ".join(f"{key}: {_yaml(wanted)}" for key, wanted in when.items())
            problems.append(f"{f.name}: {value!r} is not used with {here}; it applies only with {needed}")
    return problems


def _yaml(value) -> str:
    """A value as it is written in YAML or on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _pipeline_rules(cfg) -> list[str]:
    """The asynchronous pipeline's workers: no more than the groups of work they share (what each backend
    needs of the machine, memory included, is the preflight's: lrl.pipeline.backends); one patience for ordered, in seconds or in steps."""
    if cfg.pipeline != "async":
        return []
    if cfg.take_patience is not None and cfg.take_patience_steps is not None:
        return ["take_patience and take_patience_steps: give one (seconds, or trainer steps), not both"]
    groups = cfg.tasks_per_step // cfg.world_size
    if cfg.rollout_workers > groups:
        return [
            f"rollout_workers: {cfg.rollout_workers} is more than the {groups} groups of work a step has per "
            f"process (tasks_per_step / (devices x num_nodes)), so some would never work; use at most {groups}"
        ]
    return []


def _run_name_rules(cfg) -> list[str]:
    """The run's folder is <log_dir>/<run_name>: a single folder name, never a path that leaves log_dir."""
    name = cfg.run_name
    separators = {"/", "\0", os.sep, os.altsep} - {None}
    if name in (".", "..") or any(s in name for s in separators):
        return [
            f"run_name: {name!r} is not allowed; it must be one folder name under log_dir "
            "(no '/', not '.' or '..')"
        ]
    if any(unicodedata.category(c).startswith("C") for c in name):  # control, format, unassigned characters
        return [
            f"run_name: {name!r} is not allowed; it holds control characters (a terminal would act on them in "
            "every message that names the run's folder)"
        ]
    return []


def _shared_rules(cfg) -> list[str]:
    """lag only with a synchronous pipeline; max_step_kl only with step_kl; an MIS band with low <= high; no more
    minibatches than a step's episodes; tasks_per_step a multiple of devices x num_nodes. (That model, tokenizer
    and resume exist is the preflight's to check, once a named model is resolved: lrl.preflight.resolve.)"""
    problems = []
    if cfg.pipeline == "async" and cfg.lag:
        problems.append(
            f"lag: {cfg.lag} does not apply to --pipeline async: staleness comes from timing, bounded by max_staleness"
        )
    if cfg.max_step_kl is not None and not cfg.step_kl:
        problems.append("max_step_kl: the update guard needs step_kl: true (it measures the step's KL)")
    if cfg.low > cfg.high:
        problems.append(f"low/high: the MIS band [{cfg.low}, {cfg.high}] is empty; need low <= high")
    if cfg.minibatches > cfg.tasks_per_step * cfg.episodes_per_task:
        episodes = cfg.tasks_per_step * cfg.episodes_per_task
        problems.append(f"minibatches: {cfg.minibatches} is more than the {episodes} episodes of a step")
    if cfg.tasks_per_step % cfg.world_size:
        world = cfg.world_size
        problems.append(
            f"tasks_per_step: {cfg.tasks_per_step} does not split over {world} processes "
            f"(devices x num_nodes); make it a multiple of {world}"
        )
    return problems


def _loss_rules(cfg) -> list[str]:
    """The loss, the proximal policy and the correction fit together: pg has no ratio to a proximal policy; under
    proximal rollout the clipped and CISPO losses' own ratio pi / mu is the correction (a weight on top would count
    it twice); a correction that reads the whole batch needs every row's pi_old before the first minibatch's loss."""
    from lrl.weights import whole_batch

    problems = []
    if cfg.loss == "pg" and cfg.proximal == "interpolate":
        problems.append(
            "proximal: interpolate approximates pi_prox for a loss's ratio, and loss pg has none; "
            "use proximal recompute or rollout"
        )
    if cfg.proximal == "rollout" and cfg.loss != "pg" and cfg.correction != "none":
        problems.append(
            f"correction: with proximal rollout the {cfg.loss} loss's own ratio pi / mu carries the correction, and "
            f"{cfg.correction!r} weights on top would count it twice; use loss pg (whose weights are the "
            "correction), proximal recompute, or a mask"
        )
    batch = whole_batch(cfg.weighting)
    if batch and cfg.proximal != "recompute":
        problems.append(
            f"{', '.join(batch)}: reads the whole batch's pi_old before the first minibatch's loss, and proximal "
            f"{cfg.proximal} scores none; use proximal recompute"
        )
    return problems


def _rollout_rules(cfg) -> list[str]:
    """The rollout engine's own options: a latency that parses, and a timeout that can be met."""
    from lrl.envs.latency import parse_latency

    try:
        parse_latency(cfg.tool_latency)
    except ValueError as err:
        return [f"tool_latency: {err}"]
    return []


RULES = [
    _run_name_rules,
    _shared_rules,
    _mode_rules,
    _pipeline_rules,
    _registry_rules,
    _rollout_rules,
    _loss_rules,
]
