"""The pipeline's metrics of one step, from what the controller measured."""

from __future__ import annotations


def pipeline_metrics(
    waited: float, kept: list, dropped_lengths: list, elapsed: float, idle: float, busy: float, queued: int
) -> dict:
    """``pipeline/*`` of a step: `kept` its trained episodes, `dropped_lengths` the lengths of those dropped,
    `elapsed` seconds since the last step, `idle` / `busy` worker seconds in that time, `queued` episodes waiting."""
    partial = sum(len({v for v, g in zip(e.version, e.generated) if g}) > 1 for e in kept)
    dropped_mean = sum(dropped_lengths) / len(dropped_lengths) if dropped_lengths else 0.0
    return {
        "pipeline/queue_depth": float(queued),
        "pipeline/trainer_wait": waited,
        "pipeline/worker_idle": idle / max(idle + busy, 1e-9),
        "pipeline/episodes_per_s": (len(kept) + len(dropped_lengths)) / elapsed,
        "pipeline/dropped": float(len(dropped_lengths)),
        "pipeline/dropped_length": dropped_mean,
        "pipeline/partial": partial / max(len(kept), 1),
    }


def turns(episode) -> int:
    """Actions the episode took: runs of generated tokens."""
    return sum(1 for a, b in zip([False, *episode.generated], episode.generated) if b and not a)
