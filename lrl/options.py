"""Declaring and checking one config option: its type, default, help, bounds and whether a resumed run may change
it, in one place.

``option(...)`` declares a field of a section of :class:`lrl.config.Config` (:mod:`lrl.sections`);
:func:`check_field` checks a value against its declaration and returns the problems as messages.
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import MISSING, field
from pathlib import Path

from lrl.registry import Registry

MAX_INT = 2**31 - 1  # every integer option is bounded: a 20-digit --max-steps is refused, not overflowed


def option(
    default,
    help: str,
    *,
    choices=None,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    scope: str | None = None,
    when: dict | None = None,
    path: bool = False,
    resumable: bool = False,
):
    """A config field: default, help, and its bounds (ge/gt/le/lt), choices, registry scope or mode.

    ``resumable`` marks an option a resumed run may set otherwise than the run that wrote the checkpoint (where
    it writes, how long it runs, what it logs); any other option must be the same (:func:`lrl.checkpoint.check_resume`).

    ``path`` marks a file or folder: ``~`` in it is expanded once, when the config is made, so that every lock,
    lookup, check and write afterwards sees the same path.

    ``scope`` names a registry (``"sampler"``): the option is read only by the entries that list it in
    ``uses``, and setting it away from its default for another entry is an error. ``when`` names the mode it
    belongs to, as the values other options must have (``{"pipeline": "async"}``): setting it away from its
    default in another mode is an error.
    """
    meta = {"help": help, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "scope": scope}
    meta["when"] = dict(when or {})
    meta["path"] = path
    meta["resumable"] = resumable
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def unmet_mode(meta, value_of) -> list[str]:
    """The options of a mode option's mode (``option(..., when=...)``) whose values, read by `value_of(name)`,
    are not the mode's: [] where the option applies (always, for an option of no mode)."""
    return [key for key, wanted in (meta.get("when") or {}).items() if value_of(key) != wanted]


def expand_path(value):
    """A path option's value with ``~`` expanded (anything that is not a path string is returned as it is)."""
    if isinstance(value, str) and value.startswith("~"):
        return os.path.expanduser(value)
    return value


def default_of(f):
    """An option's default value (a fresh copy for a list)."""
    return f.default_factory() if f.default is MISSING else f.default


# -- one field ----------------------------------------------------------------------------------------
def accepted_types(annotation) -> tuple[type, ...]:
    """The accepted Python types of a field annotation: int, float, str, bool, list[str], X | None."""
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) is not list:  # a union such as float | None
        return tuple(k for a in args for k in accepted_types(a))
    return (list,) if typing.get_origin(annotation) is list else (annotation,)


def type_name(annotation) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        list: "a list",
        type(None): "null",
    }
    return " or ".join(names[k] for k in accepted_types(annotation))


def check_field(name: str, value, annotation, meta) -> list[str]:
    kinds = accepted_types(annotation)
    ok = any(_is(value, k) for k in kinds)
    if not ok:
        return [f"{name}: {value!r} is not allowed; it must be {type_name(annotation)}"]
    if value is None:
        return []
    if float in kinds and not isinstance(value, (bool, str, list)) and not _finite(value):
        return [
            f"{name}: {value!r} is not allowed; it must be a finite number strictly between -1e308 and 1e308"
        ]
    if isinstance(value, str) and value == "":
        if type(None) not in kinds:
            return [f"{name}: an empty value is not allowed"]
        what = "path" if meta.get("path") else "value"
        return [f"{name}: an empty {what} is not allowed; give a {what} or leave it unset"]
    if isinstance(value, str) and not meta.get("path") and _not_utf8(value):
        return [f"{name}: it is not valid UTF-8 text ({_not_utf8(value)})"]
    choices = meta.get("choices")
    if choices is not None:
        allowed = choices.names() if isinstance(choices, Registry) else list(choices)
        for item in value if isinstance(value, list) else [value]:
            if item not in allowed:
                return [
                    f"{name}: {item!r} is not allowed; choose one of {', '.join(allowed) or '(none registered)'}"
                ]
        twice = [item for i, item in enumerate(value) if item in value[:i]] if isinstance(value, list) else []
        if twice:  # a mask or callback applied once whatever the list says, or twice over
            return [f"{name}: {twice[0]!r} is given twice; give each once"]
    tests = {
        "ge": lambda v, b: v >= b,
        "gt": lambda v, b: v > b,
        "le": lambda v, b: v <= b,
        "lt": lambda v, b: v < b,
    }
    if any(meta.get(key) is not None and not test(value, meta[key]) for key, test in tests.items()):
        return [f"{name}: {value!r} is not allowed; it must be {bounds_text(meta)}"]
    return []


def _not_utf8(text: str) -> str:
    """Where `text` is not text ('' when it is): bytes of a command line that are not UTF-8 reach Python as lone
    surrogates, which no tokenizer takes (a path may hold such bytes; any other string may not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = text[err.start]
        if "\udc80" <= char <= "\udcff":
            return f"the byte 0x{ord(char) - 0xDC00:02x} at character {err.start}"
        return f"a lone surrogate at character {err.start}"
    return ""


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value)) and abs(float(value)) < 1e308
    except OverflowError:  # an int too large for a float
        return False


def _is(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind is type(None):
        return value is None
    return isinstance(value, kind)


def bounds_text(meta) -> str:
    """'> 0', 'in [0, 1)', 'in [1, 4096]' from a field's bounds."""
    show = lambda v: str(v) if isinstance(v, int) else f"{v:g}"  # noqa: E731
    lo = (
        ("[", meta["ge"])
        if meta.get("ge") is not None
        else ("(", meta["gt"])
        if meta.get("gt") is not None
        else None
    )
    hi = (
        ("]", meta["le"])
        if meta.get("le") is not None
        else (")", meta["lt"])
        if meta.get("lt") is not None
        else None
    )
    if lo and hi:
        return f"in {lo[0]}{show(lo[1])}, {show(hi[1])}{hi[0]}"
    if lo:
        return f"{'>=' if lo[0] == '[' else '>'} {show(lo[1])}"
    return f"{'<=' if hi[0] == ']' else '<'} {show(hi[1])}" if hi else "any value"


def exists(path: str) -> bool:
    """Path(path).exists(), False (not an exception) for names the OS cannot even look up."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # an embedded NUL byte, a name too long
        return False
