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
    """The environment named by cfg.env, built for this run's tokenizer (None: its own)."""
    return ENVS.get(cfg.env).factory(cfg, tok)


from lrl.envs import review, tinyagent  # noqa: E402  (registers the built-in environments)

__all__ = [
    "Env",
    "EnvSpec",
    "FailureInjection",
    "StepResult",
    "register_env",
    "make_env",
    "ENVS",
    "tinyagent",
    "review",
]
