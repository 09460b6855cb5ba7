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
one (``traits=lambda sampling: ...``, as each built-in does through its class's ``declare``), for where no sampler is
at hand: an asynchronous run's samplers live in its workers (:func:`sampler_traits`).
"""

from __future__ import annotations

from lrl.decoding import Sampling
from lrl.registry import SAMPLERS, supply
from lrl.samplers.base import BehaviorSampler, OnPolicySampler, Sampler, Traits, cpu_state
from lrl.samplers.engine import EngineSampler
from lrl.samplers.fp8 import fp8_transform, round_fp8
from lrl.samplers.vllm import VLLMSampler, model_problems, vllm_missing
from lrl.sections import PolicyOptions, SamplingOptions

register = SAMPLERS.register


def sampling(options: SamplingOptions) -> Sampling:
    """The distribution a sampler draws from: temperature, and top-p/top-k where the sampler reads them."""
    return Sampling(options.temperature, options.top_p, options.top_k)


def declared(cls, arguments):
    """An entry's ``traits``: those of ``cls(tok, **arguments(sampling, policy))``, read from ``cls.declare``
    without building it."""

    def traits(sampling: SamplingOptions, policy: PolicyOptions) -> Traits:
        return cls.declare(**arguments(sampling, policy))

    return traits


def _onpolicy_arguments(s: SamplingOptions, policy: PolicyOptions) -> dict:
    return dict(sampling=sampling(s), decode=s.decode, precision=policy.precision)


@register("onpolicy", uses=("decode",), traits=declared(OnPolicySampler, _onpolicy_arguments))
def _onpolicy(sampling: SamplingOptions, policy: PolicyOptions, tok):
    """the trainer's own weights and module (staleness 0)"""
    return OnPolicySampler(tok, **_onpolicy_arguments(sampling, policy))


def _lagged_arguments(s: SamplingOptions, policy: PolicyOptions) -> dict:
    return dict(lag=s.lag, sampling=sampling(s), decode=s.decode, precision=policy.precision)


@register("lagged", uses=("lag", "decode"), traits=declared(BehaviorSampler, _lagged_arguments))
def _lagged(sampling: SamplingOptions, policy: PolicyOptions, tok):
    """the weights `lag` updates old"""
    return BehaviorSampler(tok, **_lagged_arguments(sampling, policy))


def _fp8_arguments(s: SamplingOptions, policy: PolicyOptions) -> dict:
    return dict(_lagged_arguments(s, policy), transform=fp8_transform(s.fp8_scale))


@register("fp8", uses=("lag", "fp8_scale", "decode"), traits=declared(BehaviorSampler, _fp8_arguments))
def _fp8(sampling: SamplingOptions, policy: PolicyOptions, tok):
    """weights rounded to float8 (e4m3) and back, optionally `lag` updates old"""
    return BehaviorSampler(tok, **_fp8_arguments(sampling, policy))


def _engine_check(sampling: SamplingOptions) -> list[str]:
    if sampling.fp8_scale != "none" and not sampling.engine_fp8:
        return [f"fp8_scale: {sampling.fp8_scale!r} applies to the engine only with engine_fp8: true"]
    return []


def _engine_arguments(s: SamplingOptions, policy: PolicyOptions) -> dict:
    transform = fp8_transform(s.fp8_scale) if s.engine_fp8 else None
    return dict(lag=s.lag, transform=transform, sampling=sampling(s), dtype=s.engine_dtype)


@register(
    "engine",
    uses=("lag", "fp8_scale", "engine_dtype", "engine_fp8", "top_p", "top_k"),
    check=_engine_check,
    traits=declared(EngineSampler, _engine_arguments),
)
def _engine(sampling: SamplingOptions, policy: PolicyOptions, tok):
    """engine-style decoding: KV cache, its own dtype, top-k/top-p, optionally FP8 and `lag` old"""
    return EngineSampler(tok, **_engine_arguments(sampling, policy))


def _vllm_machine() -> list[str]:
    """The vllm package is installed here (the preflight's check)."""
    missing = vllm_missing()
    return [f"sampler: {missing}"] if missing else []


def _vllm_model_check(sampling: SamplingOptions, spec, model) -> list[str]:
    return model_problems(model, sampling.vllm_kv_cache, sampling.vllm_dtype, spec.max_episode_tokens)


def _vllm_arguments(s: SamplingOptions, policy: PolicyOptions) -> dict:
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
def _vllm(sampling: SamplingOptions, policy: PolicyOptions, seed: int, tok):
    """a real vLLM engine, weights synced in place every sync_every updates, optionally FP8 and `lag` old"""
    return VLLMSampler(tok, **_vllm_arguments(sampling, policy), seed=seed, model_dir=policy.model)


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
    "SAMPLERS",
    "register",
    "make_sampler",
    "sampler_traits",
    "cpu_state",
    "round_fp8",
    "fp8_transform",
    "sampling",
]
