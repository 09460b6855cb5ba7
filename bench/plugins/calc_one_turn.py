"""The calc tasks as one turn, for comparing lrl with trainers that run one completion a prompt (bench_vs_trl.py).

An lrl plugin (``--plugins calc_one_turn`` with bench/plugins/ on the path) registering the environment ``calc1``: the
calc problems and system message of ``--env calc``, one reply of at most 24 tokens, and a score that one reply can
earn: 1 for a right answer, or for a calculator call whose value is the answer (``calc 59 * 12`` to "What is 59 *
12?"). :func:`one_turn_reward` is the same score for any trainer that hands over the reply's text.
"""

from __future__ import annotations

import dataclasses

from lrl.envs.base import StepResult
from lrl.envs.calc import CALC_DEFAULTS, INSTRUCTIONS, calc_spec, evaluate, parse
from lrl.registry import ENVS

REPLY_TOKENS = 24  # the longest reply, its end-of-turn token included (TRL's max_completion_length)


def one_turn_reward(text: str, answer: float) -> float:
    """1.0 for a reply whose answer, or whose calculator call's value, is `answer`; else 0.0."""
    kind, value = parse(text)
    if kind == "answer":
        return float(value == answer)
    if kind == "calc":
        try:
            return float(evaluate(value) == answer)
        except ValueError:  # the calculator refuses it (lrl.envs.calc.ExpressionError)
            return 0.0
    return 0.0


class OneTurnCalc:
    """reset(task) -> prompt ids; step(reply ids) -> the episode's end, scored by :func:`one_turn_reward`."""

    def __init__(self, tok):
        self.tok = tok
        self.task = None

    def reset(self, task) -> list[int]:
        self.task = task
        return self.tok.prompt(task.prompt)

    def step(self, action: list[int]) -> StepResult:
        ended = bool(action) and action[-1] == self.tok.eos_id
        text = self.tok.decode(action[:-1] if ended else action)
        kind, _ = parse(text)
        info = {"invalid": kind == "invalid", "truncated": False, "metrics": {"cut": float(not ended)}}
        return StepResult([], one_turn_reward(text, self.task.answer), True, info)


ONE_TURN_DEFAULTS = {**CALC_DEFAULTS, "max_turns": 1}


@ENVS.register("calc1", defaults=ONE_TURN_DEFAULTS, instructions=INSTRUCTIONS)
def calc1(cfg, tok=None):
    """the calc tasks as one reply of at most 24 tokens: a right answer or a right calculator call scores"""
    spec = calc(cfg, tok)
    prompt = max(len(spec.tok.prompt(t.prompt)) for t in spec.train_tasks + spec.heldout_tasks)
    return dataclasses.replace(
        spec,
        name="calc1",
        make=lambda: OneTurnCalc(spec.tok),
        max_action_tokens=REPLY_TOKENS,
        max_episode_tokens=prompt + REPLY_TOKENS,
        metrics=("cut",),
    )


def calc(cfg, tok):
    if tok is None or not getattr(tok, "chat", False):
        raise ValueError("calc1 needs a chat model's tokenizer: give --model (e.g. smollm2-135m)")
    return calc_spec(tok, 1)
