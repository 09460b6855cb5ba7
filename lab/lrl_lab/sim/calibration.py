"""Calibration files (``python -m lrl_lab.experiments.engine_cost --run``), read and checked alike by every command
that takes one: ``python -m lrl_lab.sim --trace``, ``python -m lrl_lab.experiments.pipeline --predict-from``,
``python -m lrl_lab.experiments.occupancy --predict-from``.

A calibration is one JSON object: ``engine`` (the engine curve, ``{"points": [[episodes decoding, step
seconds], ...]}`` with optional ``counts`` and ``switch_s``, or ``{"base_s": B, "per_episode_s": P}``),
``co_run`` (``{"slowdown": S, ...}``, S > 0), ``runs`` (one or more ``{"turns": [...], "train_s": T, ...}``;
``run`` for a single one) and, optionally, ``tool_servers`` with each run's ``tool_service``. It is read as
strict JSON (no NaN or Infinity, no key twice: engine_cost writes none) and every problem is one
:class:`~lrl_lab.sim.trace.TraceError` line naming the file. A co-run slowdown is measured (one workload alone and as
two processes); one below 1 is measurement noise, and the simulator reads it as 1 (:func:`co_run_of`).
"""

from __future__ import annotations

import json
import math
import os
import stat

from lrl_lab.sim.load import EngineCurve, parse_turns
from lrl_lab.sim.trace import TraceError

MAX_BYTES = 256 << 20  # larger than any calibration of real runs; a bound on what is read


def _constant(name: str):
    raise ValueError(f"{name} is not JSON (engine_cost writes finite numbers)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is beyond the float range")
    return value


def _object(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return out


def strict_loads(text: str):
    """JSON as lrl writes it: no NaN or Infinity, no key twice, finite floats -> the value; ValueError."""
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, object_pairs_hook=_object)
    except RecursionError:
        raise ValueError("nested too deep to read") from None


def read_text(path: str, limit: int = MAX_BYTES) -> str:
    """A regular file's UTF-8 text, at most `limit` bytes -> its text; TraceError naming the file."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise TraceError(path, None, f"cannot read it: {(err.strerror or str(err)).lower()}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise TraceError(path, None, f"cannot read it: {kind}")
    if info.st_size > limit:
        raise TraceError(path, None, f"{info.st_size} bytes; more than {limit} bytes")
    try:
        with open(path, encoding="utf-8-sig") as handle:
            return handle.read(limit + 1)
    except UnicodeDecodeError:
        raise TraceError(path, None, "cannot read it: not UTF-8 text") from None
    except OSError as err:
        raise TraceError(path, None, f"cannot read it: {(err.strerror or str(err)).lower()}") from None


def read_json(path: str):
    """A file holding one strict JSON value -> the value; TraceError naming the file."""
    text = read_text(path)
    try:
        return strict_loads(text)
    except ValueError as err:
        raise TraceError(path, None, f"not JSON ({' '.join(str(err).split())[:120]})") from None


def is_calibration(obj) -> bool:
    """Whether a JSON value is (meant as) a calibration: runs, or a co-run measurement as engine_cost writes it."""
    return isinstance(obj, dict) and ("runs" in obj or "run" in obj or isinstance(obj.get("co_run"), dict))


def _seconds(path: str, where: str, value, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(path, None, f"{where} is {json.dumps(value)[:40]}, not a finite number")
    if value < 0 or (low_open and value == 0):
        raise TraceError(path, None, f"{where} is {value:g}; it must be {'>' if low_open else '>='} 0")
    return float(value)


def engine_of(path: str, cal: dict) -> EngineCurve:
    """The engine curve a calibration (or an engine_cost --engine file) holds, checked."""
    spec = cal.get("engine")
    if not isinstance(spec, dict):
        raise TraceError(path, None, "no engine part (the engine curve engine_cost times)")
    try:
        if "points" in spec:
            if not isinstance(spec["points"], list) or not all(
                isinstance(p, list) and len(p) == 2 for p in spec["points"]
            ):
                raise ValueError("points must be [[episodes decoding, seconds], ...]")
            curve = EngineCurve.of(spec["points"], spec.get("counts"))
        elif "base_s" in spec:
            base = _seconds(path, "engine.base_s", spec["base_s"])
            curve = EngineCurve.linear(
                base, _seconds(path, "engine.per_episode_s", spec.get("per_episode_s", 0.0))
            )
        else:
            raise ValueError('give {"points": [[b, s], ...]} or {"base_s": B, "per_episode_s": P}')
    except (TypeError, ValueError) as err:
        raise TraceError(path, None, f"engine: {str(err).removeprefix('engine curve: ')}") from None
    _seconds(path, "engine.switch_s", spec.get("switch_s", 0.0))
    return curve


def co_run_of(cal: dict) -> float:
    """The co-run slowdown the simulator uses: as measured, 1 where the measurement came out below 1."""
    return max(float(cal["co_run"]["slowdown"]), 1.0)


def check(path: str, cal) -> dict:
    """A calibration checked -> it, with ``runs`` (``run`` read as a list of one); TraceError otherwise."""
    if not isinstance(cal, dict):
        raise TraceError(path, None, f"not a calibration: a JSON {type(cal).__name__}, not an object")
    if "run" in cal and "runs" not in cal:
        cal = {**cal, "runs": [cal["run"]]}
        cal.pop("run")
    engine_of(path, cal)
    co = cal.get("co_run")
    if not isinstance(co, dict) or "slowdown" not in co:
        raise TraceError(path, None, 'no co_run {"slowdown": S} (the co-run slowdown engine_cost measures)')
    _seconds(path, "co_run.slowdown", co["slowdown"], low_open=True)
    runs = cal.get("runs")
    if not isinstance(runs, list) or not runs:
        raise TraceError(path, None, "no runs: a calibration needs engine_cost --run HISTORY (a run's turns)")
    servers = cal.get("tool_servers")
    if servers is not None and (isinstance(servers, bool) or not isinstance(servers, int) or servers < 1):
        raise TraceError(
            path, None, f"tool_servers is {json.dumps(servers)[:40]}; it must be an integer >= 1"
        )
    for i, run in enumerate(runs):
        where = f"runs[{i}]"
        if not isinstance(run, dict):
            raise TraceError(path, None, f"{where} is not an object")
        if "train_s" not in run:
            raise TraceError(path, None, f"{where} has no train_s (the trainer's seconds a step)")
        _seconds(path, f"{where}.train_s", run["train_s"])
        if "turns" not in run:
            raise TraceError(path, None, f"{where} has no turns (its episodes' turns)")
        try:
            parse_turns(run["turns"])
        except (TypeError, ValueError, IndexError, KeyError) as err:
            raise TraceError(path, None, f"{where}.turns: {' '.join(str(err).split())[:120]}") from None
        service = run.get("tool_service", [])
        if not isinstance(service, list) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s >= 0
            for s in service
        ):
            raise TraceError(path, None, f"{where}.tool_service must be a list of seconds >= 0")
        if servers and not service:
            raise TraceError(
                path, None, f"{where} has no tool_service, which tool_servers needs (env/tool_times)"
            )
    return cal


def read(path: str) -> dict:
    """Read and check a calibration file -> the calibration (see the module)."""
    return check(path, read_json(path))
