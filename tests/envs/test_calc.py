"""calc: the arithmetic the calculator does, how replies are read, the splits, and an episode on SmolLM2's own
chat template."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from lrl.envs.calc import CalcEnv, evaluate, make_calc_tasks, parse
from lrl.envs.calc.env import ExpressionError, shown


@pytest.mark.parametrize(
    "text, value",
    [
        ("17 * 25", 425),
        ("(3 + 4) * 2", 14),
        ("10 / 4", 2.5),
        ("12 x 34", 408),
        ("99 - 100", -1),
        ("-3 + 5", 2),
    ],
)
def test_the_calculator_computes_arithmetic(text, value):
    assert evaluate(text) == value


@pytest.mark.parametrize(
    "text", ["", "1 +", "(1 + 2", "2 ** 3", "1 / 0", "__import__('os')", "((((((((((1))))))))))"]
)
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


@pytest.mark.parametrize(
    "reply, expected",
    [
        # the calculator's own line repeated: a worked result, so the number after = is what the model says
        ("calc: 59 * 12 = 708", ("answer", 708)),
        ("calc 59*12 = 708. answer 708", ("answer", 708)),
        ("calc: 59 * 12 = 708\nThe answer is 708.", ("answer", 708)),
        # a stated answer is the answer, whatever else the reply mentions
        ("The answer is 708 (calc 59*12)", ("answer", 708)),
        ("calc 59 * 12\nanswer 708", ("answer", 708)),
        # a repeated line, then a new call: the call
        ("calc: 17 * 25 = 425\ncalc 425 + 3", ("calc", "425 + 3")),
        ("Let me use the calculator. calc 59 * 12", ("calc", "59 * 12")),
        ("(calc 59*12)", ("calc", "59*12")),
        ("calc 59 * 12 = ?", ("calc", "59 * 12")),
        # a call without an operator is still a call (the calculator says what is wrong), never an answer
        ("calc 5", ("calc", "5")),
        ("calc (5)", ("calc", "(5)")),
        ("calc 3 +", ("calc", "3 +")),
        # exponents are read as their value; digits are ASCII digits
        ("answer 1e5", ("answer", 100000)),
        ("answer 2.5E-3", ("answer", Fraction(1, 400))),
        ("answer \u0667\u0660\u0668", ("invalid", "neither a calculator call nor a number")),
        ("answer \uff17\uff10\uff18", ("invalid", "neither a calculator call nor a number")),
        ("answer -5", ("answer", -5)),
    ],
)
def test_a_reply_is_read_as_the_model_meant_it(reply, expected):
    assert parse(reply) == expected


def test_numbers_are_read_exactly():
    kind, value = parse("answer 9007199254740993")  # 2**53 + 1: a float reads 2**53
    assert kind == "answer" and value == 2**53 + 1
    assert parse("answer " + "9" * 5000) == (
        "answer",
        None,
    )  # too long to be anyone's answer: read, and wrong


@pytest.mark.parametrize("call", ["5", "(5)", "3 +", "-5", "1e5 * 2"])
def test_the_calculator_refuses_what_has_no_operator_or_is_incomplete(call):
    with pytest.raises(ExpressionError):
        evaluate(call)


@pytest.mark.parametrize(
    "expression, text",
    [
        ("99999999 * 99999999 * 999", str(99999999 * 99999999 * 999)),  # beyond 2**53
        ("9007199254740993 + 0", "9007199254740993"),
        ("0.00001 * 0.00001", "0.0000000001"),
        ("10 / 4", "2.5"),
        ("1 / 8", "0.125"),
        ("10 / 3", "3.33333333333..."),  # no finite decimal: 12 digits, cut, and marked
        ("2 / 3", "0.666666666666..."),
        # 2**-80 has 80 decimals, too many to show: its first 12 digits, cut, and marked
        ("1 / 1024 / 1024 / 1024 / 1024 / 1024 / 1024 / 1024 / 1024", "0." + "0" * 24 + "827180612553..."),
        ("12 - 20", "-8"),
    ],
)
def test_the_calculator_shows_values_exactly(expression, text):
    assert shown(evaluate(expression)) == text


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
    spec = make_env(cfg, run_tokenizer(cfg.policy))
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


def longest_observations():
    """Calls whose answers are as long as the calculator's can be: the longest expressions, the longest values,
    every error."""
    nines = "9" * 30
    return [
        f"{nines} * {nines}9",
        "1 + " * 15 + "1",
        "0.00000000000000000000000000001 * 0.0000000000000000000000000001",
        "1 / 1024 / 1024 / 1024 / 1024 / 1024 / 1024 / 1024 / 1024",
        "1 / 3 / 7 / 11 / 13 / 17 / 19 / 23 / 29 / 31 / 37 / 41 / 43",
        "(((((((1 + 2) * 3) - 4) / 5) * 6) + 7) - 8) * 9999999999999999",
        "1+" * 40 + "1",
        "1 / 0",
        "5",
        "3 +",
        "((((((((((1))))))))) + 1",
        "1e5 * 2",
        "(1 + 2",
    ]


def test_turn_tokens_set_the_reply_budget_and_move_the_episode_bound(smollm2_cut):
    from lrl.config import Config
    from lrl.envs import make_env, run_tokenizer

    own = make_env(Config(model=str(smollm2_cut), env="calc"), run_tokenizer(Config(model=str(smollm2_cut))))
    cfg = Config(model=str(smollm2_cut), env="calc", turn_tokens=64, max_turns=2)
    spec = make_env(cfg, run_tokenizer(cfg))
    base = make_env(Config(model=str(smollm2_cut), env="calc", max_turns=2), run_tokenizer(cfg))
    assert own.max_action_tokens == 40 and spec.max_action_tokens == 64
    assert spec.max_episode_tokens == base.max_episode_tokens + 2 * (64 - 40)


def test_the_episode_bound_holds_the_longest_observation(smollm2_cut):
    from lrl.config import Config
    from lrl.envs import make_env, run_tokenizer

    cfg = Config(model=str(smollm2_cut), env="calc")
    spec = make_env(cfg, run_tokenizer(cfg.policy))
    tok, env = spec.tok, spec.make()
    longest = 0
    for call in longest_observations():
        env.reset(spec.train_tasks[0])
        result = env.step(tok.encode(f"calc {call}") + [tok.eos_id])
        assert not result.done and "calc:" in tok.decode(result.observation), call
        longest = max(longest, len(result.observation))
    prompt = max(len(tok.prompt(t.prompt)) for t in [*spec.train_tasks, *spec.heldout_tasks])
    assert spec.max_episode_tokens >= prompt + cfg.max_turns * (spec.max_action_tokens + longest)
    # the bound rests on no text of a line's characters taking more tokens than its characters one by one
    from lrl.envs.calc import longest_observation
    from lrl.envs.calc.calculator import LINE_CHARACTERS, LONGEST_LINE

    bound, draw = longest_observation(tok), random.Random(0)
    for _ in range(300):
        text = "".join(draw.choice(LINE_CHARACTERS) for _ in range(LONGEST_LINE))
        assert len(tok.observation(text)) <= bound, text
