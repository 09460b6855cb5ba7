"""The pipeline's metrics of one step, from what the controller received since the step before."""

from __future__ import annotations

from dataclasses import dataclass, field

from lrl.pipeline.messages import WorkerStats


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


@dataclass
class StepWindow:
    """What happened between two steps: every episode that finished, and the workers' running totals."""

    finished_seconds: list[float] = field(default_factory=list)  # wall time of each episode that ended
    finished_ids: list[list] = field(default_factory=list)  # [serial, seconds] of the same episodes
    stats: dict[int, WorkerStats] = field(default_factory=dict)  # worker -> totals at the last beat
    turns: list[list] = field(default_factory=list)  # [serial, Episode.turns()] of the same episodes
    timeline: list[list[float]] = field(default_factory=list)  # [worker, *Rollout.timeline sample]


@dataclass
class Carry:
    """What the groups taken since the last batch were, until a batch is made of them: a take whose every episode
    is dropped makes no batch, and what it was goes into the next batch's ledger and metrics."""

    seconds: list[float] = field(default_factory=list)  # each group's wall time, in the order taken
    decoded: int = 0  # action tokens decoded by the episodes taken, kept or dropped
    dropped_ids: list[str] = field(default_factory=list)  # dropped, or left out of a group cut short
    dropped_lengths: list[int] = field(default_factory=list)  # tokens of each episode dropped
    dropped_tokens: int = 0  # action tokens of the episodes dropped


def delta(now: dict[int, WorkerStats], before: dict[int, WorkerStats]) -> WorkerStats:
    """Sum over workers of what their totals grew by."""
    out = WorkerStats()
    for w, stats in now.items():
        old = before.get(w, WorkerStats())
        for name in vars(out):
            setattr(out, name, getattr(out, name) + getattr(stats, name) - getattr(old, name))
    return out


def occupancy(workers: WorkerStats) -> dict:
    """Shares of the slot-seconds of a step: decoding, ready for the engine, waiting for a tool, paused for a
    weight load, and empty (slots with no episode)."""
    capacity = max(workers.capacity_seconds, 1e-9)
    parts = {k: getattr(workers, k) for k in ("decoding", "ready", "tool", "paused")}
    out = {f"pipeline/occ_{k}": v / capacity for k, v in parts.items()}
    out["pipeline/occ_empty"] = max(0.0, 1.0 - sum(parts.values()) / capacity)
    return out


def pipeline_metrics(
    waited: float,
    kept: list,
    dropped_lengths: list,
    elapsed: float,
    workers: WorkerStats,
    finished_seconds: list[float],
    queued: int,
) -> dict:
    """``pipeline/*`` (and ``time/worker_sync``) of a step: `kept` its trained episodes, `dropped_lengths` the
    lengths of those dropped, `elapsed` seconds since the last step, `workers` what the workers' totals grew by
    in that time, `finished_seconds` the wall time of every episode that ended in it, `queued` episodes waiting."""
    partial = sum(len({v for v, g in zip(e.version, e.generated) if g}) > 1 for e in kept)
    in_flight = sum(e.seconds for e in kept)
    return {
        "pipeline/queue_depth": float(queued),
        "pipeline/trainer_wait": waited,
        "pipeline/worker_idle": workers.idle / max(workers.idle + workers.busy, 1e-9),
        "pipeline/episodes_per_s": (len(kept) + len(dropped_lengths)) / elapsed,
        "pipeline/dropped": float(len(dropped_lengths)),
        "pipeline/dropped_length": _mean(dropped_lengths),
        "pipeline/partial": partial / max(len(kept), 1),
        "pipeline/slot_util": workers.slot_seconds / max(workers.capacity_seconds, 1e-9),
        "pipeline/generating": sum(e.generating_seconds for e in kept) / max(in_flight, 1e-9),
        "pipeline/tool_wait": sum(e.tool_seconds for e in kept) / max(in_flight, 1e-9),
        "pipeline/episode_seconds": _mean(e.seconds for e in kept),
        "pipeline/launched_seconds": _mean(finished_seconds),
        "time/worker_sync": workers.switch_seconds / max(workers.switches, 1),
        **occupancy(workers),
        "pipeline/restarts": float(workers.restarts),
        "pipeline/lost": float(workers.lost),
        "pipeline/aborted": float(workers.aborted),
        "pipeline/aborted_tokens": float(workers.aborted_tokens),  # folded into decoded and wasted tokens
        "pipeline/cut": float(workers.cut),
        "pipeline/cut_tokens": float(workers.cut_tokens),  # folded into decoded and wasted tokens
    }
