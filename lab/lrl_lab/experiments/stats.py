"""Summaries over seeds or repeats: mean, standard error of the mean, median."""

from __future__ import annotations

import math


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (nan for one value)."""
    mu = mean(xs)
    if len(xs) < 2:
        return mu, float("nan")
    return mu, math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2
