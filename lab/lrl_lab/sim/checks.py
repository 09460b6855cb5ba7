"""Argument checks of the simulator: every bad setting is a ValueError that names the argument."""

from __future__ import annotations

import math
from typing import Any

import torch


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_durations(durations: Any) -> torch.Tensor:
    """Validate episode durations: a 1-D tensor (or sequence) of finite seconds >= 0 -> 1-D tensor [N]."""
    d = torch.as_tensor(durations)
    if d.dim() != 1:
        raise ValueError(f"durations must be 1-D (one duration per episode); got shape {tuple(d.shape)}")
    if not d.is_floating_point():
        d = d.double()
    bad = ~torch.isfinite(d)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"durations must be finite; durations[{i}] is {d[i].item()}")
    if (d < 0).any():
        i = int((d < 0).nonzero()[0])
        raise ValueError(f"durations must be >= 0 seconds; durations[{i}] is {d[i].item()}")
    return d


def check_args(
    n_slots: int,
    batch_size: int,
    train_time: float,
    sync_time: float,
    max_staleness: int,
    steps: int,
    consume_max_staleness: int | None,
    timeout: float | None,
    failure_mtbf: float | None,
) -> None:
    """Raise ValueError, naming the argument, for any simulator setting out of its range."""
    for name, value, low in [("n_slots", n_slots, 1), ("batch_size", batch_size, 1), ("steps", steps, 1)]:
        if not _is_int(value) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
    if not _is_int(max_staleness) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0; got {max_staleness!r}")
    if consume_max_staleness is not None and (
        not _is_int(consume_max_staleness) or consume_max_staleness < 0
    ):
        raise ValueError(
            f"consume_max_staleness must be None or an integer >= 0; got {consume_max_staleness!r}"
        )
    for name, value in [("train_time", train_time), ("sync_time", sync_time)]:
        if not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number of seconds >= 0; got {value!r}")
    for name, value in [("timeout", timeout), ("failure_mtbf", failure_mtbf)]:
        if value is not None and not (
            isinstance(value, (int, float)) and value > 0 and not math.isnan(value)
        ):
            raise ValueError(f"{name} must be None or a number of seconds > 0; got {value!r}")


def train_rule(name: str, value, flag: str | None = None) -> list[str]:
    """What train.py says of `value` for its option `name` (the same rule, the same words), naming `flag`."""
    from lrl.options import check_field
    from lrl.sections import OPTIONS

    problems = check_field(name, value, OPTIONS[name].annotation, OPTIONS[name].meta)
    flag = flag or "--" + name.replace("_", "-")
    return [flag + p.removeprefix(name) for p in problems]


def patience_problems(patience, patience_steps, ordered: bool, policy_flag: str) -> list[str]:
    """The ordered policy's patience options, as train.py takes them: each value by train.py's rule, and only
    beside the policy that has a patience (`ordered`: whether that policy is chosen, by `policy_flag`)."""
    problems = []
    for flag, name, values in (("--take-patience", "take_patience", patience),
                               ("--take-patience-steps", "take_patience_steps", patience_steps)):  # fmt: skip
        if values is None:
            continue
        if not ordered:
            problems.append(f"{flag} applies to {policy_flag} ordered (the only policy with a patience)")
        for value in values if isinstance(values, list) else [values]:
            problems += train_rule(name, value, flag)
    return problems[:1]


def cli_problems(args) -> list[str]:
    """``python -m lrl_lab.sim``'s options that train.py shares, by train.py's rules, and the files it will write:
    checked before any work, so that a refusal is one line and nothing ran."""
    from lrl.pipeline.policies import takes_patience
    from lrl.runs import check_output

    patient = any(takes_patience(policy) for policy in args.policies or [])
    problems = patience_problems(args.take_patience, args.take_patience_steps, patient, "--policies")
    return problems + check_output("--json", args.json, "file") + check_output("--plot", args.plot, "dir")
