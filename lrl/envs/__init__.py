"""Environments: the interface (``lrl.envs.base``), the registry, and the built-in ones.

``register_env(name)`` decorates a factory ``fn(cfg, tok) -> EnvSpec``; ``tok`` is the run's tokenizer
(``--tokenizer``, or the one saved with ``--model``), or None, in which case the environment brings its own.
``make_env(cfg, tok)`` builds the environment a config names. See docs/extending.md.
"""

from __future__ import annotations

from lrl.envs.base import Env, EnvSpec, FailureInjection, StepResult
from lrl.registry import ENVS

register_env = ENVS.register


def make_env(cfg, tok=None) -> EnvSpec:
    """The environment named by cfg.env, built for this run's tokenizer (None: its own). A chat model's
    tokenizer frames every episode as a conversation: the system message (``system_prompt``, else the
    environment's own instructions) and the observations in ``observation_role`` (lrl.tokenizers)."""
    entry = ENVS.get(cfg.env)
    if getattr(tok, "chat", False):
        from lrl.errors import ConfigError
        from lrl.tokenizers import ChatTemplateError

        system = cfg.system_prompt if cfg.system_prompt is not None else entry.instructions or None
        tok = tok.conversation(system, cfg.observation_role)
        try:  # before the environment frames anything with it
            tok.check_conversation()
        except ChatTemplateError as err:
            raise ConfigError(f"{tokenizer_option(cfg)}: {err}") from None
    return entry.factory(cfg, tok)


def tokenizer_option(cfg) -> str:
    """The option the run's tokenizer came from (the environment's own when neither gives one)."""
    if cfg.tokenizer is not None:
        return f"tokenizer: {cfg.tokenizer!r}"
    if cfg.model is not None:
        return f"model: the tokenizer saved with {cfg.model!r}"
    return f"env: the {cfg.env} environment's own tokenizer"


def run_tokenizer(cfg):
    """The run's tokenizer: --tokenizer, else the one saved with --model, else None (the env's own)."""
    from pathlib import Path

    from lrl.errors import ConfigError
    from lrl.tokenizers import TOKENIZER_FILE, load_tokenizer

    source = cfg.tokenizer
    if source is None and cfg.model is not None:
        model = Path(cfg.model)
        source = (
            cfg.model if (model / TOKENIZER_FILE).exists() or (model / "tokenizer.json").exists() else None
        )
    if source is None:
        return None
    try:
        return load_tokenizer(source)
    except ValueError as err:
        raise ConfigError(f"{'tokenizer' if cfg.tokenizer else 'model'}: {err}") from None


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
