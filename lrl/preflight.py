"""The preflight: a run's config resolved and checked against the machine, its environment and its model, before
anything is trained, once, in the process that starts the run. (The config's own rules, which need nothing but the
config, were checked when it was made: the static phase, :meth:`lrl.config.Config.validate`, which touches nothing
of the machine.) The rollout workers are given the values resolved here and neither check nor resolve them again
(:meth:`lrl.config.Config.resolved`).

Each check would otherwise surface late and misleadingly: a path that cannot be written after an hour of training, a
tokenizer that cannot spell the environment's actions (every action malformed, after a warm start of minutes on an
impossible target), a model whose context is shorter than an episode (a position lookup failing in the middle of a
rollout), a checkpoint whose weights do not fit the model (a failure deep inside the restore). Each raises
:class:`lrl.config.ConfigError` naming the option, what was found and what is needed. :func:`lrl.run.build_run`
makes the checks in this order, each as soon as what it checks exists:

- :func:`resolve`: a named model becomes its cached folder (converted the first time); model, tokenizer and resume
  exist; each chosen entry's needs of the machine (its registry entry's ``check_machine``: the rollout workers'
  memory, a sandbox level asked by name, a package, a task folder);
- :func:`check_paths`: every path option against the file system (before anything is read or written);
- :func:`check_environment`: the tokenizer against the environment's actions, the memory a step needs against the
  machine's (-> the step's memory plan);
- :func:`check_model`: the model's context against the longest episode, every chosen entry's own ``check_model``
  (a sampler's engine, an environment's needs), the model's vocabulary against the tokenizer;
- :func:`check_checkpoint`: the checkpoint a run resumes against the model, the optimizer and the data module.
"""

from __future__ import annotations

import json
from pathlib import Path

from lrl.config import Config, ConfigError
from lrl.envs import tokenizer_option
from lrl.registry import REGISTRIES, supply

# the checks in the order a run makes them (docs/options.md lists them from here)
__all__ = ["resolve", "check_paths", "check_environment", "check_model", "check_checkpoint"]


def resolve(cfg: Config) -> Config:
    """model, tokenizer: a named model (smollm2-135m) becomes its cached folder, converted the first time; model,
    tokenizer, resume (other than last): exist; every chosen entry's check_machine: what it needs of this machine
    (the rollout workers' memory, a sandbox level asked by name, an installed package, a task folder). The config
    takes the resolved values (and is returned); one ConfigError lists every problem."""
    from lrl.models import ModelUnavailable, is_named, resolve_model
    from lrl.options import exists

    problems = []
    for name in ("model", "tokenizer"):
        value = getattr(cfg, name)
        if is_named(value):
            try:
                setattr(cfg, name, str(resolve_model(value)))
            except ModelUnavailable as err:
                problems.append(f"{name}: {err}")
        elif value is not None and not exists(value):
            problems.append(f"{name}: {value!r} does not exist; give a local save_pretrained directory")
    if cfg.resume is not None and cfg.resume != "last" and not exists(cfg.resume):
        problems.append(
            f"resume: {cfg.resume!r} does not exist; give a run folder, a checkpoint file or 'last'"
        )
    if not problems:  # an entry's needs are judged on the model the run will have
        for scope, registry in REGISTRIES.items():
            for entry in registry.chosen(getattr(cfg, scope)):
                if entry.check_machine is not None:
                    problems += list(supply(entry.check_machine, cfg))
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def check_paths(cfg: Config) -> None:
    """log_dir, checkpoint_dir, history_file, resume, model, tokenizer: not under /proc, /sys or /dev; a folder where
    a folder is wanted and a regular file (or nothing) where a file is wanted; a model folder that holds a readable
    config.json; a history file that is lrl's; a checkpoint folder that no live run holds and whose last.ckpt is
    replaced only with --overwrite."""
    from lrl.runs import check_paths as check_run_paths

    check_run_paths(cfg)
    problems = check_model_folder(cfg.model)
    if problems:
        raise ConfigError("; ".join(problems))


def check_model_folder(value: str | None) -> list[str]:
    """Problems of a --model folder that keep it from being a model: no config.json, or one that is not a JSON
    object (checked before its tokenizer or environment are built from it, so the message names the folder)."""
    from lrl.pathkinds import kind as kind_of

    if value is None or kind_of(Path(value)) != "dir":
        return []
    config = Path(value) / "config.json"
    kind = kind_of(config)
    if kind == "missing":
        return [f"model: {value!r} holds no config.json; it must be a transformers save_pretrained folder"]
    if kind != "file":
        return [f"model: {str(config)!r} is {'a folder' if kind == 'dir' else kind}; it must be a file"]
    try:
        with open(config, "rb") as f:
            data = json.loads(f.read(2**20))
    except OSError as err:
        return [f"model: {str(config)!r} cannot be read ({err.strerror})"]
    except ValueError as err:  # not JSON, not UTF-8, or larger than any model's config
        return [f"model: {str(config)!r} cannot be read as JSON ({' '.join(str(err).split())[:120]})"]
    if not isinstance(data, dict):
        return [f"model: {str(config)!r} cannot be read as a model's config (a JSON object)"]
    return []


def check_environment(cfg: Config, spec, sampler=None):
    """tokenizer: spells every example action of the environment; model: a context (its config.json's
    max_position_embeddings) as long as the environment's longest episode, before any weight is loaded;
    episodes_per_task, eval_episodes: a step and an evaluation fit the machine's memory, with the copies the
    sampler declares in a synchronous run (`sampler`; the error gives the estimate) -> the step's memory plan."""
    from lrl.budget import check_budget, model_shape
    from lrl.policy import DEFAULT_SIZE

    check_tokenizer(cfg, spec)
    context = model_shape(cfg, len(spec.tok), 0)[3]  # the model's config.json, before any weight is loaded
    check_context(
        cfg, spec, context or None
    )  # a context too short for an episode is that, not a memory figure
    return check_budget(cfg, spec, DEFAULT_SIZE["max_position_embeddings"], sampler)


def check_model(cfg: Config, spec, model) -> None:
    """model: a context (max_position_embeddings, n_positions) as long as the environment's longest episode, what
    every chosen entry asks of a model (its registry entry's check_model: a vLLM engine's head sizes and cache, say),
    a vocabulary that covers the tokenizer; precision: fp16 only where the device's autocast computes it."""
    from lrl.decoding import context_length
    from lrl.policy import check_vocabulary
    from lrl.precision import accelerator_device, fp16_problem

    check_context(cfg, spec, context_length(model))
    problems = []
    if cfg.precision == "fp16":
        problems += [p for p in [fp16_problem(accelerator_device(cfg.accelerator))] if p]
    for scope, registry in REGISTRIES.items():
        for entry in registry.chosen(getattr(cfg, scope)):
            if entry.check_model is not None:
                problems += list(supply(entry.check_model, cfg, spec=spec, model=model))
    if problems:
        raise ConfigError("; ".join(problems))
    try:
        check_vocabulary(model, spec.tok)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_checkpoint(path: str, module, datamodule) -> None:
    """resume: the checkpoint's entries fit this run: every weight of the model's shape and dtype, optimizer state
    that matches the weights, lrl's own state and the data module's."""
    from lrl.checkpoint import check_contents

    check_contents(path, module, datamodule)


def _round_trip(tok, action: str) -> str | None:
    """What goes wrong when `action` is encoded then decoded (None: it comes back word for word)."""
    try:
        back = tok.decode(tok.encode(action), skip_special=False)
    except (ValueError, KeyError) as err:  # the word tokenizer refuses a word it does not know
        return f"cannot be encoded ({str(err)})"
    return None if back.split() == action.split() else f"comes back as {back!r}"


def check_tokenizer(cfg: Config, spec) -> None:
    """Every example action of the environment (``spec.actions``) survives encode then decode word for word.

    Environments read an action as the words of ``decode(ids)``, so a tokenizer that maps a word of an action
    to an unknown token (or drops it) can never produce a well-formed action. (A chat model's template is
    checked where the environment is made: lrl.envs.make_env.)
    """
    for action in spec.actions:
        wrong = _round_trip(spec.tok, action)
        if wrong is not None:
            source = tokenizer_option(cfg.policy, cfg.environment.env)
            raise ConfigError(
                f"{source} cannot spell the {spec.name} action {action!r}: encoded and "
                f"decoded, it {wrong}; use a tokenizer whose vocabulary holds the action's words"
            )


def check_context(cfg: Config, spec, context: int | None) -> None:
    """The model's context (max_position_embeddings or n_positions) holds the environment's longest episode."""
    need = spec.max_episode_tokens
    if context is None or need is None or context >= need:
        return
    name = repr(cfg.model) if cfg.model is not None else f"the {spec.name} policy"
    system = f", a system_prompt of {len(cfg.system_prompt):,} characters" if cfg.system_prompt else ""
    raise ConfigError(
        f"model: {name} has a context of {context:,} positions, but the longest {spec.name} episode "
        f"(max_turns {cfg.max_turns}{system}) needs {need:,} positions; use a model with a longer context "
        f"(max_position_embeddings) or fewer turns{' or a shorter system_prompt' if system else ''}"
    )
