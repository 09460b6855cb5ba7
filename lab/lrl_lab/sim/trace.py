"""Episode traces any framework can write, read and checked for ``python -m lrl_lab.sim --trace`` (docs/simulate.md).

A trace is one episode per line with its duration in seconds, plus the trainer's seconds per step and per
weight sync, as CSV (a header row; column ``duration_s``; ``train_s``, ``sync_s``, ``slots``, ``batch`` as
optional columns holding one value on every row) or as JSONL (one object per line with ``duration_s``; an
optional first object holding ``train_s``, ``sync_s``, ``slots``, ``batch``, which any object may also hold,
with the same values). Every problem is a
:class:`TraceError` whose message is one line: ``FILE:LINE: what is wrong``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
from dataclasses import dataclass, field

from lrl_lab.sim.limits import MAX_SECONDS, MAX_SLOTS

SETTINGS = ("train_s", "sync_s", "slots", "batch")  # what a trace may say besides its durations
COUNTS = ("slots", "batch")  # of those, the ones that are integers >= 1


class TraceError(ValueError):
    """A trace that cannot be used; the message names the file and the line."""

    def __init__(self, path: str, line: int | None, what: str):
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {what}")


@dataclass
class Trace:
    """What a trace file holds: durations [N] in file order and the settings it states (None if it does not)."""

    path: str
    format: str  # "csv" or "jsonl"
    durations: list[float]
    settings: dict[str, float | int] = field(default_factory=dict)  # keys from SETTINGS


def _number(path: str, line: int, name: str, value) -> float | int:
    """A trace value checked: a finite number >= 0 (an integer >= 1 for slots and batch)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            shown = repr(text) if text else "empty"
            raise TraceError(path, line, f"{name} is {shown}, not a number") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(path, line, f"{name} is {json.dumps(value)[:40]}, not a number")
    try:
        value = float(value)
    except OverflowError:  # an integer too large for a float
        raise TraceError(path, line, f"{name} is an integer of {len(str(value))} digits, too large") from None
    if not math.isfinite(value):
        raise TraceError(path, line, f"{name} is {value}, not a finite number")
    if name in COUNTS:
        if value < 1 or value != int(value) or value > MAX_SLOTS:
            raise TraceError(path, line, f"{name} is {value:g}; it must be an integer in [1, {MAX_SLOTS}]")
        return int(value)
    if not 0 <= value <= MAX_SECONDS:
        raise TraceError(path, line, f"{name} is {value:g}; it must be in [0, {MAX_SECONDS:g}] seconds")
    return value


def _setting(path: str, line: int, settings: dict, name: str, value, first_line: dict) -> None:
    """Record a setting; a CSV column must hold the same value on every row."""
    value = _number(path, line, name, value)
    if name in settings and settings[name] != value:
        raise TraceError(
            path,
            line,
            f"{name} is {value:g} but line {first_line[name]} says {settings[name]:g}: one value per trace",
        )
    if name not in settings:
        settings[name] = value
        first_line[name] = line


def _rows(path: str, reader):
    """(line, row) of a CSV reader; a malformed row is the trace's error."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise TraceError(path, reader.line_num, f"not CSV ({err})") from None
        yield reader.line_num, row


def _read_csv(path: str, handle) -> Trace:
    reader = csv.reader(handle)
    rows = _rows(path, reader)
    header = next(rows, (0, None))[1]
    while header is not None and not any(cell.strip() for cell in header):
        header = next(rows, (0, None))[1]
    if header is None:
        raise TraceError(path, 1, "the file is empty; expected a header row naming a duration_s column")
    names = [cell.strip() for cell in header]
    head_line = reader.line_num
    if "duration_s" not in names:
        shown = ", ".join(repr(n) for n in names)
        raise TraceError(path, head_line, f"no duration_s column (the header names {shown})")
    for name in set(names):
        if names.count(name) > 1 and (name == "duration_s" or name in SETTINGS):
            raise TraceError(path, head_line, f"the header names {name} twice")
    col = {name: names.index(name) for name in ("duration_s", *SETTINGS) if name in names}
    durations: list[float] = []
    settings: dict = {}
    first_line: dict = {}
    for line, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        for name, i in col.items():
            if i >= len(row):
                raise TraceError(
                    path, line, f"no {name} value (the row has {len(row)} of {len(names)} columns)"
                )
        durations.append(_number(path, line, "duration_s", row[col["duration_s"]]))
        for name in SETTINGS:
            if name in col:
                _setting(path, line, settings, name, row[col[name]], first_line)
    if not durations:
        raise TraceError(path, head_line + 1, "no episodes after the header")
    return Trace(path, "csv", durations, settings)


def _read_jsonl(path: str, handle) -> Trace:
    durations: list[float] = []
    settings: dict = {}
    first_line: dict = {}
    seen_object = False
    for line, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(path, line, f"not JSON ({err.msg} at column {err.colno})") from None
        except RecursionError:
            raise TraceError(path, line, "not a trace line (nested too deeply to read)") from None
        except ValueError as err:  # e.g. an integer of more digits than Python converts
            raise TraceError(path, line, f"not a trace line ({' '.join(str(err).split())[:120]})") from None
        if not isinstance(obj, dict):
            raise TraceError(path, line, f"expected a JSON object, got {type(obj).__name__}")
        if "duration_s" not in obj:
            if seen_object:
                raise TraceError(
                    path, line, "no duration_s (only the first object may hold the settings alone)"
                )
            if not any(name in obj for name in SETTINGS):
                raise TraceError(path, line, f"no duration_s and none of {', '.join(SETTINGS)}")
        else:
            durations.append(_number(path, line, "duration_s", obj["duration_s"]))
        for name in SETTINGS:
            if name in obj:
                _setting(path, line, settings, name, obj[name], first_line)
        seen_object = True
    if not seen_object:
        raise TraceError(path, 1, "the file is empty; expected one JSON object per line with duration_s")
    if not durations:
        raise TraceError(path, line, "no episodes (no object with duration_s)")
    return Trace(path, "jsonl", durations, settings)


def _format(path: str, first: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        return "csv"
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    return "jsonl" if first.lstrip().startswith("{") else "csv"


def read_trace(path: str) -> Trace:
    """Read and check a trace file (CSV or JSONL, by extension, else by its first character) -> Trace."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise TraceError(path, None, f"cannot read it: {err.strerror.lower()}") from None
    if not stat.S_ISREG(info.st_mode):
        raise TraceError(path, None, "cannot read it: not a regular file")
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            first = handle.read(1)
            handle.seek(0)
            if _format(path, first) == "csv":
                return _read_csv(path, handle)
            return _read_jsonl(path, handle)
    except UnicodeDecodeError:
        raise TraceError(path, None, "cannot read it: not UTF-8 text") from None
    except OSError as err:
        raise TraceError(
            path, None, f"cannot read it: {err.strerror.lower() if err.strerror else err}"
        ) from None
