"""Behavior samplers, chosen by name from the registry: ``make_sampler(cfg, tok)``.

The built-in names are presets of three orthogonal choices (see samplers/base.py): ``onpolicy`` samples
with the trainer's module itself; ``lagged`` with the weights ``lag`` updates old; ``fp8`` with weights
rounded to float8 (optionally also ``lag`` old); ``engine`` decodes engine-style (KV cache, its own
dtype; see samplers/engine.py), composable with ``lag`` and FP8 (``engine_fp8``); ``vllm`` samples on a real
vLLM engine (samplers/vllm.py), composable with the same two axes and ``sync_every``. Each factory reads its
options from the run's sampling section (:class:`lrl.sections.SamplingOptions`).

A user's sampler registers the same way, from any module named in ``plugins``::

    @samplers.register("mine", uses=("lag",))
    def mine(sampling, tok):
        return MySampler(tok, sampling.lag)

A factory takes what its parameters name (:func:`lrl.registry.supply`): the sampling section (``sampling``,
:class:`lrl.sections.SamplingOptions`), another section (``policy`` for the model and precision), one option
(``seed``), the run's tokenizer (``tok``), or the whole config (``cfg``, for an entry that builds another entry:
``supply(SAMPLERS["onpolicy"].factory, cfg, tok=tok)``).

Every sampler has the :class:`Sampler` Protocol of samplers/base.py, its ``traits`` included: the mismatch split
and the memory plan read those, never a sampler's name or class. An entry may also declare them without building
one (``traits=lambda sampling: ...``), for where no sampler is at hand: an asynchronous run's samplers live in its
workers (:func:`sampler_traits`). Each built-in entry is one function from the run's options to its class's
``Arguments`` (:func:`built`): the factory builds the sampler from them and the traits are its class's ``declare`` of
the same object.
"""

from __future__ import annotations

from dataclasses import replace

from lrl.decoding import Sampling
from lrl.registry import SAMPLERS, supply
from lrl.samplers.base import (
    BehaviorArguments,
    BehaviorSampler,
    LaggedArguments,
    OnPolicyArguments,
    OnPolicySampler,
    Sampler,
    SamplerArguments,
    Traits,
    cpu_state,
)
from lrl.samplers.engine import EngineArguments, EngineSampler
from lrl.samplers.fp8 import fp8_transform, round_fp8
from lrl.samplers.vllm import VLLMArguments, VLLMSampler, model_problems, vllm_missing
from lrl.sections import PolicyOptions, SamplingOptions

register = SAMPLERS.register


def sampling(options: SamplingOptions) -> Sampling:
    """The distribution a sampler draws from: temperature, and top-p/top-k where the sampler reads them."""
    return Sampling(options.temperature, options.top_p, options.top_k)


_distribution = sampling  # by another name where an entry's parameter `sampling` is the section


def built(name: str, cls, **registration):
    """Register `cls` under `name`, with the decorated function making its arguments (``cls.Arguments``) from the
    run's options, taking what its parameters name (as a factory does): the entry's factory builds
    ``cls(tok, arguments)`` and its traits are ``cls.declare(arguments)``, the same arguments for both. The
    function's docstring is the entry's help."""

    def add(arguments):
        def factory(cfg, tok):
            return cls(tok, supply(arguments, cfg))

        def traits(cfg) -> Traits:
            return cls.declare(supply(arguments, cfg))

        factory.__doc__ = arguments.__doc__
        register(name, traits=traits, **registration)(factory)
        return arguments

    return add


@built("onpolicy", OnPolicySampler, uses=("decode",))
def _onpolicy(sampling: SamplingOptions, policy: PolicyOptions) -> OnPolicyArguments:
    """the trainer's own weights and module (staleness 0)"""
    return OnPolicyArguments(_distribution(sampling), decode=sampling.decode, precision=policy.precision)


@built("lagged", BehaviorSampler, uses=("lag", "decode"))
def _lagged(sampling: SamplingOptions, policy: PolicyOptions) -> BehaviorArguments:
    """the weights `lag` updates old"""
    return BehaviorArguments(
        lag=sampling.lag, sampling=_distribution(sampling), decode=sampling.decode, precision=policy.precision
    )


@built("fp8", BehaviorSampler, uses=("lag", "fp8_scale", "decode"))
def _fp8(sampling: SamplingOptions, policy: PolicyOptions) -> BehaviorArguments:
    """weights rounded to float8 (e4m3) and back, optionally `lag` updates old"""
    return replace(_lagged(sampling, policy), transform=fp8_transform(sampling.fp8_scale))


def _engine_check(sampling: SamplingOptions) -> list[str]:
    if sampling.fp8_scale != "none" and not sampling.engine_fp8:
        return [f"fp8_scale: {sampling.fp8_scale!r} applies to the engine only with engine_fp8: true"]
    return []


def _engine_transform(sampling: SamplingOptions):
    """The engine's rounding: FP8 with engine_fp8, else none."""
    return fp8_transform(sampling.fp8_scale) if sampling.engine_fp8 else None


@built(
    "engine",
    EngineSampler,
    uses=("lag", "fp8_scale", "engine_dtype", "engine_fp8", "top_p", "top_k"),
    check=_engine_check,
)
def _engine(sampling: SamplingOptions) -> EngineArguments:
    """engine-style decoding: KV cache, its own dtype, top-k/top-p, optionally FP8 and `lag` old"""
    transform = _engine_transform(sampling)
    return EngineArguments(sampling.lag, transform, _distribution(sampling), dtype=sampling.engine_dtype)


def _vllm_machine() -> list[str]:
    """The vllm package is installed here (the preflight's check)."""
    missing = vllm_missing()
    return [f"sampler: {missing}"] if missing else []


def _vllm_model_check(sampling: SamplingOptions, spec, model) -> list[str]:
    return model_problems(model, sampling.vllm_kv_cache, sampling.vllm_dtype, spec.max_episode_tokens)


@built(
    "vllm",
    VLLMSampler,
    uses=("lag", "fp8_scale", "engine_fp8", "top_p", "top_k", "vllm_dtype", "vllm_kv_cache", "sync_every"),
    check=_engine_check,
    check_machine=_vllm_machine,
    check_model=_vllm_model_check,
)
def _vllm(sampling: SamplingOptions, policy: PolicyOptions, seed: int) -> VLLMArguments:
    """a real vLLM engine, weights synced in place every sync_every updates, optionally FP8 and `lag` old"""
    return VLLMArguments(
        lag=sampling.lag,
        transform=_engine_transform(sampling),
        sampling=_distribution(sampling),
        dtype=sampling.vllm_dtype,
        kv_cache_mib=sampling.vllm_kv_cache,
        sync_every=sampling.sync_every,
        seed=seed,
        model_dir=policy.model,
    )


def make_sampler(cfg, tok) -> Sampler:
    """The sampler named by the config's sampling section (a registry entry), built for this run."""
    sampler = supply(SAMPLERS.get(cfg.sampling.sampler).factory, cfg, tok=tok)
    sampler.name = cfg.sampling.sampler
    return sampler


def sampler_traits(cfg, tok) -> Traits:
    """The traits of the config's sampler, where no sampler of it is at hand (an asynchronous run's live in its
    workers): its entry's declaration; an entry that declares none (a plugin's own) is built, not set up, and
    asked."""
    entry = SAMPLERS.get(cfg.sampling.sampler)
    return supply(entry.traits, cfg) if entry.traits is not None else make_sampler(cfg, tok).traits


__all__ = [
    "Sampler",
    "Traits",
    "BehaviorSampler",
    "OnPolicySampler",
    "EngineSampler",
    "VLLMSampler",
    "SamplerArguments",
    "LaggedArguments",
    "BehaviorArguments",
    "OnPolicyArguments",
    "EngineArguments",
    "VLLMArguments",
    "SAMPLERS",
    "register",
    "make_sampler",
    "sampler_traits",
    "cpu_state",
    "round_fp8",
    "fp8_transform",
    "sampling",
]
