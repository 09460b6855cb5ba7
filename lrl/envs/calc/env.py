"""CalcEnv: word problems with a calculator tool, for a chat model.

Actions are free text, read leniently but exactly (case, surrounding spaces, quotes or backticks and a final
period do not matter; anything else does):

- ``calc EXPRESSION`` (also ``calculate``, ``calculator``, with or without a colon): the expression, digits and
  ``+ - * x / ( )`` only, is computed and its value returned (``calc: 17 * 25 = 425``);
- ``answer NUMBER`` (also ``final answer``, ``the answer is``, with or without a colon, or the bare number): ends
  the episode with reward 1 if the number is the problem's answer, else 0.

Anything else is malformed: the episode ends ``invalid`` with reward 0. An action cut by the token budget has no
end-of-turn token and is malformed too. Running out of turns is ``truncated``. ``info["metrics"]`` counts the
calculator calls (``calls``).
"""

from __future__ import annotations

import re

from lrl.envs.base import StepResult
from lrl.envs.calc.tasks import CalcTask

_CALC = re.compile(r"^(?:calculator|calculate|calc)\s*:?\s*(.+)$")
_ANSWER = re.compile(r"^(?:(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*:?\s*)?(-?[\d,]+(?:\.\d+)?)$")
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
    line = re.sub(r"[`'\"]", "", text).strip().rstrip(".").strip().lower()
    match = _CALC.match(line)
    if match:
        expression = match.group(1).strip().strip("`'\"").strip()
        if len(expression) <= MAX_EXPRESSION and _EXPRESSION.match(expression):
            return "calc", expression
        return "invalid", "not an arithmetic expression"
    match = _ANSWER.match(line)
    if match:
        try:
            return "answer", float(match.group(1).replace(",", ""))
        except ValueError:
            return "invalid", "not a number"
    return "invalid", "neither calc nor answer"


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
        kind, value = parse(self.tok.decode(action[:-1])) if ended else ("invalid", "cut")
        info["action"] = kind
        if kind == "answer":
            self.done = True
            return StepResult([], float(value == self.task.answer), True, info)
        if kind == "calc":
            info["metrics"] = {"calls": 1.0}
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
