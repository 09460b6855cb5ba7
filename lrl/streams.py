"""The run's random streams: one torch generator per purpose, each seeded from the run's seed by an offset of its
own, so that turning one thing on (injected failures, tool latency) never shifts the draws of another.

On rank r of a data-parallel run a stream is seeded with :func:`lrl.sources.base.rank_seed` of its seed; a
rollout worker's streams are seeded per batch (or per worker) with :func:`batch_seed`.
"""

from __future__ import annotations

SAMPLING = 0  # which tasks a batch trains on, which tokens its episodes sample
SHUFFLE = 1  # the trainer's minibatch shuffle
ENV_FAILURES = 2  # injected environment failures (lrl.envs.FailureInjection)
TOOL_LATENCY = 3  # drawn tool latencies (lrl.envs.latency)
EVALUATION = 10_000  # the held-out evaluation's sampling
FREE_WORKER = (
    10_000  # a free-running worker's sampling: "batch" numbers far from a deterministic run's batches
)


def stream_seed(seed: int, stream: int) -> int:
    """The seed of one stream of a run seeded with `seed`."""
    return seed + stream


def batch_seed(seed: int, rank: int, batch: int) -> int:
    """A generator seed from a stream's seed, the rank and a batch (or worker) number."""
    return (seed * 1_000_003 + rank * 7919 + batch * 104_729) % (2**63)
