"""The staleness policies as the lab names them (``ordered@1.2``: ordered with a patience of 1.2 s, ``ordered@1x``: of
one trainer step), how tables show them, what the simulator is given for them, and the folders their runs go to."""

from __future__ import annotations

import math

from lrl.pipeline.policies import DEFAULT_POLICY, is_default, takes_patience
from lrl_lab.experiments.workload import SLOTS
from lrl_lab.sim.board import Steps  # a patience in trainer steps


def split_policy(label: str) -> tuple[str, float | None]:
    """A policy as this experiment names it -> (lrl's --stale-policy, its patience): ``ordered@1.2`` is
    ``ordered`` with a patience of 1.2 s, ``ordered@1x`` one of a trainer step (a :class:`Steps`); any other name
    has none."""
    name, _, wait = label.partition("@")
    if not wait:
        return name, None
    steps = wait.endswith("x")
    try:
        value = float(wait[:-1] if steps else wait)
    except ValueError:
        value = math.nan
    if not takes_patience(name) or not value >= 0 or not math.isfinite(value):
        raise SystemExit(
            f"policy {label!r}: only ordered takes a patience, in seconds >= 0 (ordered@1.2) or in trainer steps "
            "(ordered@1x)"
        )
    return name, Steps(value) if steps else value


def patience_text(wait: float) -> str:
    """A patience as a folder or label writes it: ``1.2`` (seconds) or ``1x`` (trainer steps)."""
    return f"{wait:g}x" if isinstance(wait, Steps) else f"{wait:g}"


def shown(label: str) -> str:
    """A policy label as tables and figures show it: ``ordered@1.2`` is ``ordered, 1.2 s``, ``ordered@1x``
    ``ordered, 1 step``."""
    name, wait = split_policy(label)
    if wait is None:
        return name
    if isinstance(wait, Steps):
        return f"{name}, {wait:g} step" + ("" if wait == 1 else "s")
    return f"{name}, {wait:g} s"


def sim_policy(label: str) -> dict:
    """The simulator's arguments of a policy label (lrl_lab.sim.board.simulate_board: policy, patience, or
    patience_steps)."""
    name, wait = split_policy(label)
    if isinstance(wait, Steps):
        return {"policy": name, "patience_steps": float(wait)}
    return {"policy": name, "patience": math.inf if wait is None else wait}


def env_prefix(env: str) -> str:
    """What the folders of an environment's runs begin with (``results/designs/<prefix>hard...``)."""
    return "codefix-" if env == "codefix" else ""


def run_folder(
    env: str = "tinyagent",
    drop: bool = True,
    frozen: bool = False,
    slots: int = SLOTS,
    policy: str = DEFAULT_POLICY,
) -> str:
    """The folder name under results/designs of a setting's runs: ``[codefix-]hard|throttle[-frozen][-sN][-P]``."""
    name = env_prefix(env) + ("hard" if drop else "throttle") + ("-frozen" if frozen else "")
    name += f"-s{slots}" if slots != SLOTS else ""
    if is_default(policy):
        return name
    base, wait = split_policy(policy)
    return name + f"-{base}" + (f"-w{patience_text(wait)}" if wait is not None else "")
