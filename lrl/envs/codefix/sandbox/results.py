"""What a sandboxed run reports, read as the candidate's: parsed with bounds, compared with the expectations.

The result channel is the candidate's to write (the runner writes it, and so can anything the candidate does),
so nothing on it may make the harness fail: every line is strict JSON (no NaN or Infinity, no key twice),
numbers of at most :data:`MAX_DIGITS` digits and within the float range, values nested at most
:data:`MAX_DEPTH` deep. A line outside these bounds raises :class:`Unparseable`; a value that cannot be compared
with its expectation (an integer beyond the float range where a float is expected) raises
:class:`Incomparable`. The harness makes both an ``error`` verdict. The same bounds hold for the expectations of
a task folder (:mod:`lrl.envs.codefix.tasks`), so any value a task can expect can be reported. Standard library
only.
"""

from __future__ import annotations

import json
import math

MAX_DIGITS = 1000  # digits of one number
MAX_DEPTH = 100  # lists and objects inside each other


class Unparseable(ValueError):
    """Text that is not a value within the bounds; the message says why, in a few words."""


class Incomparable(ValueError):
    """A value that cannot be compared with what was expected."""


def _constant(name: str):
    raise Unparseable(f"{name}, which is not JSON")


def _int(text: str) -> int:
    if len(text) > MAX_DIGITS + 1:
        raise Unparseable(f"a number of more than {MAX_DIGITS} digits")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_DIGITS + 8:
        raise Unparseable(f"a number of more than {MAX_DIGITS} digits")
    value = float(text)
    if not math.isfinite(value):
        raise Unparseable(f"a number beyond the float range ({text[:20]})")
    return value


def _object(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        twice = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise Unparseable(f"the key {json.dumps(twice)[:40]} twice in one object")
    return out


def depth(value) -> int:
    """How deep lists and objects nest in `value` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, d + 1)
            if deepest > MAX_DEPTH + 8:  # past any bound: deep enough to refuse
                return deepest
            stack.extend((x, d + 1) for x in (item.values() if isinstance(item, dict) else item))
    return deepest


def loads(text: str, max_depth: int = MAX_DEPTH):
    """Strict, bounded JSON (a document nested at most `max_depth` deep) -> the value; Unparseable with the
    reason otherwise."""
    try:
        value = json.loads(
            text, parse_constant=_constant, parse_int=_int, parse_float=_float, object_pairs_hook=_object
        )
    except Unparseable:
        raise
    except RecursionError:
        raise Unparseable(f"values nested more than {MAX_DEPTH} deep") from None
    except ValueError as err:  # json's own errors, and int()'s digit limit
        raise Unparseable(f"something that is not JSON ({str(err)[:60]})") from None
    if depth(value) > max_depth:
        raise Unparseable(f"values nested more than {MAX_DEPTH} deep")
    return value


def parse(raw: bytes, total: int) -> tuple[dict[int, dict], object]:
    """The result channel of a run with `total` calls -> (call index -> its result, the ``done`` count);
    Unparseable when a line is not a result, or a result comes twice or out of range."""
    got: dict[int, dict] = {}
    done = None
    for line in raw.splitlines():
        item = loads(line.decode("utf-8", "replace"), MAX_DEPTH + 1)  # {"i": k, "value": V}
        if not isinstance(item, dict):
            raise Unparseable("something that is not a result")
        if "done" in item:
            done = item["done"]
            continue
        i = item.get("i")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < total or i in got:
            raise Unparseable("a result twice or out of range")
        got[i] = item
    return got, done


def matches(result: dict, expected: dict) -> bool:
    """Whether one call's result is what was expected; Incomparable where the two cannot be compared."""
    if "raises" in expected:
        return result.get("raised") == expected["raises"]
    if "value" not in result:
        return False
    return equal(result["value"], expected["value"])


def equal(a, b) -> bool:
    """JSON values compared exactly, floats to a relative 1e-9 (``true`` is not ``1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        try:
            x, y = float(a), float(b)
        except OverflowError:
            raise Incomparable("a number beyond the float range where a float is expected") from None
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b
