"""The lab's inputs, read and checked before any run: run histories, calibrations, result files, and the paths
a command will write. Every problem is one line that names the file (:class:`InputError`, or the simulator's
:class:`~lrl_lab.sim.trace.TraceError` for a calibration); each command prints it and exits with status 2 (see
:data:`ERRORS`). What the lab writes, the lab reads: histories are strict JSON lines (train.py writes a value
that is not a finite number as null), calibrations strict JSON (engine_cost writes finite numbers), and the
result files of the experiments JSON as :func:`json.dumps` writes it (NaN stands for a value not reached).
"""

from __future__ import annotations

import json
import math
import os

from lrl_lab.sim import calibration
from lrl_lab.sim.trace import TraceError


class InputError(ValueError):
    """A lab input that cannot be used; the message names the file and what is wrong with it."""


ERRORS = (InputError, TraceError)  # what a lab command turns into one line and exit status 2


def read_history(path) -> list[dict]:
    """A run's history file (``train.py --history-file``) -> its steps; InputError naming the file and line."""
    path = str(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: missing (a run's history file)")
    text = calibration.read_text(path)
    steps = []
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            step = calibration.strict_loads(raw)
        except ValueError as err:
            raise InputError(f"{path}:{line}: not JSON ({' '.join(str(err).split())[:100]})") from None
        if not isinstance(step, dict):
            raise InputError(f"{path}:{line}: not a JSON object (a history holds one object a step)")
        steps.append(step)
    if not steps:
        raise InputError(f"{path}: no steps (an empty history)")
    return steps


def numbers(path, history: list[dict], keys: tuple[str, ...]) -> None:
    """Every step of `history` holds each of `keys` as a finite number; InputError naming the first that does not."""
    for i, step in enumerate(history):
        for key in keys:
            value = step.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                shown = "missing" if key not in step else json.dumps(value)[:30]
                raise InputError(f"{path}: step {i} has {key} {shown}, not a number (a history of train.py)")


def read_results(path, kind: type, what: str):
    """A result file an experiment wrote (JSON, NaN allowed) -> its value, which must be a `kind`."""
    path = str(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: missing ({what})")
    text = calibration.read_text(path)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise InputError(f"{path}: not JSON ({' '.join(str(err).split())[:100]}); {what}") from None
    if not isinstance(value, kind):
        raise InputError(
            f"{path}: a JSON {type(value).__name__}; {what} is a JSON {kind.__name__.replace('dict', 'object')}"
        )
    return value


def outputs(*paths: tuple[str, str | None, str]) -> list[str]:
    """Problems of the paths a command will write: (flag, path, 'file' or 'dir') each (lrl.runs.check_output)."""
    from lrl.runs import check_output

    return [p for flag, value, kind in paths for p in check_output(flag, value, kind)]


def predict_from(value: str | None, seeds) -> list[str]:
    """``--predict-from``'s calibration, or with ``{seed}`` in the name each of `seeds`' own, read and checked."""
    if not value:
        return []
    if "{seed}" not in value:
        paths = [(None, value)]
    else:
        try:
            paths = [(s, value.format(seed=s)) for s in seeds]
        except (KeyError, IndexError, ValueError):
            return [f"--predict-from: {value!r}: only {{seed}} may stand in braces"]
    for seed, path in paths:
        if seed is not None and not os.path.isfile(path):
            return [f"--predict-from: no calibration for seed {seed} ({path})"]
        try:
            calibration.read(path)
        except TraceError as err:
            return [f"--predict-from: {err}"]
    return []
