"""A test plugin for models that know no task (a real model cut to two layers): one action a turn, rewarded
by a coin its own first token throws (1 when that token's id is even), so every group has rewards that differ
and every step has an update to take."""

from __future__ import annotations

from dataclasses import dataclass

import lrl.envs
from lrl.envs.base import EnvSpec, StepResult


@dataclass(frozen=True)
class CoinTask:
    task_id: int

    @property
    def prompt(self) -> str:
        return f"Task {self.task_id}: say one short word."


class CoinEnv:
    def __init__(self, tok):
        self.tok = tok

    def reset(self, task) -> list[int]:
        return self.tok.prompt(task.prompt)

    def step(self, action: list[int]) -> StepResult:
        reward = float(bool(action) and action[0] % 2 == 0)
        return StepResult([], reward, True, {"invalid": False, "truncated": False, "metrics": {}})


ACTION_TOKENS = 4


@lrl.envs.register_env("coin", instructions="Answer with one word.")
def coin(cfg, tok=None):
    """one turn, reward 1 when the action's first token id is even (a test of the update path alone)"""
    if tok is None:
        raise ValueError("the coin environment needs a model's tokenizer (--model)")
    tasks = [CoinTask(i) for i in range(8)]
    longest = max(len(tok.prompt(t.prompt)) for t in tasks) + ACTION_TOKENS
    return EnvSpec(
        name="coin",
        tok=tok,
        make=lambda: CoinEnv(tok),
        train_tasks=tasks[:6],
        heldout_tasks=tasks[6:],
        max_action_tokens=ACTION_TOKENS,
        max_episode_tokens=longest,
    )
