"""Behavior samplers, chosen by name from the registry: ``make_sampler(cfg, tok)``.

The built-in names are presets of three orthogonal choices (see samplers/base.py): ``onpolicy`` samples
with the trainer's module itself; ``lagged`` with the weights ``lag`` updates old; ``fp8`` with weights
rounded to float8 (optionally also ``lag`` old); ``engine`` decodes engine-style (KV cache, its own
dtype; see samplers/engine.py), composable with ``lag`` and FP8 (``engine_fp8``); ``vllm`` samples on a real
vLLM engine (samplers/vllm.py), composable with the same two axes and ``sync_every``. Each factory reads its
options from the run's sampling section (``cfg.sampling``, :class:`lrl.sections.SamplingOptions`).

A user's sampler registers the same way, from any module named in ``plugins``::

    @samplers.register("mine", uses=("lag",))
    def mine(cfg, tok):
        return MySampler(tok, cfg.sampling.lag)
"""

from __future__ import annotations

from lrl.decoding import Sampling
from lrl.registry import SAMPLERS
from lrl.samplers.base import BehaviorSampler, OnPolicySampler, cpu_state
from lrl.samplers.engine import EngineSampler
from lrl.samplers.fp8 import fp8_transform, round_fp8
from lrl.samplers.vllm import VLLMSampler, model_problems, vllm_missing
from lrl.sections import SamplingOptions

register = SAMPLERS.register


def sampling(options: SamplingOptions) -> Sampling:
    """The distribution a sampler draws from: temperature, and top-p/top-k where the sampler reads them."""
    return Sampling(options.temperature, options.top_p, options.top_k)


@register("onpolicy", uses=("decode",))
def _onpolicy(cfg, tok):
    """the trainer's own weights and module (staleness 0)"""
    s = cfg.sampling
    return OnPolicySampler(tok, sampling(s), s.decode, cfg.precision)


@register("lagged", uses=("lag", "decode"))
def _lagged(cfg, tok):
    """the weights `lag` updates old"""
    s = cfg.sampling
    return BehaviorSampler(tok, s.lag, None, sampling(s), s.decode, cfg.precision)


@register("fp8", uses=("lag", "fp8_scale", "decode"))
def _fp8(cfg, tok):
    """weights rounded to float8 (e4m3) and back, optionally `lag` updates old"""
    s = cfg.sampling
    return BehaviorSampler(tok, s.lag, fp8_transform(s.fp8_scale), sampling(s), s.decode, cfg.precision)


def _engine_check(cfg) -> list[str]:
    s = cfg.sampling
    if s.fp8_scale != "none" and not s.engine_fp8:
        return [f"fp8_scale: {s.fp8_scale!r} applies to the engine only with engine_fp8: true"]
    return []


@register(
    "engine", uses=("lag", "fp8_scale", "engine_dtype", "engine_fp8", "top_p", "top_k"), check=_engine_check
)
def _engine(cfg, tok):
    """engine-style decoding: KV cache, its own dtype, top-k/top-p, optionally FP8 and `lag` old"""
    s = cfg.sampling
    transform = fp8_transform(s.fp8_scale) if s.engine_fp8 else None
    return EngineSampler(tok, s.lag, transform, sampling(s), s.engine_dtype)


def _vllm_machine(cfg) -> list[str]:
    """The vllm package is installed here (the preflight's check)."""
    missing = vllm_missing()
    return [f"sampler: {missing}"] if missing else []


def _vllm_model_check(cfg, spec, model) -> list[str]:
    s = cfg.sampling
    return model_problems(model, s.vllm_kv_cache, s.vllm_dtype, spec.max_episode_tokens)


@register(
    "vllm",
    uses=("lag", "fp8_scale", "engine_fp8", "top_p", "top_k", "vllm_dtype", "vllm_kv_cache", "sync_every"),
    check=_engine_check,
    check_machine=_vllm_machine,
    check_model=_vllm_model_check,
)
def _vllm(cfg, tok):
    """a real vLLM engine, weights synced in place every sync_every updates, optionally FP8 and `lag` old"""
    s = cfg.sampling
    transform = fp8_transform(s.fp8_scale) if s.engine_fp8 else None
    return VLLMSampler(
        tok,
        s.lag,
        transform,
        sampling(s),
        s.vllm_dtype,
        s.vllm_kv_cache,
        s.sync_every,
        cfg.seed,
        cfg.model,
    )


def make_sampler(cfg, tok):
    """The sampler named by cfg.sampler (a registry entry), built for this run."""
    sampler = SAMPLERS.get(cfg.sampler).factory(cfg, tok)
    sampler.name = cfg.sampler
    return sampler


__all__ = [
    "BehaviorSampler",
    "OnPolicySampler",
    "EngineSampler",
    "VLLMSampler",
    "SAMPLERS",
    "register",
    "make_sampler",
    "cpu_state",
    "round_fp8",
    "fp8_transform",
    "sampling",
]
