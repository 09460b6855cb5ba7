"""The config's cross-key rules: each a function of the sections it reads (its parameters are named for them,
:func:`lrl.registry.supply`) -> the problems it finds, in words that name the keys, from the values
alone (no file, no process, nothing of the machine: that is the preflight's, :mod:`lrl.preflight`). The two rules
that hold for every option alike (its mode, its registry) read the whole config. The config runs them all
(:meth:`lrl.config.Config.validate`) once every field has its type; an entry's own rules (a sampler's, an
environment's, a backend's) live next to its code, in its registry entry.
"""

from __future__ import annotations

import os
import unicodedata

from lrl.options import unmet_mode
from lrl.registry import REGISTRIES, supply
from lrl.sections import (
    OPTIONS,
    BatchOptions,
    EnvironmentOptions,
    RolloutOptions,
    RunOptions,
    SamplingOptions,
    UpdateOptions,
    WeightingOptions,
)


def _registry_rules(cfg) -> list[str]:
    """An option scoped to a registry is set only for an entry that reads it; each chosen entry reads options that
    exist (its uses), and its own checks."""
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
            # a plugin's typo: its option would be refused as unread, or read as an attribute that is not there
            unknown = [key for key in entry.uses if key not in OPTIONS]
            if unknown:
                problems.append(
                    f"{scope}: {entry.name!r} says it reads {', '.join(map(repr, unknown))}, which is no option; "
                    "the uses of its registration must name options"
                )
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
        unmet = unmet_mode(f.meta, lambda key: getattr(cfg, key))
        if unmet:
            here = ", ".join(f"{key}: {_yaml(getattr(cfg, key))}" for key in unmet)
            needed = ", ".join(f"{key}: {_yaml(wanted)}" for key, wanted in when.items())
            problems.append(f"{f.name}: {value!r} is not used with {here}; it applies only with {needed}")
    return problems


def _yaml(value) -> str:
    """A value as it is written in YAML or on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _pipeline_rules(rollout: RolloutOptions, batch: BatchOptions, run: RunOptions) -> list[str]:
    """The asynchronous pipeline's workers: no more than the groups of work they share (what each backend
    needs of the machine, memory included, is the preflight's: lrl.pipeline.backends); one patience for ordered, in seconds or in steps."""
    if rollout.pipeline != "async":
        return []
    if rollout.take_patience is not None and rollout.take_patience_steps is not None:
        return ["take_patience and take_patience_steps: give one (seconds, or trainer steps), not both"]
    groups = batch.tasks_per_step // run.world_size
    if rollout.rollout_workers > groups:
        return [
            f"rollout_workers: {rollout.rollout_workers} is more than the {groups} groups of work a step has per "
            f"process (tasks_per_step / (devices x num_nodes)), so some would never work; use at most {groups}"
        ]
    return []


def _run_name_rules(run: RunOptions) -> list[str]:
    """The run's folder is <log_dir>/<run_name>: a single folder name, never a path that leaves log_dir."""
    name = run.run_name
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


def _lag_rules(rollout: RolloutOptions, sampling: SamplingOptions) -> list[str]:
    """lag only with a synchronous pipeline."""
    if rollout.pipeline == "async" and sampling.lag:
        return [
            f"lag: {sampling.lag} does not apply to --pipeline async: staleness comes from timing, bounded by "
            "max_staleness"
        ]
    return []


def _update_rules(update: UpdateOptions, weighting: WeightingOptions, batch: BatchOptions) -> list[str]:
    """max_step_kl only with step_kl; an MIS band with low <= high; no more minibatches than a step's episodes.
    (That model, tokenizer and resume exist is the preflight's to check, once a named model is resolved:
    lrl.preflight.resolve.)"""
    problems = []
    if update.max_step_kl is not None and not update.step_kl:
        problems.append("max_step_kl: the update guard needs step_kl: true (it measures the step's KL)")
    if weighting.low > weighting.high:
        problems.append(
            f"low/high: the MIS band [{weighting.low}, {weighting.high}] is empty; need low <= high"
        )
    episodes = batch.tasks_per_step * batch.episodes_per_task
    if update.minibatches > episodes:
        problems.append(f"minibatches: {update.minibatches} is more than the {episodes} episodes of a step")
    return problems


def _batch_rules(batch: BatchOptions, run: RunOptions) -> list[str]:
    """tasks_per_step a multiple of devices x num_nodes."""
    world = run.world_size
    if batch.tasks_per_step % world:
        return [
            f"tasks_per_step: {batch.tasks_per_step} does not split over {world} processes "
            f"(devices x num_nodes); make it a multiple of {world}"
        ]
    return []


def _loss_rules(update: UpdateOptions, weighting: WeightingOptions) -> list[str]:
    """The update's parts fit together, as each declares itself (lrl.losses.LossTraits, lrl.proximal.ProximalTraits,
    lrl.masks.MaskTraits; no name is compared here): a proximal policy that approximates pi_prox for a ratio needs a
    loss with one; where pi_prox is mu itself, a loss's own ratio pi / mu is the correction (a weight on top would
    count it twice); a correction that reads the whole batch needs every row's pi_old before the first minibatch's
    loss; a loss whose ratio is its episode's takes no mask that drops single tokens (the ratio would change), and
    one that reads one advantage an episode no weight a token apiece."""
    from lrl.losses import loss_traits
    from lrl.masks import mask_traits
    from lrl.proximal import proximal_traits
    from lrl.weights import whole_batch

    loss, proximal = loss_traits(update.loss), proximal_traits(update.proximal)
    weighted = weighting.correction != "none"
    problems = []
    if proximal.approximates and loss.ratio is None:
        problems.append(
            f"proximal: {update.proximal} approximates pi_prox for a loss's ratio, and loss {update.loss} has none; "
            "use proximal recompute or rollout"
        )
    if proximal.is_mu and loss.ratio is not None and weighted:
        problems.append(
            f"correction: with proximal {update.proximal} the {update.loss} loss's own ratio pi / mu carries the "
            f"correction, and {weighting.correction!r} weights on top would count it twice; use loss pg (whose "
            "weights are the correction), proximal recompute, or a mask"
        )
    batch = whole_batch(weighting)
    if batch and not proximal.scores_pi_old:
        problems.append(
            f"{', '.join(batch)}: reads the whole batch's pi_old before the first minibatch's loss, and proximal "
            f"{update.proximal} scores none; use proximal recompute"
        )
    if loss.ratio == "sequence":
        for name in weighting.masks:
            if mask_traits(name, weighting).level == "token":
                problems.append(
                    f"masks: {name} drops single tokens, which changes the {update.loss} loss's ratio of each episode "
                    "(the mean over its tokens); use a mask that keeps or drops whole episodes (opsm, or kl with "
                    "kl_level seq_mean, seq_sum or seq_max)"
                )
    if loss.episode_advantage and weighted and weighting.level == "token":
        problems.append(
            f"level: token gives each token a weight of its own, and loss {update.loss} reads one advantage an "
            "episode; use level sequence or geometric"
        )
    return problems


def _unread_rules(update: UpdateOptions, weighting: WeightingOptions) -> list[str]:
    """Weighting options set where nothing reads them, which would otherwise be ignored without a word: a level with a
    correction that takes no ratio at one (none, or an entry whose uses leave it out) and no normalize, a normalize
    of correction none's weights (all 1). (A loss's or an aggregation's options are scoped to their registries: one
    that no chosen entry reads is _registry_rules'.)"""
    from lrl.registry import CORRECTIONS

    problems = []
    reads_level = "level" in CORRECTIONS.get(weighting.correction).uses
    if weighting.correction == "none" and weighting.normalize:  # its weights are the action mask, of mean 1
        problems.append(
            "normalize: true is not used by correction 'none' (its weights are all 1, already their own mean); "
            f"it applies to: {', '.join(n for n in CORRECTIONS.names() if n != 'none')}"
        )
    elif weighting.level != OPTIONS["level"].default and not (reads_level or weighting.normalize):
        users = ", ".join(CORRECTIONS.users("level")) or "none"
        problems.append(
            f"level: {weighting.level!r} is not used by correction {weighting.correction!r}; it applies to: {users} "
            "(and to normalize)"
        )
    return problems


def _rollout_rules(environment: EnvironmentOptions) -> list[str]:
    """The rollout engine's own options: a latency that parses, and a timeout that can be met."""
    from lrl.envs.latency import parse_latency

    try:
        parse_latency(environment.tool_latency)
    except ValueError as err:
        return [f"tool_latency: {err}"]
    return []


RULES = [
    _run_name_rules,
    _lag_rules,
    _update_rules,
    _batch_rules,
    _mode_rules,
    _pipeline_rules,
    _registry_rules,
    _rollout_rules,
    _loss_rules,
    _unread_rules,
]
