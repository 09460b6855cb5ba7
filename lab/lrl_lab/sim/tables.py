"""The simulator studies (durations, five designs, timeout, sync cost, failures, and two extras) as tables.

Each `*_lines` function returns the lines of one printed table; the numbers come from `simulate_pipeline`
and the duration models, formatted as docs/simulate.md shows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lrl_lab.sim.durations import exponential_durations, failure_mask, harmonic
from lrl_lab.sim.pipeline import simulate_pipeline

# The five pipeline designs (docs/simulate.md): name -> the simulator settings that make it.
DESIGNS: dict[str, dict] = {
    "synchronous": {"max_staleness": 0},
    "one step ahead, drain": {"max_staleness": 1, "interrupt": False},
    "async eta=1, partial": {"max_staleness": 1},
    "async eta=2, partial": {"max_staleness": 2},
    "async eta=4, drain": {"max_staleness": 4, "interrupt": False},
}


@dataclass(frozen=True)
class Setup:
    """The pipeline every table shares: slots, episodes per step, seconds, steps."""

    n_slots: int = 64  # concurrent episodes in the engine
    batch_size: int = 64  # episodes per training step
    train_time: float = 60.0  # seconds per training step
    sync_time: float = 10.0  # seconds per weight sync; generation pauses
    steps: int = 20  # training steps simulated

    def run(self, durations: torch.Tensor, **overrides) -> dict:
        """simulate_pipeline on these settings, `overrides` on top: durations [N] -> result dict."""
        kw = dict(
            n_slots=self.n_slots,
            batch_size=self.batch_size,
            train_time=self.train_time,
            sync_time=self.sync_time,
            steps=self.steps,
        )
        kw.update(overrides)
        return simulate_pipeline(durations, **kw)


def duration_lines(durations: torch.Tensor, batch_sizes: list[int]) -> list[str]:
    """Durations: mean and quantiles of durations [N], and the expected slowest of a batch of each size."""
    mean = durations.mean()  # float32 scalar
    median, p90, p99 = durations.quantile(torch.tensor([0.5, 0.9, 0.99])).tolist()
    stats = [
        ("mean", mean.item()),
        ("median", median),
        ("p90", p90),
        ("p99", p99),
        ("max", durations.max().item()),
    ]
    lines = [" | ".join(f"{name} {value:.0f} s" for name, value in stats)]
    for b in batch_sizes:
        if b > len(durations):
            raise ValueError(f"batch size {b} is larger than the {len(durations)} durations drawn")
        slowest = durations[: len(durations) // b * b].view(-1, b).max(-1).values.mean()  # float32 scalar
        ratio = (slowest / mean).item()
        lines.append(f"B = {b:3d}: expected slowest episode {slowest.item():4.0f} s = {ratio:.1f} x the mean")
    return lines


def design_lines(durations: torch.Tensor, setup: Setup, designs: dict[str, dict] = DESIGNS) -> list[str]:
    """The designs: throughput, slot use, staleness and trained-episode length of each design."""
    cols = ("episodes/hour", "slot util", "staleness mean, max", "trained episode mean (s)")
    lines = [" | ".join((f"{'design':<22}", *cols))]
    for name, kw in designs.items():
        r = setup.run(durations, **kw)
        stale = f"{r['staleness_mean']:8.2f}, {r['staleness_max']:2d}     "
        cells = (
            f"{name:<22}",
            f"{r['throughput']:13.0f}",
            f"{r['gen_util']:9.2f}",
            stale,
            f"{r['trained_duration']:6.1f}",
        )
        lines.append(" | ".join(cells))
    return lines


def timeout_lines(durations: torch.Tensor, setup: Setup, quantile: float = 0.95) -> list[str]:
    """A synchronous pipeline with and without a timeout at a duration quantile."""
    cap = durations.quantile(quantile).item()
    cases = [("no timeout", None), (f"timeout at p{quantile * 100:.0f} ({cap:.0f} s)", cap)]
    lines = []
    for name, timeout in cases:
        r = setup.run(durations, max_staleness=0, timeout=timeout)
        lines.append(
            f"synchronous, {name:<24} | {r['throughput']:5.0f} episodes/hour | slot utilization {r['gen_util']:.2f}"
        )
    share = (durations > cap).float().mean().item()
    lines.append(f"episodes truncated by the timeout: {share:.1%}")
    return lines


def sync_lines(durations: torch.Tensor, setup: Setup, sync_times: list[float], eta: int = 2) -> list[str]:
    """Throughput of the synchronous and an async (partial) design as the sync cost grows."""
    async_name = f"async eta={eta}, partial"
    lines = [f"{'sync time (s)':>13} | synchronous | {async_name}   (episodes/hour)"]
    for sync_time in sync_times:
        sync_r, async_r = (setup.run(durations, sync_time=sync_time, max_staleness=s) for s in (0, eta))
        lines.append(f"{sync_time:13.0f} | {sync_r['throughput']:11.0f} | {async_r['throughput']:11.0f}")
    return lines


def failure_lines(
    durations: torch.Tensor, mtbf: float, seed: int = 1, long_quantile: float = 0.9
) -> list[str]:
    """How a constant failure hazard biases the surviving episodes toward short ones."""
    failed = failure_mask(durations, mtbf, torch.Generator().manual_seed(seed))  # [N]
    longest = durations > durations.quantile(long_quantile)  # [N]
    share = failed.float().mean().item()
    long_share = failed[longest].float().mean().item()
    return [
        f"episodes failing: {share:.1%} | among the longest {1 - long_quantile:.0%}: {long_share:.1%}",
        f"mean duration: all {durations.mean().item():.0f} s | survivors {durations[~failed].mean().item():.0f} s",
    ]


def exponential_rows(mean: float, batch_sizes: list[int], setup: Setup, seed: int = 0) -> list[dict]:
    """Exercise 1: synchronous step time on exponential durations against m * H_B and m ln B (+ train, sync)."""
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for b in batch_sizes:
        r = setup.run(
            exponential_durations(setup.steps * b, mean, gen), n_slots=b, batch_size=b, max_staleness=0
        )
        fixed = setup.train_time + setup.sync_time
        rows.append(
            dict(
                batch_size=b,
                simulated=r["time"] / setup.steps,
                exact=mean * harmonic(b) + fixed,
                log_law=mean * math.log(b) + fixed,
            )
        )
    return rows


def exponential_lines(rows: list[dict], mean: float, steps: int) -> list[str]:
    """Exercise 1 as a table: one row per batch size."""
    lines = [
        f"exponential durations, mean m = {mean:g} s, synchronous, {steps} steps, slots = B",
        f"{'B':>5} | {'simulated step (s)':>18} | {'m H_B + t + s':>13} | {'m ln B + t + s':>14}",
    ]
    for r in rows:
        lines.append(
            f"{r['batch_size']:5d} | {r['simulated']:18.1f} | {r['exact']:13.1f} | {r['log_law']:14.1f}"
        )
    return lines


def sweep_rows(durations: torch.Tensor, setup: Setup, etas: list[int]) -> list[dict]:
    """The staleness sweep: per staleness bound, throughput with partial rollouts and drain, staleness."""
    rows = []
    for eta in etas:
        partial = setup.run(durations, max_staleness=eta, keep_events=False)
        drain = setup.run(durations, max_staleness=eta, interrupt=False, keep_events=False)
        rows.append(
            dict(
                eta=eta,
                partial=partial["throughput"],
                drain=drain["throughput"],
                stale_mean=partial["staleness_mean"],
                stale_max=partial["staleness_max"],
            )
        )
    return rows


def sweep_lines(rows: list[dict]) -> list[str]:
    """The staleness sweep as a table."""
    lines = [f"{'eta':>3} | {'partial (ep/h)':>14} | {'drain (ep/h)':>12} | partial staleness mean, max"]
    for r in rows:
        lines.append(
            f"{r['eta']:3d} | {r['partial']:14.0f} | {r['drain']:12.0f} | {r['stale_mean']:10.2f}, {r['stale_max']:2d}"
        )
    return lines


def consume_rows(durations: torch.Tensor, setup: Setup, etas: list[int]) -> list[dict]:
    """Exercise 2: partial rollouts with the bound also enforced when the trainer consumes episodes."""
    rows = []
    for eta in etas:
        free = setup.run(durations, max_staleness=eta, keep_events=False)
        bound = setup.run(durations, max_staleness=eta, consume_max_staleness=eta, keep_events=False)
        seen = bound["discarded"] + bound["trained"]
        rows.append(
            dict(
                eta=eta,
                throughput=free["throughput"],
                bounded=bound["throughput"],
                discarded=bound["discarded"] / seen,
                stale_max=bound["staleness_max"],
                stale_max_free=free["staleness_max"],
            )
        )
    return rows


def consume_lines(rows: list[dict]) -> list[str]:
    """Exercise 2 as a table: throughput and share discarded when the trainer drops staler episodes."""
    head = (
        "eta",
        "ep/h, throttle only",
        "ep/h, consumed <= eta",
        "discarded",
        "max staleness, consumed (throttle only)",
    )
    lines = [" | ".join(head)]
    for r in rows:
        cells = (
            f"{r['eta']:3d}",
            f"{r['throughput']:19.0f}",
            f"{r['bounded']:21.0f}",
            f"{r['discarded']:9.1%}",
            f"{r['stale_max']:2d} ({r['stale_max_free']})",
        )
        lines.append(" | ".join(cells))
    return lines
