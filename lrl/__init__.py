"""lrl: reinforcement learning of language-model agents on data from another policy.

Light names (the importance weights, the simulator) import without transformers or Lightning; the rest
load on first use so that ``import lrl`` stays cheap.
"""

from importlib import import_module

from lrl.weights import behavior_weights, mis_weights, register_correction, tis_weights, veto_mask

__version__ = "0.1.0"

_LAZY = {
    "make_tasks": "lrl.envs.tinyagent",
    "build_tokenizer": "lrl.envs.tinyagent",
    "BugFixEnv": "lrl.envs.tinyagent",
    "make_rl_base": "lrl.envs.tinyagent.base",
    "make_env": "lrl.envs",
    "register_env": "lrl.envs",
    "make_policy": "lrl.policy",
    "load_policy": "lrl.policy",
    "evaluate": "lrl.rollout",
    "Config": "lrl.config",
    "parse_args": "lrl.arguments",
    "build_run": "lrl.run",
    "fit": "lrl.run",
}

__all__ = [
    "tis_weights",
    "mis_weights",
    "veto_mask",
    "behavior_weights",
    "register_correction",
    "__version__",
    *_LAZY,
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lrl' has no attribute {name!r}")
