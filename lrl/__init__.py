"""lrl: reinforcement learning of language-model agents on data from another policy.

Every name loads on first use, so that ``import lrl`` imports nothing heavy (not even torch): a rollout worker
process ties its life to the trainer's before it imports anything (``lrl.pipeline.backends.spawn``).
"""

from lrl.lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "tis_weights": "lrl.weights",
    "mis_weights": "lrl.weights",
    "veto_mask": "lrl.weights",
    "behavior_weights": "lrl.weights",
    "register_correction": "lrl.weights",
    "make_tasks": "lrl.envs.tinyagent",
    "build_tokenizer": "lrl.envs.tinyagent",
    "BugFixEnv": "lrl.envs.tinyagent",
    "make_rl_base": "lrl.envs.tinyagent.base",
    "make_env": "lrl.envs",
    "register_env": "lrl.envs",
    "make_policy": "lrl.policy",
    "load_policy": "lrl.policy",
    "evaluate": "lrl.evaluation",
    "Config": "lrl.config",
    "parse_args": "lrl.arguments",
    "build_run": "lrl.run",
    "fit": "lrl.run",
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_names(__name__, _LAZY)
