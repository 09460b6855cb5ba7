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

Every sampler has the :class:`Sampler` Protocol of samplers/base.py, its ``traits`` included: the mismatch split
and the memory plan read those, never a sampler's name or class. An entry may also declare them without building
one (``traits=lambda cfg: ...``, as each built-in does through its class's ``declare``), for where no sampler is
at hand: an asynchronous run's samplers live in its workers (:func:`sampler_traits`).
"""

from __future__ import annotations

from lrl.decoding import Sampling
from lrl.registry import SAMPLERS
from lrl.samplers.base import BehaviorSampler, OnPolicySampler, Sampler, Traits, cpu_state
from lrl.samplers.engine import EngineSampler
from lrl.samplers.fp8 import fp8_transform, round_fp8
from lrl.samplers.vllm import VLLMSampler, model_problems, vllm_missing
from lrl.sections import SamplingOptions

register = SAMPLERS.register


def sampling(options: SamplingOptions) -> Sampling:
    """The distribution a sampler draws from: temperature, and top-p/top-k where the sampler reads them."""
    return Sampling(options.temperature, options.top_p, options.top_k)


def declared(cls, arguments):
    """An entry's ``traits``: those of ``cls(tok, **arguments(cfg))``, read from ``cls.declare`` without building it."""
    return lambda cfg: cls.declare(**arguments(cfg))


def _onpolicy_arguments(cfg) -> dict:
    s = cfg.sampling
    return dict(sampling=sampling(s), decode=s.decode, precision=cfg.precision)


@register("onpolicy", uses=("decode",), traits=declared(OnPolicySampler, _onpolicy_arguments))
def _onpolicy(cfg, tok):
    """the trainer's own weights and module (staleness 0)"""
    return OnPolicySampler(tok, **_onpolicy_arguments(cfg))


def _lagged_arguments(cfg) -> dict:
    s = cfg.sampling
    return dict(lag=s.lag, sampling=sampling(s), decode=s.decode, precision=cfg.precision)


@register("lagged", uses=("lag", "decode"), traits=declared(BehaviorSampler, _lagged_arguments))
def _lagged(cfg, tok):
    """the weights `lag` updates old"""
    return BehaviorSampler(tok, **_lagged_arguments(cfg))


def _fp8_arguments(cfg) -> dict:
    return dict(_lagged_arguments(cfg), transform=fp8_transform(cfg.sampling.fp8_scale))


@register("fp8", uses=("lag", "fp8_scale", "decode"), traits=declared(BehaviorSampler, _fp8_arguments))
def _fp8(cfg, tok):
    """weights rounded to float8 (e4m3) and back, optionally `lag` updates old"""
    return BehaviorSampler(tok, **_fp8_arguments(cfg))


def _engine_check(cfg) -> list[str]:
    s = cfg.sampling
    if s.fp8_scale != "none" and not s.engine_fp8:
        return [f"fp8_scale: {s.fp8_scale!r} applies to the engine only with engine_fp8: true"]
    return []


def _engine_arguments(cfg) -> dict:
    s = cfg.sampling
    transform = fp8_transform(s.fp8_scale) if s.engine_fp8 else None
    return dict(lag=s.lag, transform=transform, sampling=sampling(s), dtype=s.engine_dtype)


@register(
    "engine",
    uses=("lag", "fp8_scale", "engine_dtype", "engine_fp8", "top_p", "top_k"),
    check=_engine_check,
    traits=declared(EngineSampler, _engine_arguments),
)
def _engine(cfg, tok):
    """engine-style decoding: KV cache, its own dtype, top-k/top-p, optionally FP8 and `lag` old"""
    return EngineSampler(tok, **_engine_arguments(cfg))


def _vllm_machine(cfg) -> list[str]:
    """The vllm package is installed here (the preflight's check)."""
    missing = vllm_missing()
    return [f"sampler: {missing}"] if missing else []


def _vllm_model_check(cfg, spec, model) -> list[str]:
    s = cfg.sampling
    return model_problems(model, s.vllm_kv_cache, s.vllm_dtype, spec.max_episode_tokens)


def _vllm_arguments(cfg) -> dict:
    s = cfg.sampling
    transform = fp8_transform(s.fp8_scale) if s.engine_fp8 else None
    return dict(
        lag=s.lag,
        transform=transform,
        sampling=sampling(s),
        dtype=s.vllm_dtype,
        kv_cache_mib=s.vllm_kv_cache,
        sync_every=s.sync_every,
    )


@register(
    "vllm",
    uses=("lag", "fp8_scale", "engine_fp8", "top_p", "top_k", "vllm_dtype", "vllm_kv_cache", "sync_every"),
    check=_engine_check,
    check_machine=_vllm_machine,
    check_model=_vllm_model_check,
    traits=declared(VLLMSampler, _vllm_arguments),
)
def _vllm(cfg, tok):
    """a real vLLM engine, weights synced in place every sync_every updates, optionally FP8 and `lag` old"""
    return VLLMSampler(tok, **_vllm_arguments(cfg), seed=cfg.seed, model_dir=cfg.model)


def make_sampler(cfg, tok) -> Sampler:
    """The sampler named by cfg.sampler (a registry entry), built for this run."""
    sampler = SAMPLERS.get(cfg.sampler).factory(cfg, tok)
    sampler.name = cfg.sampler
    return sampler


def sampler_traits(cfg, tok) -> Traits:
    """The traits of the sampler cfg.sampler names, where no sampler of it is at hand (an asynchronous run's live in
    its workers): its entry's declaration; an entry that declares none (a plugin's own) is built, not set up, and
    asked."""
    entry = SAMPLERS.get(cfg.sampler)
    if entry.traits is not None:
        return entry.traits(cfg)
    return make_sampler(cfg, tok).traits


__all__ = [
    "Sampler",
    "Traits",
    "BehaviorSampler",
    "OnPolicySampler",
    "EngineSampler",
    "VLLMSampler",
    "SAMPLERS",
    "register",
    "make_sampler",
    "sampler_traits",
    "cpu_state",
    "round_fp8",
    "fp8_transform",
    "sampling",
]
