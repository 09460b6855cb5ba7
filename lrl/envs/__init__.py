"""Environments: the interface (``lrl.envs.base``), the registry, and the built-in ones.

``register_env(name)`` decorates a factory ``fn(environment, tok=None) -> EnvSpec``: it takes what its parameters
name (:func:`lrl.registry.supply`), its environment section (:class:`lrl.sections.EnvironmentOptions`) and ``tok``,
the run's tokenizer (``--tokenizer``, or the one saved with ``--model``), or None, in which case the environment
brings its own. ``make_env(cfg, tok)`` builds the environment a config names. See docs/extending.md.
"""

from __future__ import annotations

import dataclasses

from lrl.envs.base import Env, EnvSpec, FailureInjection, StepResult, tokenizer_option
from lrl.registry import ENVS, supply
from lrl.sections import EnvironmentOptions, PolicyOptions

register_env = ENVS.register


def make_env(cfg, tok=None) -> EnvSpec:
    """The environment named by the config's environment section, built for this run's tokenizer (None: its own),
    with what its factory's parameters name (:func:`lrl.registry.supply`). A chat model's tokenizer frames every
    episode as a conversation: the system message (``system_prompt``, else the environment's own instructions) and
    the observations in ``observation_role`` (lrl.tokenizers). A step's tasks must be among its train tasks."""
    from lrl.errors import ConfigError

    env, policy = cfg.environment, cfg.policy
    entry = ENVS.get(env.env)
    if getattr(tok, "chat", False):
        from lrl.budget import model_config
        from lrl.tokenizers import ChatTemplateError

        check_system_prompt(env.system_prompt, tok, model_config(cfg).get("max_position_embeddings"))
        system = env.system_prompt if env.system_prompt is not None else entry.instructions or None
        tok = tok.conversation(system, env.observation_role)
        try:  # before the environment frames anything with it
            tok.check_conversation()
        except ChatTemplateError as err:
            raise ConfigError(f"{tokenizer_option(policy, env.env)}: {err}") from None
        check_role(env, tok)
    else:
        for name, unset in (("system_prompt", None), ("observation_role", "user")):
            if getattr(env, name) != unset:
                raise ConfigError(
                    f"{name}: {getattr(env, name)[:40]!r} needs a chat model, and the run's tokenizer ("
                    f"{tokenizer_option(policy, env.env)}) has no chat template; leave it unset or give --model a "
                    "chat model"
                )
    spec = with_turn_tokens(supply(entry.factory, cfg, tok=tok), env.turn_tokens, env.max_turns)
    per_step, train = cfg.batch.tasks_per_step, len(spec.train_tasks)
    if per_step > train:
        raise ConfigError(f"tasks_per_step: {per_step} is more than the {train} train tasks of {env.env}")
    return spec


def with_turn_tokens(spec: EnvSpec, turn_tokens: int | None, max_turns: int) -> EnvSpec:
    """The spec with its reply budget set to ``turn_tokens`` (None: as the environment made it); the bound on an
    episode's length moves by the change of every turn's budget."""
    if turn_tokens is None or turn_tokens == spec.max_action_tokens:
        return spec
    longest = spec.max_episode_tokens
    if longest is not None:
        longest += max_turns * (turn_tokens - spec.max_action_tokens)
    return dataclasses.replace(spec, max_action_tokens=turn_tokens, max_episode_tokens=longest)


def check_system_prompt(system: str | None, tok, context) -> None:
    """A --system-prompt that spells the template's own markers, or that alone is longer than the model's context
    (`context`, its max_position_embeddings, where known), is refused (ConfigError) before any episode is framed
    with it."""
    from lrl.errors import ConfigError

    if system is None:
        return
    markers = tok.specials_in(system)
    if markers:
        raise ConfigError(
            f"system_prompt: it holds {markers[0]!r}, a special token of the model's tokenizer, which its chat "
            "template would render as its own marker (a turn ended or begun where the message does not mean "
            "one); it is refused, not escaped: remove it"
        )
    if isinstance(context, int):  # tokenised once here, before each task's prompt is (576 of them for calc)
        n = len(tok.conversation(system).prompt(""))
        if n >= context:
            raise ConfigError(
                f"system_prompt: its {len(system):,} characters are {n:,} tokens, longer than the model's "
                f"context of {context:,} tokens (max_position_embeddings); shorten it"
            )


def check_role(env: EnvironmentOptions, tok) -> None:
    """An --observation-role that the model's chat template does not render as a role of its own is refused
    unless --allow-any-role asks for it."""
    from lrl.errors import ConfigError

    role = env.observation_role
    if env.allow_any_role or tok.renders_as_its_own(role):
        return
    raise ConfigError(
        f"observation_role: the model's chat template renders {role!r} as it would any name, not as a role of "
        "its own, so the model would be shown a role it was not trained on; use user (the default), or "
        "--allow-any-role true to use it anyway"
    )


def run_tokenizer(policy: PolicyOptions):
    """The run's tokenizer: --tokenizer, else the one saved with --model, else None (the env's own)."""
    from pathlib import Path

    from lrl.errors import ConfigError
    from lrl.tokenizers import TOKENIZER_FILE, load_tokenizer

    source = policy.tokenizer
    if source is None and policy.model is not None:
        model = Path(policy.model)
        source = (
            policy.model if (model / TOKENIZER_FILE).exists() or (model / "tokenizer.json").exists() else None
        )
    if source is None:
        return None
    try:
        return load_tokenizer(source)
    except ValueError as err:
        raise ConfigError(f"{'tokenizer' if policy.tokenizer else 'model'}: {err}") from None


from lrl.envs import calc, codefix, review, tinyagent  # noqa: E402  (registers the built-in environments)

__all__ = [
    "Env",
    "EnvSpec",
    "FailureInjection",
    "StepResult",
    "register_env",
    "make_env",
    "run_tokenizer",
    "tokenizer_option",
    "ENVS",
    "calc",
    "tinyagent",
    "review",
    "codefix",
]
