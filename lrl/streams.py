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
MONITORED = 4  # which rows that do not train have pi_old scored for the mismatch metrics (lrl.update.monitored_rows)
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


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a 64-bit integer -> a well-mixed 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def keyed(seed: int, *key: int) -> int:
    """A 64-bit number that depends on `seed` and the integers of `key` alone (not on any draw before it)."""
    x = _mix(seed & _MASK)
    for k in key:
        x = _mix(x ^ (k & _MASK))
    return x


class KeyedDraws:
    """The draws of one batch keyed by what they are for, not by their order: the uniform of an episode's token is
    a function of (stream seed, batch, episode, turn, position in the turn), so two runs of one seed draw the same
    uniform for the same token of the same episode, whatever the other episodes did (``paired_streams``)."""

    def __init__(self, seed: int, batch: int):
        self.seed = seed
        self.batch = batch

    def uniforms(self, keys: list[tuple[int, int, int]]) -> list[float]:
        """(episode, turn, position) -> a uniform in [0, 1) each, with 53 random bits."""
        return [(keyed(self.seed, self.batch, *k) >> 11) * 2.0**-53 for k in keys]

    def engine_seed(self, episode: int, turn: int) -> int:
        """An engine request's seed (an engine that samples whole actions): keyed the same way."""
        return keyed(self.seed, self.batch, episode, turn, 1 << 40) % (2**31 - 1)

    def task_seed(self) -> int:
        """The seed of the batch's choice of tasks."""
        return keyed(self.seed, self.batch, 1 << 41) % (2**63)
