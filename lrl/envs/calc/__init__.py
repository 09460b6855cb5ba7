"""calc: arithmetic word problems with a calculator tool, for a real chat model (``--env calc``).

Each task is a short story over two two-digit numbers whose answer is one expression (``a * b``, ``a + b`` or
``a - b``). The model may call the calculator (``calc 17 * 25`` returns ``calc: 17 * 25 = 425`` as the next
turn) before it answers (``answer 425``). A 135M-parameter model gets most products wrong on its own and must
learn both to build the expression from the story and to use the tool in the format it is told. The train and
held-out problems never share a pair of numbers. Its defaults are a recipe for SmolLM2-135M-Instruct on two CPU
cores (docs/real_model.md).
"""

from __future__ import annotations

from lrl.envs.base import EnvSpec, tokenizer_option
from lrl.envs.calc.calculator import LINE_CHARACTERS, LONGEST_LINE
from lrl.envs.calc.env import CalcEnv, evaluate, parse
from lrl.envs.calc.tasks import CalcTask, make_calc_tasks
from lrl.registry import ENVS
from lrl.sections import EnvironmentOptions, PolicyOptions

INSTRUCTIONS = "You have a calculator. To use it, reply: calc <expression>. To give your final answer, reply: answer <number>."
ACTION_TOKENS = 40  # the longest reply of one turn, its end-of-turn token included
CALC_DEFAULTS = {
    "model": "smollm2-135m",
    "max_turns": 3,
    "tasks_per_step": 4,
    "episodes_per_task": 8,
    "minibatches": 1,
    "lr": 5e-5,  # with sampling at 0.7, what gained 0.25 held-out greedy on each of 8 seeds (docs/real_model.md)
    "temperature": 0.7,  # sampling and training; at 1 and 5e-5, three of the same 8 seeds gained under 0.25
    "lr_schedule": "constant",
    "paired_streams": True,  # a seed's runs see the same problems and uniforms whatever the sampler (sync only)
    "max_steps": 30,
    "threads": 2,  # a real model's matrix products use both cores of a 2-core machine
    "eval_every": 10,
    "eval_episodes": 1,
    "eval_temperature": 0.0,  # greedy: what the model answers when deployed; train/reward is the sampled rate
    "step_kl": False,  # the step's KL costs a forward over the batch (a quarter of a step on a CPU) ...
    "max_step_kl": None,  # ... and the update guard needs it, and a copy of weights and moments
}


@ENVS.register("calc", uses=("max_turns",), defaults=CALC_DEFAULTS, instructions=INSTRUCTIONS)
def calc(environment: EnvironmentOptions, policy: PolicyOptions, tok=None) -> EnvSpec:
    """word problems with a calculator tool, for a chat model (default --model smollm2-135m)"""
    if tok is None or not getattr(tok, "chat", False):
        from lrl.errors import ConfigError

        raise ConfigError(
            f"env: calc needs a chat model's tokenizer, and the run's ({tokenizer_option(policy, 'calc')}) has no "
            "chat template; give --model a chat model (e.g. smollm2-135m)"
        )
    return calc_spec(tok, environment.max_turns)


def longest_observation(tok) -> int:
    """Tokens of the longest observation the calculator can give: the template's framing of an empty turn, and
    the longest line it can answer with, each character as many tokens as the costliest character a line can hold
    takes alone (a tokenizer never needs more tokens for a text than for its characters one by one)."""
    per_character = max(len(tok.encode(c)) for c in LINE_CHARACTERS)
    return len(tok.observation("")) + LONGEST_LINE * per_character


def calc_spec(tok, max_turns: int = 3) -> EnvSpec:
    tasks = make_calc_tasks("all")
    longest = max(len(tok.prompt(t.prompt)) for t in tasks) + max_turns * (
        ACTION_TOKENS + longest_observation(tok)
    )
    return EnvSpec(
        name="calc",
        tok=tok,
        make=lambda: CalcEnv(tok, max_turns),
        train_tasks=make_calc_tasks("train"),
        heldout_tasks=make_calc_tasks("heldout"),
        max_action_tokens=ACTION_TOKENS,
        metrics=("calls", "cut"),
        max_episode_tokens=longest,
        actions=("calc 12 * 34", "answer 408"),
        eval_decode="kvcache",
    )


__all__ = [
    "CalcEnv",
    "CalcTask",
    "calc",
    "calc_spec",
    "evaluate",
    "longest_observation",
    "make_calc_tasks",
    "parse",
]
