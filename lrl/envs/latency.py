"""Tool latency: environment steps that take real time, drawn from a seeded distribution.

``--tool-latency lognormal:MEDIAN:SIGMA`` makes every environment step return after ``MEDIAN * exp(SIGMA * z)``
seconds, ``z`` standard normal, drawn from the run's seeded generator: the duration model of a coding agent's
tool calls (a file read in milliseconds, a test suite in seconds), run for real rather than simulated.

A draw is computed in log space and capped at :data:`MAX_DELAY` (a draw beyond it would overflow a clock or a
float; the tool timeout ends such a call long before); a median above :data:`MAX_MEDIAN` or a sigma above
:data:`MAX_SIGMA` is refused when the spec is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MAX_DELAY = 1e7  # seconds (116 days): no drawn delay is longer; every clock and float holds it
MAX_MEDIAN = 1e6  # seconds (11.6 days)
MAX_SIGMA = 20.0  # exp(20 z) spans 17 orders of magnitude per standard deviation already


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
        log_delay = math.log(self.median) + self.sigma * z
        return math.exp(log_delay) if log_delay < math.log(MAX_DELAY) else MAX_DELAY

    def __str__(self) -> str:
        return "none" if self.off else f"lognormal:{self.median:g}:{self.sigma:g}"


def parse_latency(text: str) -> Latency:
    """'none' or 'lognormal:MEDIAN:SIGMA' -> Latency; ValueError, with the accepted forms, for anything else."""
    if text == "none":
        return Latency()
    parts = text.split(":")
    usage = (
        f"give none or lognormal:MEDIAN:SIGMA with 0 < MEDIAN <= {MAX_MEDIAN:g} seconds and "
        f"0 <= SIGMA <= {MAX_SIGMA:g}"
    )
    if len(parts) != 3 or parts[0] != "lognormal":
        raise ValueError(f"{text!r} is not a latency; {usage}")
    try:
        median, sigma = float(parts[1]), float(parts[2])
    except ValueError:
        raise ValueError(f"{text!r} is not a latency; {usage}") from None
    if not (0 < median <= MAX_MEDIAN and 0 <= sigma <= MAX_SIGMA):  # NaN fails every comparison
        raise ValueError(f"{text!r} is not a latency; {usage}")
    return Latency("lognormal", median, sigma)
