"""Checks of the run's tokenizer and model against its environment, made before anything is trained.

Each would otherwise surface late and misleadingly: a tokenizer that cannot spell the environment's actions
makes every action malformed (after a warm start of minutes on an impossible target), and a model whose
context is shorter than an episode fails at a position lookup in the middle of a rollout. Both raise
:class:`lrl.config.ConfigError`, naming the option, what was found and what is needed. (Whether a model
loaded with ``--model`` is a finite, causal LM is checked when it is loaded: ``lrl.policy.load_policy``.)
"""

from __future__ import annotations

from lrl.config import Config, ConfigError


def tokenizer_option(cfg: Config) -> str:
    """The option the run's tokenizer came from (the environment's own when neither gives one)."""
    if cfg.tokenizer is not None:
        return f"tokenizer: {cfg.tokenizer!r}"
    if cfg.model is not None:
        return f"model: the tokenizer saved with {cfg.model!r}"
    return f"env: the {cfg.env} environment's own tokenizer"


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
            raise ConfigError(
                f"{tokenizer_option(cfg)} cannot spell the {spec.name} action {action!r}: encoded and "
                f"decoded, it {wrong}; use a tokenizer whose vocabulary holds the action's words"
            )


def check_model(cfg: Config, spec, model) -> None:
    """The model's context (max_position_embeddings or n_positions) holds the environment's longest episode."""
    from lrl.decoding import context_length

    context = context_length(model)
    need = spec.max_episode_tokens
    if context is None or need is None or context >= need:
        return
    name = repr(cfg.model) if cfg.model is not None else f"the {spec.name} policy"
    raise ConfigError(
        f"model: {name} has a context of {context} positions, but the longest {spec.name} episode "
        f"(max_turns {cfg.max_turns}) needs {need} positions; use a model with a longer context "
        "(max_position_embeddings) or fewer turns"
    )
