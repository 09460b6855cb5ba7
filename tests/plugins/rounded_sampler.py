"""A test plugin: a behavior sampler written against the ``Sampler`` Protocol of samplers/base.py alone, not a
subclass of lrl's. It samples with the trainer's weights rounded to bfloat16 and back, decoded trainer-style, and
keeps one fp32 copy of the model plus a buffer of its own; its ``traits`` say so, and that is all the mismatch
split and the memory plan learn of it.

``rounded`` also declares its traits on its registry entry (known without building it); ``rounded_undeclared`` is
the same sampler without that declaration (it is built, not set up, where its traits are asked for)."""

from __future__ import annotations

import copy

import torch

from lrl import samplers
from lrl.decoding import Sampling, TrainerStyleDecoder
from lrl.rollout import run_episodes

BUFFER = 3 * 2**20  # bytes it keeps whatever the model: what the memory plan must add beside its copy


@torch.no_grad()
def round_bf16(model: torch.nn.Module) -> None:
    """Round every parameter to bfloat16 and back, in place."""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).to(p.dtype))


def declare(sampling: Sampling) -> samplers.Traits:
    """No staleness, weights rounded to bfloat16, the trainer's decode path; one fp32 copy and the buffer."""
    return samplers.Traits(sampling, transform=round_bf16, bytes_per_parameter=4, extra_bytes=BUFFER)


class RoundedSampler:
    """The trainer's weights of the last sync, rounded to bfloat16, decoded with full forwards."""

    name = "rounded"

    def __init__(self, tok, sampling: Sampling):
        self.tok = tok
        self.sampling = sampling
        self.behavior: torch.nn.Module | None = None
        self.version = 0

    @property
    def traits(self) -> samplers.Traits:
        return declare(self.sampling)

    def setup(self, policy: torch.nn.Module, version: int = 0) -> None:
        self.behavior = copy.deepcopy(policy).to("cpu").eval()
        self.sync(policy, version)

    def sync(self, policy: torch.nn.Module, version: int) -> None:
        self.behavior.load_state_dict(policy.state_dict())
        round_bf16(self.behavior)
        self.version = version

    def close(self) -> None:
        pass

    def decoder(self) -> TrainerStyleDecoder:
        return TrainerStyleDecoder(self.behavior, self.tok.pad_id)

    def sample(self, tasks, generator, spec, **engine):
        return run_episodes(self.decoder(), spec, tasks, generator, self.sampling, self.version, **engine)

    @property
    def behavior_version(self) -> int:
        return self.version

    @property
    def kept_versions(self) -> list[int]:
        return [self.version]

    def state_dict(self) -> dict:
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]


@samplers.register("rounded", traits=lambda cfg: declare(Sampling(cfg.sampling.temperature)))
def rounded(cfg, tok):
    """the trainer's weights rounded to bfloat16 and back, decoded trainer-style"""
    return RoundedSampler(tok, Sampling(cfg.sampling.temperature))


@samplers.register("rounded_undeclared")
def rounded_undeclared(cfg, tok):
    """the same sampler, its traits not declared on its entry"""
    return RoundedSampler(tok, Sampling(cfg.sampling.temperature))
