"""calc: the arithmetic the calculator does, how replies are read, the splits, and an episode on SmolLM2's own
chat template."""

from __future__ import annotations

import pytest

from lrl.envs.calc import CalcEnv, evaluate, make_calc_tasks, parse
from lrl.envs.calc.env import ExpressionError


@pytest.mark.parametrize(
    "text, value",
    [("17 * 25", 425), ("(3 + 4) * 2", 14), ("10 / 4", 2.5), ("12 x 34", 408), ("99 - 100", -1), ("-3 + 5", 2)],
)
def test_the_calculator_computes_arithmetic(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize("text", ["", "1 +", "(1 + 2", "2 ** 3", "1 / 0", "__import__('os')", "((((((((((1))))))))))"])
def test_anything_else_is_refused_without_eval(text):
    with pytest.raises(ExpressionError):
        evaluate(text)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("calc 17 * 25", ("calc", "17 * 25")),
        ("Calculator: 12 x 34.", ("calc", "12 x 34")),
        ("To calculate 30 * 84, you multiply 30 by", ("calc", "30 * 84")),
        ("answer 425", ("answer", 425.0)),
        ("**Answer:** 1,234", ("answer", 1234.0)),
        ("The answer is 27. To calculate 27, we", ("answer", 27.0)),
        ("He now has 25 + 79 = 104 marbles", ("answer", 104.0)),
        ("To solve this problem, we need", ("invalid", "neither a calculator call nor a number")),
    ],
)
def test_replies_are_read_leniently_but_exactly(reply, expected):
    assert parse(reply) == expected


def test_the_splits_share_no_pair_of_numbers_and_are_fixed():
    train, held = make_calc_tasks("train"), make_calc_tasks("heldout")
    assert len(train) == 512 and len(held) == 64
    pair = lambda t: (min(t.a, t.b), max(t.a, t.b))  # noqa: E731
    assert not {pair(t) for t in train} & {pair(t) for t in held}
    assert len({t.task_id for t in train + held}) == 576
    assert [t.prompt for t in held[:5]] == [t.prompt for t in make_calc_tasks("heldout")[:5]]
    assert all(t.answer >= 0 for t in train + held)  # a difference is never negative
    assert {t.op for t in held} == {"+", "-", "*"}


def test_an_episode_calls_the_calculator_then_answers(smollm2_cut):
    from lrl.config import Config
    from lrl.envs import make_env, run_tokenizer

    cfg = Config(model=str(smollm2_cut), env="calc")
    spec = make_env(cfg, run_tokenizer(cfg))
    tok, task = spec.tok, spec.heldout_tasks[0]
    env: CalcEnv = spec.make()
    prompt = tok.decode(env.reset(task), skip_special=False)
    assert task.prompt in prompt and "calc <expression>" in prompt
    result = env.step(tok.encode(f"calc {task.expression}") + [tok.eos_id])
    shown = tok.decode(result.observation, skip_special=False)
    assert not result.done and f"= {task.answer}" in shown and result.info["metrics"]["calls"] == 1.0
    result = env.step(tok.encode(f"answer {task.answer}") + [tok.eos_id])
    assert result.done and result.reward == 1.0
    env.reset(task)
    result = env.step(tok.encode("I do not know") + [tok.eos_id])
    assert result.done and result.info["invalid"] and result.reward == 0.0
    env.reset(task)
    cut = env.step(tok.encode(f"answer {task.answer + 1}"))  # no end-of-turn token: cut by the budget
    assert cut.done and cut.reward == 0.0 and cut.info["metrics"]["cut"] == 1.0
