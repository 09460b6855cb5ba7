"""CalcEnv: word problems with a calculator tool, for a chat model.

Replies are free text, read as the model meant them, in one pass over the text (time linear in its length):

1. **An answer it states**: a reply that holds ``answer`` followed by a number (``answer 425``, ``The answer is
   425``, ``**Answer:** 1,234``, ``answer = 425``) is that answer, the number after the last such ``answer``,
   whatever else the reply holds: ``The answer is 708 (calc 59*12)`` and ``calc 59 * 12`` then ``answer 708``
   both answer 708.
2. **A calculator call**: else, ``calc EXPRESSION`` (also ``calculate``, ``calculator``, with or without a colon;
   the expression is the arithmetic that follows the word: numbers, ``+ - * x × / ( )``) calls the calculator
   with the first such expression; its answer is the next turn (``calc: 17 * 25 = 425``). A call the calculator
   refuses (``calc 5`` and ``calc (5)`` have no operator, ``calc 3 +`` is incomplete) is still a call, answered
   ``calc: error (no operator)``: the model meant the tool, not an answer. A calculator line that already holds
   its result, ``calc: 59 * 12 = 708`` (the tool's own line repeated) or ``calc 59*12 = 708``, is a worked
   result, not a call: reading goes on past it.
3. **The last number**: else the reply is an answer, its last number (``He now has 25 + 79 = 104 marbles``: 104;
   ``calc: 59 * 12 = 708``: 708).
4. A reply with none of these is malformed (``invalid``, reward 0).

The episode ends with reward 1 if the answer is exactly the problem's, else 0. Numbers are read exactly, as
rationals (``answer 9007199254740993`` is that integer, not 2**53). On purpose:

- **Digits are ASCII digits** (0-9). A number in other digits (``٧٠٨``, fullwidth ``７０８``) is not read as one: a
  reply that holds no other number is malformed.
- **Exponents are read as their value** in an answer (``answer 1e5`` is 100,000, ``2.5e-3`` is 0.0025); a number
  of more than :data:`MAX_DIGITS` digits or an exponent beyond :data:`MAX_DIGITS` is read as an answer that is no
  problem's (reward 0) without being computed. The calculator takes no exponents (``calc: error (a number with an
  exponent)``).
- Commas between groups of three digits are thousands separators (``1,234``).

The calculator (:mod:`lrl.envs.calc.calculator`) computes exactly and shows a bounded line, so an episode's
length has a bound (``max_episode_tokens``). A reply cut by the token budget is read as far as it got (a number
cut in two is a wrong number) and counted (``cut``). Running out of turns on calculator calls is ``truncated``.
``info["metrics"]`` counts the calculator calls (``calls``) and the cut replies.
"""

from __future__ import annotations

import re
from fractions import Fraction

from lrl.envs.base import StepResult
from lrl.envs.calc.calculator import OPERATORS, ExpressionError, evaluate, line, number, shown, tokens
from lrl.envs.calc.tasks import CalcTask

CALLS = ("calc", "calculate", "calculator")
MAX_DIGITS = (
    100  # digits of a number (or size of its exponent) read as a value; longer is no problem's answer
)
_MARKUP = re.compile(r"[`'\"*_]{2,}|[`'\"]")  # markdown emphasis and quotes around what a model writes
NOTHING = "neither a calculator call nor a number"


def value_of(text: str) -> Fraction | None:
    """A number token's exact value; None for one too long to be any problem's answer (never computed)."""
    mantissa, _, exponent = text.partition("e")
    if len(mantissa) > MAX_DIGITS or len(exponent.lstrip("+-").lstrip("0")) > 3:
        return None
    if exponent and abs(int(exponent)) > MAX_DIGITS:
        return None
    return number(text)


def _signed(toks, i: int) -> Fraction | None:
    """The value of the number at toks[i], negative where a minus sign stands right before it as a sign."""
    value = value_of(toks[i][1])
    minus = i > 0 and toks[i - 1][1] == "-" and toks[i - 1][3] == toks[i][2]
    subtracted = i > 1 and (toks[i - 2][0] == "num" or toks[i - 2][1] == ")")  # 59-12: a difference, not -12
    return -value if minus and not subtracted and value is not None else value


def _stated_answer(toks) -> int | None:
    """The index of the number after the last ``answer`` (``answer``, ``answer is``, ``answer:``, ``answer =``)."""
    found = None
    for i, (kind, text, _, _) in enumerate(toks):
        if kind != "word" or text != "answer":
            continue
        j = i + 1
        if j < len(toks) and toks[j][1] == "is":
            j += 1
        if j < len(toks) and toks[j][1] in (":", "="):
            j += 1
        if j < len(toks) and toks[j][1] == "-" and j + 1 < len(toks) and toks[j + 1][0] == "num":
            j += 1
        if j < len(toks) and toks[j][0] == "num":
            found = j
    return found


def _arithmetic(token) -> bool:
    kind, text = token[0], token[1]
    return kind == "num" or (kind == "op" and text in "+-*/×()") or (kind == "word" and text in OPERATORS)


def _call(toks) -> tuple[int, int] | None:
    """The (start, end) token span of the first calculator call's expression that is not a worked result."""
    i = 0
    while i < len(toks):
        if toks[i][0] != "word" or toks[i][1] not in CALLS:
            i += 1
            continue
        j = i + 1
        if j < len(toks) and toks[j][1] == ":":
            j += 1
        start, depth = j, 0
        while j < len(toks) and _arithmetic(toks[j]):
            depth += {"(": 1, ")": -1}.get(toks[j][1], 0)
            if depth < 0:  # a parenthesis the expression did not open: the text around the call closes it
                break
            j += 1
        numbers = any(t[0] == "num" for t in toks[start:j])
        worked = (
            j + 1 < len(toks) and toks[j][1] == "=" and (toks[j + 1][0] == "num" or toks[j + 1][1] == "-")
        )
        if numbers and not worked:
            return start, j
        i = max(j, i + 1)
    return None


def parse(text: str) -> tuple[str, object]:
    """A reply -> ('calc', expression), ('answer', exact value or None) or ('invalid', reason); see the module's
    docstring for the rules."""
    text = _MARKUP.sub("", text).lower()
    toks = tokens(text)
    stated = _stated_answer(toks)
    if stated is not None:
        return "answer", _signed(toks, stated)
    call = _call(toks)
    if call is not None:
        start, end = call
        return "calc", text[toks[start][2] : toks[end - 1][3]]
    last = next((i for i in range(len(toks) - 1, -1, -1) if toks[i][0] == "num"), None)
    if last is None:
        return "invalid", NOTHING
    return "answer", _signed(toks, last)


class CalcEnv:
    """reset(task) -> prompt ids; step(action ids) -> StepResult."""

    def __init__(self, tok, max_turns: int = 3):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1; got {max_turns}")
        self.tok = tok
        self.max_turns = max_turns
        self.task: CalcTask | None = None
        self.turns = 0
        self.done = False

    def reset(self, task: CalcTask) -> list[int]:
        self.task, self.turns, self.done = task, 0, False
        return self.tok.prompt(task.prompt)

    def step(self, action: list[int]) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() called on an episode that is not running; call reset(task) first")
        self.turns += 1
        info = {"invalid": False, "truncated": False, "metrics": {}}
        ended = bool(action) and action[-1] == self.tok.eos_id  # else cut by the token budget
        kind, value = parse(self.tok.decode(action[:-1] if ended else action))
        info["action"] = kind
        info["metrics"] = {"cut": float(not ended)}
        if kind == "answer":
            self.done = True
            return StepResult([], float(value is not None and value == self.task.answer), True, info)
        if kind == "calc":
            info["metrics"]["calls"] = 1.0
            if self.turns >= self.max_turns:
                self.done = True
                info["truncated"] = True
                return StepResult([], 0.0, True, info)
            return StepResult(self.tok.observation(line(value)), 0.0, False, info)
        self.done = True
        info["invalid"] = True
        return StepResult([], 0.0, True, info)


__all__ = ["CalcEnv", "ExpressionError", "evaluate", "line", "parse", "shown"]
