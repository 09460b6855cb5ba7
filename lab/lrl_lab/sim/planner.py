"""The planner: the five pipeline designs simulated on a trace of someone's own episodes (docs/simulate.md).

``python -m lrl_lab.sim --trace FILE`` reads the trace (lab/lrl_lab/sim/trace.py), takes the slots, the batch, the
trainer's step and sync seconds from the options, else from the trace, else the defaults (the step and sync
time have none: a trace or an option must give them), and prints, for each design, the throughput, the slot
utilization, the staleness and the mean duration of the trained episodes. The durations are used in the
order of the file, from the first again when a run needs more than the trace holds (the output says so).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

import torch

from lrl_lab.sim.pipeline import simulate_pipeline
from lrl_lab.sim.tables import DESIGNS
from lrl_lab.sim.trace import Trace, TraceError

DEFAULTS = {"slots": 64, "batch": 64}  # when neither an option nor the trace says


@dataclass(frozen=True)
class Plan:
    """The settings every design runs on, and where each came from ("--option", "trace" or "default")."""

    slots: int
    batch: int
    train_s: float
    sync_s: float
    steps: int
    source: dict[str, str]


def resolve(trace: Trace, options: dict[str, float | int | None], flags: dict[str, str], steps: int) -> Plan:
    """The plan's settings: an option given wins over the trace, the trace over the defaults."""
    values = {}
    source = {}
    for name in ("slots", "batch", "train_s", "sync_s"):
        if options.get(name) is not None:
            values[name] = options[name]
            source[name] = flags[name]
        elif name in trace.settings:
            values[name] = trace.settings[name]
            source[name] = "trace"
        elif name in DEFAULTS:
            values[name] = DEFAULTS[name]
            source[name] = "default"
        else:
            raise TraceError(
                trace.path, 1, f"no {name}: give it in the trace (docs/simulate.md) or with {flags[name]}"
            )
    return Plan(values["slots"], values["batch"], values["train_s"], values["sync_s"], steps, source)


def cycled(durations: list[float], n: int) -> torch.Tensor:
    """The first n durations of the trace read over and over in order -> [n] float64 seconds."""
    base = torch.tensor(durations, dtype=torch.float64)  # [N]
    return base.repeat(math.ceil(n / len(base)))[:n]


def plan_rows(trace: Trace, plan: Plan) -> list[dict]:
    """Each design simulated on the trace -> one row per design."""
    most = max(kw["max_staleness"] for kw in DESIGNS.values())
    pool = cycled(trace.durations, (plan.steps + most) * plan.batch)  # enough for any of the designs
    rows = []
    for name, kw in DESIGNS.items():
        r = simulate_pipeline(
            pool,
            plan.slots,
            plan.batch,
            plan.train_s,
            plan.sync_s,
            steps=plan.steps,
            keep_events=False,
            **kw,
        )
        rows.append(
            dict(
                design=name,
                max_staleness=kw["max_staleness"],
                drain=not kw.get("interrupt", True),
                episodes_per_hour=r["throughput"],
                episodes_per_s=r["throughput"] / 3600,
                slot_utilization=r["gen_util"],
                staleness_mean=r["staleness_mean"],
                staleness_max=r["staleness_max"],
                trained_duration_mean_s=r["trained_duration"],
                simulated_s=r["time"],
                episodes_started=r["started"],
                cycled=r["started"] > len(trace.durations),
            )
        )
    return rows


def plan_lines(trace: Trace, plan: Plan, rows: list[dict]) -> list[str]:
    """The planner's printout: the trace, the settings with their sources, one row per design."""
    d = trace.durations
    src = plan.source
    lines = [
        f"trace {trace.path} ({trace.format}): {len(d):,} episodes, mean {statistics.fmean(d):.1f} s, "
        f"median {statistics.median(d):.1f} s, max {max(d):.1f} s",
        f"slots {plan.slots} ({src['slots']}), batch {plan.batch} ({src['batch']}), "
        f"train {plan.train_s:g} s ({src['train_s']}), sync {plan.sync_s:g} s ({src['sync_s']}), "
        f"{plan.steps} steps per design",
        "",
    ]
    cols = ("episodes/hour", "episodes/s", "slot util", "staleness mean, max", "trained episode mean (s)")
    lines.append(" | ".join((f"{'design':<22}", *cols)))
    for row in rows:
        cells = (
            f"{row['design']:<22}",
            f"{row['episodes_per_hour']:13.0f}",
            f"{row['episodes_per_s']:10.4g}",
            f"{row['slot_utilization']:9.2f}",
            f"{row['staleness_mean']:13.2f}, {row['staleness_max']:3d}",
            f"{row['trained_duration_mean_s']:24.1f}",
        )
        lines.append(" | ".join(cells) + (" *" if row["cycled"] else ""))
    if any(row["cycled"] for row in rows):
        lines += [
            "",
            f"* needed more episodes than the trace's {len(d):,}: its durations were used again in order from the "
            f"first (most started: {max(row['episodes_started'] for row in rows):,})",
        ]
    return lines


def write_json(path: str, trace: Trace, plan: Plan, rows: list[dict]) -> None:
    """The rows and the settings they ran on, as one JSON object."""
    out = dict(
        trace=trace.path,
        format=trace.format,
        episodes_in_trace=len(trace.durations),
        slots=plan.slots,
        batch=plan.batch,
        train_s=plan.train_s,
        sync_s=plan.sync_s,
        steps=plan.steps,
        source=plan.source,
        rows=rows,
    )
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
