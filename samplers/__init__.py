"""Behavior samplers, chosen by name: ``make_sampler(cfg, tok)``.

The names are presets of three orthogonal choices (see samplers/base.py): ``onpolicy`` samples with the
trainer's module itself; ``lagged`` with the weights ``cfg.lag`` updates old; ``fp8`` with weights rounded
to float8 (optionally also ``cfg.lag`` old); ``engine`` decodes engine-style (KV cache, its own dtype; see
samplers/engine.py), composable with ``cfg.lag`` and FP8 (``cfg.engine_fp8``).
"""

from __future__ import annotations

from collections.abc import Callable

from samplers.base import BehaviorSampler, OnPolicySampler, cpu_state
from samplers.engine import EngineSampler
from samplers.fp8 import fp8_transform, round_fp8

SAMPLERS: dict[str, Callable] = {}


def register(name: str):
    """Decorator: make a sampler factory `factory(cfg, tok) -> sampler` available under `name`."""

    def add(factory):
        SAMPLERS[name] = factory
        return factory

    return add


@register("onpolicy")
def _onpolicy(cfg, tok):
    return OnPolicySampler(tok, cfg.temperature, cfg.max_turns)


@register("lagged")
def _lagged(cfg, tok):
    return BehaviorSampler(tok, cfg.lag, None, cfg.temperature, cfg.max_turns)


@register("fp8")
def _fp8(cfg, tok):
    return BehaviorSampler(tok, cfg.lag, fp8_transform(cfg.fp8_scale), cfg.temperature, cfg.max_turns)


@register("engine")
def _engine(cfg, tok):
    transform = fp8_transform(cfg.fp8_scale) if cfg.engine_fp8 else None
    return EngineSampler(tok, cfg.lag, transform, cfg.temperature, cfg.max_turns, cfg.engine_dtype, cfg.top_p, cfg.top_k)


def make_sampler(cfg, tok):
    """The sampler named by cfg.sampler; an unknown name lists the registered ones."""
    if cfg.sampler not in SAMPLERS:
        raise ValueError(f"sampler: {cfg.sampler!r} is not registered; choose one of {', '.join(SAMPLERS)}")
    sampler = SAMPLERS[cfg.sampler](cfg, tok)
    sampler.name = cfg.sampler
    return sampler


__all__ = ["BehaviorSampler", "OnPolicySampler", "SAMPLERS", "register", "make_sampler", "cpu_state",
           "round_fp8", "fp8_transform", "EngineSampler"]  # fmt: skip
