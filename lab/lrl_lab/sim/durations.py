"""Episode-duration models for the pipeline simulator and their small helpers.

An agent episode alternates generation and tool calls: a geometric number of turns, a uniform number of
tokens per turn decoded at a fixed per-sequence rate, and a log-normal tool latency after every turn.
The defaults are assumptions about a coding agent (docs/simulate.md), not measurements of one.
"""

from __future__ import annotations

import math

import torch


def _geometric_turns(u: torch.Tensor, mean_turns: float, max_turns: int) -> torch.Tensor:
    """Turn counts by inverse CDF of a geometric law with mean `mean_turns`: uniforms [n] -> floats [n] in 1..max."""
    log_keep = math.log(1 - 1 / mean_turns)  # log P(another turn)
    return (torch.log1p(-u) / log_keep).ceil().clamp(1, max_turns)


def agent_episode_durations(
    n: int,
    generator: torch.Generator,
    mean_turns: float = 8,
    max_turns: int = 40,
    tokens_per_turn: tuple[float, float] = (100, 600),
    decode_rate: float = 40.0,
    tool_median: float = 2.0,
    tool_sigma: float = 1.0,
) -> torch.Tensor:
    """Wall-clock seconds of `n` simulated agent episodes -> [n] float32.

    Draws from `generator` in a fixed order (turn uniforms [n], token uniforms [n, max_turns], tool normals
    [n, max_turns]), so one seed always gives the same durations.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0; got {n}")
    if not mean_turns > 1:
        raise ValueError(f"mean_turns must be > 1; got {mean_turns}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1; got {max_turns}")
    low, high = tokens_per_turn
    if not 0 <= low <= high:
        raise ValueError(f"tokens_per_turn must be (low, high) with 0 <= low <= high; got {tokens_per_turn}")
    if not decode_rate > 0 or not tool_median > 0 or not tool_sigma >= 0:
        raise ValueError(
            f"need decode_rate > 0, tool_median > 0, tool_sigma >= 0; got {decode_rate}, {tool_median}, {tool_sigma}"
        )
    turns = _geometric_turns(torch.rand(n, generator=generator), mean_turns, max_turns)  # [n]
    token_u = torch.rand(n, max_turns, generator=generator)  # [n, max_turns]
    decode_s = (low + (high - low) * token_u) / decode_rate  # [n, max_turns]
    tool_s = tool_median * torch.exp(tool_sigma * torch.randn(n, max_turns, generator=generator))
    taken = torch.arange(max_turns)[None, :] < turns[:, None]  # [n, max_turns] turns that happened
    return ((decode_s + tool_s) * taken).sum(-1)


def exponential_durations(n: int, mean: float, generator: torch.Generator) -> torch.Tensor:
    """`n` exponential durations with the given mean (the m H_B study) -> [n] float32."""
    if n < 0 or not mean > 0:
        raise ValueError(f"need n >= 0 and mean > 0; got n={n}, mean={mean}")
    return torch.empty(n).exponential_(1 / mean, generator=generator)


def harmonic(k: int) -> float:
    """H_k = 1 + 1/2 + ... + 1/k, so that E[max of k exponentials of mean m] = m * H_k."""
    return math.fsum(1 / i for i in range(1, k + 1))


def failure_draws(
    durations: torch.Tensor, mtbf: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker failures at a constant hazard 1/mtbf per second: durations [N] -> (failed bool [N], seconds [N]).

    One uniform u per episode, in order: an episode of length d fails with probability 1 - exp(-d / mtbf),
    and a failed one stops after -mtbf * log(1 - u) seconds (its exponential failure time, at most d).
    """
    if not mtbf > 0:
        raise ValueError(f"mtbf must be > 0 seconds; got {mtbf}")
    u = torch.rand(len(durations), generator=generator)  # [N]
    failed = u < 1 - torch.exp(-durations / mtbf)
    stop_s = torch.minimum(-mtbf * torch.log1p(-u.double()), durations.double())  # [N]
    return failed, stop_s


def failure_mask(durations: torch.Tensor, mtbf: float, generator: torch.Generator) -> torch.Tensor:
    """Which episodes a constant failure hazard 1/mtbf per second hits: [N] -> bool [N]."""
    return failure_draws(durations, mtbf, generator)[0]
