"""The calculator of ``--env calc``: exact arithmetic over what a model wrote, in time linear in the text.

An expression is numbers (ASCII digits, an optional decimal part, commas between groups of three digits) joined
by ``+ - * /`` (also ``x`` and ``×``) with parentheses, at least one binary operator, nesting at most
:data:`MAX_DEPTH` deep. It is evaluated with exact rationals (:class:`fractions.Fraction`), never with ``eval``
and never in floating point, so an integer beyond 2**53 is shown as itself and 0.00001 * 0.00001 as
0.0000000001. What the calculator shows is bounded, so that an episode's length is:

- the expression in its own spelling (numbers as written without commas, binary operators between single
  spaces), at most :data:`MAX_EXPRESSION` characters;
- the value: exact when it has a finite decimal form of at most :data:`MAX_SHOWN` characters; otherwise
  (``10 / 3``) its first :data:`DIGITS` significant digits, cut (not rounded), followed by ``...``.

Whatever it refuses is one of a few fixed reasons (:data:`REASONS`).
"""

from __future__ import annotations

import re
from decimal import ROUND_DOWN, Context, Decimal
from fractions import Fraction

MAX_EXPRESSION = 64  # characters of an expression as the calculator spells it
MAX_DEPTH = 8  # parentheses within parentheses
MAX_SHOWN = 72  # characters of a value shown exactly; beyond, DIGITS significant digits and "..."
DIGITS = 12
# one token of model text: whitespace, a number (ASCII digits only), a word, an operator, or any other character
TOKEN = re.compile(
    r"(?P<space>\s+)"
    r"|(?P<num>[0-9]+(?:,[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)"
    r"|(?P<word>[a-z]+)"
    r"|(?P<op>[-+*/×()=:])"
    r"|(?P<other>.)",
    re.DOTALL,
)
OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "×": "*", "x": "*"}
REASONS = {
    "not": "not an expression",
    "exponent": "a number with an exponent",
    "operator": "no operator",
    "long": f"longer than {MAX_EXPRESSION} characters",
    "incomplete": "incomplete expression",
    "parentheses": "unbalanced parentheses",
    "deep": f"parentheses nested more than {MAX_DEPTH} deep",
    "zero": "division by zero",
}


class ExpressionError(ValueError):
    """An expression the calculator refuses; the message is one of :data:`REASONS`."""


def tokens(text: str) -> list[tuple[str, str, int, int]]:
    """`text` as (kind, text, start, end) tokens, whitespace left out: one pass, every character looked at once."""
    out = []
    for m in TOKEN.finditer(text):
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group(), m.start(), m.end()))
    return out


def number(text: str) -> Fraction:
    """A number token's exact value (commas between digit groups dropped)."""
    return Fraction(text.replace(",", ""))


def spelled(text: str) -> tuple[list[str], str]:
    """An expression -> (its symbols: numbers and ``+ - * / ( )``, its spelling); ExpressionError for any other
    token, for a number with an exponent, and for a spelling longer than MAX_EXPRESSION."""
    symbols, parts = [], []
    for kind, token, _, _ in tokens(text.lower()):
        if kind == "num":
            if "e" in token:
                raise ExpressionError(REASONS["exponent"])
            symbols.append(token.replace(",", ""))
            parts.append(symbols[-1])
        elif token in OPERATORS or token in "()":
            symbol = OPERATORS.get(token, token)
            unary = symbol in "+-" and (not symbols or symbols[-1] in ("(", "+", "-", "*", "/"))
            symbols.append(symbol)
            parts.append(symbol if unary or symbol in "()" else f" {symbol} ")
        else:
            raise ExpressionError(REASONS["not"])
        if sum(map(len, parts)) > MAX_EXPRESSION:  # checked as it grows: a long text is never spelled whole
            raise ExpressionError(REASONS["long"])
    return symbols, "".join(parts)


def evaluate(text: str) -> Fraction:
    """The exact value of an arithmetic expression (see the module's docstring); ExpressionError, naming one of
    REASONS, for anything else."""
    symbols, _ = spelled(text)
    if not any(s in "+-*/" for i, s in enumerate(symbols) if i and symbols[i - 1] not in "(+-*/"):
        raise ExpressionError(REASONS["operator"])
    pos = 0

    def peek():
        return symbols[pos] if pos < len(symbols) else None

    def take():
        nonlocal pos
        pos += 1
        return symbols[pos - 1]

    def atom(depth: int) -> Fraction:
        symbol = peek()
        if symbol == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(REASONS["deep"])
            take()
            value = total(depth + 1)
            if peek() != ")":
                raise ExpressionError(REASONS["parentheses"])
            take()
            return value
        if symbol in ("-", "+"):
            take()
            value = atom(depth)
            return -value if symbol == "-" else value
        if symbol is None or symbol in "*/)":
            raise ExpressionError(REASONS["incomplete"])
        return Fraction(take())

    def product(depth: int) -> Fraction:
        value = atom(depth)
        while peek() in ("*", "/"):
            op, right = take(), atom(depth)
            if op == "/" and right == 0:
                raise ExpressionError(REASONS["zero"])
            value = value * right if op == "*" else value / right
        return value

    def total(depth: int) -> Fraction:
        value = product(depth)
        while peek() in ("+", "-"):
            op, right = take(), product(depth)
            value = value + right if op == "+" else value - right
        return value

    value = total(0)
    if pos != len(symbols):
        raise ExpressionError(REASONS["parentheses" if peek() in "()" else "not"])
    return value


def spelling(text: str) -> str:
    """How the calculator writes an expression it accepts (``59*12`` -> ``59 * 12``)."""
    return spelled(text)[1]


def line(expression: str) -> str:
    """What the calculator answers a call with: ``calc: 17 * 25 = 425``, or ``calc: error (reason)``."""
    try:
        return f"calc: {spelling(expression)} = {shown(evaluate(expression))}"
    except ExpressionError as err:
        return f"calc: error ({err})"


# the longest line the calculator can answer with, and every character one can hold: the bound of an observation
LONGEST_LINE = max(
    len("calc: ") + MAX_EXPRESSION + len(" = ") + MAX_SHOWN,
    len("calc: error ()") + max(map(len, REASONS.values())),
)
LINE_CHARACTERS = "".join(sorted(set("calc: error() = 0123456789.+-*/e" + "".join(REASONS.values()))))


def _finite_decimal(value: Fraction) -> str | None:
    """The exact decimal form of `value`, when it has one (its denominator has no prime factor but 2 and 5)."""
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:
        return None
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return sign + (
        digits[: len(digits) - places] + "." + digits[len(digits) - places :] if places else digits
    )


def shown(value: Fraction | int | float) -> str:
    """A value as the calculator shows it: exact where its finite decimal form fits in MAX_SHOWN characters,
    else its first DIGITS significant digits, cut, and ``...``."""
    value = Fraction(value)
    exact = _finite_decimal(value)
    if exact is not None and len(exact) <= MAX_SHOWN:
        return exact
    context = Context(prec=DIGITS, rounding=ROUND_DOWN)
    cut = context.divide(Decimal(value.numerator), Decimal(value.denominator))
    plain = format(cut, "f")
    return (plain if len(plain) <= MAX_SHOWN - 3 else format(cut, "e")) + "..."
