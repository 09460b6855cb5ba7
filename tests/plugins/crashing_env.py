"""A test plugin: TinyAgent, except that the environment raises when it is reset after its 20th episode in a
process (a step that raises is an environment failure; a reset that raises is a broken worker)."""

from __future__ import annotations

import dataclasses
import os

import lrl.envs
from lrl.envs.tinyagent import BugFixEnv, tinyagent_spec


class CrashingEnv(BugFixEnv):
    resets = 0  # per process

    def reset(self, task):
        CrashingEnv.resets += 1
        if CrashingEnv.resets > int(os.environ.get("LRL_CRASH_AFTER", "20")):
            raise RuntimeError("the environment crashed")
        return super().reset(task)


@lrl.envs.register_env("crashing", uses=("max_turns",))
def crashing(cfg, tok=None):
    """TinyAgent whose environment raises on reset after 20 episodes (a worker that crashes)"""
    spec = tinyagent_spec(tok, cfg.max_turns)
    return dataclasses.replace(spec, make=lambda: CrashingEnv(spec.tok, cfg.max_turns), warm_start=None)
