"""A test plugin: TinyAgent, except that the environment raises after its 20th step in a process."""

from __future__ import annotations

import dataclasses
import os

import lrl.envs
from lrl.envs.tinyagent import BugFixEnv, tinyagent_spec


class CrashingEnv(BugFixEnv):
    steps = 0  # per process

    def step(self, action):
        CrashingEnv.steps += 1
        if CrashingEnv.steps > int(os.environ.get("LRL_CRASH_AFTER", "20")):
            raise RuntimeError("the environment crashed")
        return super().step(action)


@lrl.envs.register_env("crashing", uses=("max_turns",))
def crashing(cfg, tok=None):
    """TinyAgent whose environment raises after 20 steps (a worker that crashes)"""
    spec = tinyagent_spec(tok, cfg.max_turns)
    return dataclasses.replace(spec, make=lambda: CrashingEnv(spec.tok, cfg.max_turns), warm_start=None)
