"""Tool latency: environment steps that take real time, drawn from a seeded distribution.

``--tool-latency lognormal:MEDIAN:SIGMA`` makes every environment step return after ``MEDIAN * exp(SIGMA * z)``
seconds, ``z`` standard normal, drawn from the run's seeded generator: the duration model of a coding agent's
tool calls (a file read in milliseconds, a test suite in seconds), run for real rather than simulated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Latency:
    """A tool-latency distribution: ``lognormal`` with a median and a sigma (seconds), or none."""

    kind: str = "none"
    median: float = 0.0
    sigma: float = 0.0

    @property
    def off(self) -> bool:
        return self.kind == "none"

    def draw(self, generator: torch.Generator) -> float:
        """One step's delay in seconds (0 when off; no random number is drawn then)."""
        if self.off:
            return 0.0
        z = torch.randn((), generator=generator, dtype=torch.float64).item()
        return self.median * math.exp(self.sigma * z)

    def __str__(self) -> str:
        return "none" if self.off else f"lognormal:{self.median:g}:{self.sigma:g}"


def parse_latency(text: str) -> Latency:
    """'none' or 'lognormal:MEDIAN:SIGMA' -> Latency; ValueError, with the accepted forms, for anything else."""
    if text == "none":
        return Latency()
    parts = text.split(":")
    usage = "give none or lognormal:MEDIAN:SIGMA with MEDIAN > 0 and SIGMA >= 0 (seconds)"
    if len(parts) != 3 or parts[0] != "lognormal":
        raise ValueError(f"{text!r} is not a latency; {usage}")
    try:
        median, sigma = float(parts[1]), float(parts[2])
    except ValueError:
        raise ValueError(f"{text!r} is not a latency; {usage}") from None
    if not (math.isfinite(median) and median > 0 and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"{text!r} is not a latency; {usage}")
    return Latency("lognormal", median, sigma)
