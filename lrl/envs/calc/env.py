"""CalcEnv: word problems with a calculator tool, for a chat model.

Replies are free text, read leniently but exactly:

- a reply that holds ``calc EXPRESSION`` (also ``calculate``, ``calculator``, with or without a colon; the
  expression is the arithmetic that follows the word: digits and ``+ - * x / ( )``, at least one operator) calls
  the calculator with its first such expression: the value is the next turn (``calc: 17 * 25 = 425``);
- any other reply is an answer: the number after the last ``answer`` in it (``answer 425``, ``the answer is
  425``), else the last number it holds. The episode ends with reward 1 if that number is exactly the problem's
  answer, else 0;
- a reply with neither a calculator call nor a number is malformed (``invalid``, reward 0), as is a call whose
  expression is not arithmetic.

A reply cut by the token budget is read as far as it got (a number cut in two is a wrong number) and counted
(``cut``). Running out of turns on calculator calls is ``truncated``. ``info["metrics"]`` counts the calculator
calls (``calls``) and the cut replies.
"""

from __future__ import annotations

import re

from lrl.envs.base import StepResult
from lrl.envs.calc.tasks import CalcTask

_CALC = re.compile(
    r"\b(?:calculator|calculate|calc)\b\s*:?\s*(\(*\s*\d[\d\s.]*(?:[+\-*x×/]\s*\(*\s*\d[\d\s.]*\)*\s*)+)"
)
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_ANSWER = re.compile(r"answer\s*(?:is)?\s*[:=]?\s*(" + _NUMBER + ")")
_EXPRESSION = re.compile(r"^[\d\s+\-*x×/().]+$")
MAX_EXPRESSION = 64  # characters


class ExpressionError(ValueError):
    pass


def evaluate(text: str) -> float:
    """The value of an arithmetic expression (+ - * / and parentheses over non-negative numbers), without eval."""
    tokens = re.findall(r"\d+(?:\.\d+)?|[+\-*/()]", text.replace("x", "*").replace("×", "*"))
    if "".join(tokens) != re.sub(r"\s", "", text.replace("x", "*").replace("×", "*")):
        raise ExpressionError(f"not an expression: {text!r}")
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def atom(depth: int) -> float:
        token = peek()
        if token == "(":
            if depth > 8:
                raise ExpressionError("too deeply nested")
            take()
            value = total(depth + 1)
            if take_if(")") is None:
                raise ExpressionError("unbalanced parentheses")
            return value
        if token == "-":
            take()
            return -atom(depth)
        if token is None or not token[0].isdigit():
            raise ExpressionError(f"a number was expected, not {token!r}")
        return float(take())

    def take_if(token):
        return take() if peek() == token else None

    def product(depth: int) -> float:
        value = atom(depth)
        while peek() in ("*", "/"):
            op, right = take(), atom(depth)
            if op == "/" and right == 0:
                raise ExpressionError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def total(depth: int) -> float:
        value = product(depth)
        while peek() in ("+", "-"):
            op, right = take(), product(depth)
            value = value + right if op == "+" else value - right
        return value

    value = total(0)
    if pos != len(tokens):
        raise ExpressionError(f"unexpected {peek()!r}")
    return value


def shown(value: float) -> str:
    """A value as the calculator shows it: an integer without a decimal point, else 4 decimals at most."""
    return str(int(value)) if float(value).is_integer() else f"{value:.4f}".rstrip("0")


def parse(text: str) -> tuple[str, object]:
    """A reply -> ('calc', expression), ('answer', number) or ('invalid', reason)."""
    text = re.sub(r"[`'\"*_]{2,}|[`'\"]", "", text).strip().lower()
    match = _CALC.search(text)
    if match:
        expression = match.group(1).strip().rstrip(".").strip()
        if len(expression) <= MAX_EXPRESSION and _EXPRESSION.match(expression):
            return "calc", expression
        return "invalid", "not an arithmetic expression"
    answers = _ANSWER.findall(text)
    numbers = answers or re.findall(_NUMBER, text)
    if not numbers:
        return "invalid", "neither a calculator call nor a number"
    try:
        return "answer", float(numbers[-1].replace(",", ""))
    except ValueError:
        return "invalid", "not a number"


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
            return StepResult([], float(value == self.task.answer), True, info)
        if kind == "calc":
            info["metrics"]["calls"] = 1.0
            try:
                text = f"calc: {value} = {shown(evaluate(value))}"
            except ExpressionError as err:
                text = f"calc: error ({err})"
            if self.turns >= self.max_turns:
                self.done = True
                info["truncated"] = True
                return StepResult([], 0.0, True, info)
            return StepResult(self.tok.observation(text), 0.0, False, info)
        self.done = True
        info["invalid"] = True
        return StepResult([], 0.0, True, info)
