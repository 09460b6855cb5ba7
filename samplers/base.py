"""The behavior sampler: (which weights) x (what is done to them) x (how tokens are decoded).

A sampler keeps the last ``lag + 1`` versions of the policy's weights as CPU copies, samples with the
oldest of them, optionally transformed (rounded to FP8), and tags every generated token with its
log-prob under the distribution it was drawn from and with the version of the weights that drew it.
The trainer calls :meth:`BehaviorSampler.sync` after each update; that call is the weight sync.

Every sampler honours the same contract, the :class:`Sampler` Protocol: the stream asks it for episodes
(``sample``, ``decoder()``, ``behavior_version``, ``kept_versions``), the weight sync gives it the trainer's
weights (``setup``, ``sync``, ``close``), the checkpoint keeps its state (``state_dict``), and the mismatch
split and the memory plan read what it declares (``traits``, a :class:`Traits`: what it does to the trainer's
weights before sampling, and the copies it keeps). Nothing asks a sampler its name or class.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import torch

from lrl.decoding import Decoder, Sampling, TrainerStyleDecoder, TurnEngine
from lrl.precision import autocast, resolve_decode, resolve_precision
from lrl.rollout import Episode, run_episodes

Transform = Callable[[torch.nn.Module], None]


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's weights (kept off the accelerator)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@dataclass(frozen=True)
class Traits:
    """What a behavior sampler declares about itself. First the transforms between the trainer's weights and the
    tokens it samples, which the mismatch split undoes one at a time (``callbacks/mismatch_split.py``): how stale
    its weights are, what is done to them (rounding), how it decodes and in which arithmetic. Then the copies it
    keeps in the process that holds it, which the memory plan of a synchronous run counts (``lrl/budget.py``)."""

    sampling: Sampling  # the distribution it draws from: temperature, top-k, top-p
    staleness: int = 0  # most updates its weights trail the trainer's (lag; pushed every k updates: + k - 1)
    transform: Transform | None = None  # done in place to its copy of those weights (FP8 rounding), or None
    decode: str = "trainer"  # 'trainer' (full forwards), 'kvcache' (a KV cache) or 'auto' (by model size)
    dtype: torch.dtype = torch.float32  # of its copy of the weights
    precision: str = "fp32"  # the autocast it decodes under: 'fp32', 'bf16', 'fp16' or 'auto' (by model size)
    bytes_per_parameter: int = 0  # its copies of the weights (versions, behavior model), bytes a parameter
    extra_bytes: int = 0  # what it holds whatever the model's size (an engine's KV cache)

    def kept_bytes(self, parameters: int) -> int:
        """The memory its copies take beside the trainer's, for a policy of `parameters` parameters."""
        return self.bytes_per_parameter * parameters + self.extra_bytes


@dataclass(frozen=True)
class SamplerArguments:
    """What a sampler is built from and its traits are declared from, spelled once for both: each sampler class
    names its own (its ``Arguments``, a frozen dataclass of its constructor's arguments after ``tok``, in their
    order). The constructor takes those fields, by position or name, or one such object; :meth:`~BehaviorSampler.
    declare` takes the object. A ``sampling`` of None is the default distribution."""

    def __post_init__(self):
        if hasattr(self, "sampling") and self.sampling is None:
            object.__setattr__(self, "sampling", Sampling())


def given(kind: type[SamplerArguments], args: tuple, kwargs: dict) -> SamplerArguments:
    """The `kind` of arguments a call gives: one such object, or its fields by position or name."""
    if len(args) == 1 and not kwargs and isinstance(args[0], kind):
        return args[0]
    return kind(*args, **kwargs)


@dataclass(frozen=True)
class OnPolicyArguments(SamplerArguments):
    """The trainer's own weights and module, drawn from `sampling`, decoded by `decode` under `precision`."""

    sampling: Sampling | None = None  # the distribution it draws from
    decode: str = "trainer"  # 'trainer', 'kvcache' or 'auto' (resolved for the model at setup)
    precision: str = "fp32"  # the trainer's: 'fp32', 'bf16', 'fp16' or 'auto' (resolved at setup)


@dataclass(frozen=True)
class LaggedArguments(SamplerArguments):
    """The weights `lag` updates old (the oldest of the last lag + 1 versions), `transform`-ed (FP8 rounding)."""

    lag: int = 0
    transform: Transform | None = None
    sampling: Sampling | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.lag < 0:
            raise ValueError(f"lag must be >= 0; got {self.lag}")


@dataclass(frozen=True)
class BehaviorArguments(LaggedArguments):
    """Those weights decoded by `decode` under `precision`, as :class:`OnPolicyArguments`."""

    decode: str = "trainer"
    precision: str = "fp32"


class Sampler(Protocol):
    """What the stream, the weight sync, the checkpoint, the mismatch split and the memory plan need of a behavior
    sampler (see the module docstring). :class:`BehaviorSampler` has it all; a sampler that differs overrides what
    differs."""

    name: str  # its registered name (set by lrl.samplers.make_sampler)

    def setup(self, policy: torch.nn.Module, version: int = 0) -> None:
        """Attach to the trainer's policy at `version`, before the first batch (start an engine, if any)."""

    def sync(self, policy: torch.nn.Module, version: int) -> None:
        """The weight sync: the trainer's weights after an update, as `version`."""

    def close(self) -> None:
        """Let go of what it holds outside this process's memory (an engine); safe to call more than once."""

    def decoder(self) -> Decoder | TurnEngine:
        """The decode path over its behavior weights, which the episode loop (``lrl.rollout``) drives."""

    def sample(self, tasks: Sequence, generator: torch.Generator, spec, **engine) -> list[Episode]:
        """One episode per task in the environment `spec` (each env made with ``spec.make()``), every action token
        tagged with :attr:`behavior_version` and its log-prob under the distribution it was drawn from."""

    @property
    def behavior_version(self) -> int:
        """The version of the weights it samples with now."""

    @property
    def kept_versions(self) -> list[int]:
        """The versions whose weights it keeps (the oldest is the one it samples with)."""

    @property
    def traits(self) -> Traits:
        """What it does to the trainer's weights before sampling, and the copies it keeps (see :class:`Traits`)."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of it (its kept versions), saved once with the trainer."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (after :meth:`setup`)."""


class BehaviorSampler:
    """Samples episodes with the policy `lag` versions old, optionally transformed, decoded trainer-style."""

    name = "custom"

    Arguments: type[SamplerArguments] = BehaviorArguments

    def __init__(self, tok, *args, **kwargs):
        """`args`, `kwargs`: the fields of the class's ``Arguments`` (by position or name), or one such object;
        each field becomes an attribute of the same name."""
        arguments = given(self.Arguments, args, kwargs)
        vars(self).update((f.name, getattr(arguments, f.name)) for f in fields(arguments))
        self.tok = tok
        self.versions: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=self.lag + 1)
        self.behavior: torch.nn.Module | None = None
        self.policy: torch.nn.Module | None = None

    @property
    def arguments(self) -> SamplerArguments:
        """Its arguments as they stand now (after :meth:`setup`, decode and precision resolved for the model)."""
        return self.Arguments(**{f.name: getattr(self, f.name) for f in fields(self.Arguments)})

    @classmethod
    def declare(cls, arguments: BehaviorArguments) -> Traits:
        """The traits of the sampler `arguments` build, known before it is built: the weights `lag` updates old,
        `transform`-ed, decoded by `decode` under `precision`; it keeps lag + 1 versions and the behavior model
        (fp32 copies)."""
        a = arguments
        copies = 4 * (a.lag + 2)
        return Traits(
            a.sampling, a.lag, a.transform, a.decode, precision=a.precision, bytes_per_parameter=copies
        )

    @property
    def traits(self) -> Traits:
        return self.declare(self.arguments)

    def resolve(self, policy: torch.nn.Module) -> None:
        """Fix the decode path and the arithmetic for this model (their 'auto' depends on its size)."""
        self.decode = resolve_decode(self.decode, policy)
        self.precision = resolve_precision(self.precision, policy)

    # -- weight sync ---------------------------------------------------------------------------------
    def setup(self, policy: torch.nn.Module, version: int = 0) -> None:
        """Attach to the trainer's policy at `version` (before the first step)."""
        self.resolve(policy)
        self.policy = policy
        self.behavior = copy.deepcopy(policy).to("cpu").eval()
        self.versions.clear()
        self.sync(policy, version)

    def sync(self, policy: torch.nn.Module, version: int) -> None:
        """Receive the trainer's weights after an update: keep them, load the oldest kept version."""
        self.versions.append((version, cpu_state(policy)))
        self._load_oldest()

    def _load_oldest(self) -> None:
        self.behavior.load_state_dict(self.versions[0][1])
        if self.transform is not None:
            self.transform(self.behavior)

    @property
    def behavior_version(self) -> int:
        return self.versions[0][0]

    @property
    def kept_versions(self) -> list[int]:
        return [v for v, _ in self.versions]

    # -- sampling ------------------------------------------------------------------------------------
    def decoder(self):
        """The decode path of the behavior model: trainer-style full forwards, or a KV cache."""
        return decoder_for(self.behavior, self.tok.pad_id, self.decode)

    def sample(self, tasks: Sequence, generator: torch.Generator, spec, **engine) -> list[Episode]:
        """One episode per task in the environment `spec`, tagged with the behavior version and log-probs;
        ``engine`` holds the episode loop's options (``slots``, ``tools``: see ``lrl.rollout.run_episodes``)."""
        with autocast(self.precision if self.precision in ("fp32", "bf16", "fp16") else "fp32"):
            return run_episodes(
                self.decoder(), spec, tasks, generator, self.sampling, self.behavior_version, **engine
            )

    def close(self) -> None:
        """Let go of what the sampler holds outside this process's memory (an engine's); nothing here."""

    # -- checkpointing -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"versions": list(self.versions)}

    def load_state_dict(self, state: dict) -> None:
        self.versions.clear()
        self.versions.extend(state["versions"])
        self._load_oldest()


class OnPolicySampler(BehaviorSampler):
    """Samples with the trainer's own module, so sampler and trainer log-probs agree exactly."""

    name = "onpolicy"

    Arguments = OnPolicyArguments
    lag = 0  # the trainer's weights as they are: no older version, nothing done to them
    transform = None

    def __init__(self, tok, *args, **kwargs):
        super().__init__(tok, *args, **kwargs)
        self.version = 0

    @classmethod
    def declare(cls, arguments: OnPolicyArguments) -> Traits:
        """The trainer's own weights and module: no staleness, no transform, no copy."""
        return Traits(arguments.sampling, decode=arguments.decode, precision=arguments.precision)

    def setup(self, policy, version: int = 0) -> None:
        self.resolve(policy)
        self.policy = policy
        self.version = version

    def sync(self, policy, version: int) -> None:
        self.policy = policy
        self.version = version

    @property
    def behavior_version(self) -> int:
        return self.version

    @property
    def kept_versions(self) -> list[int]:
        return [self.version]

    def decoder(self):
        return decoder_for(self.policy, self.tok.pad_id, self.decode)

    def sample(self, tasks: Sequence, generator: torch.Generator, spec, **engine) -> list[Episode]:
        """Sample with the trainer's module in eval mode for the whole rollout, then restore its mode."""
        was_training = self.policy.training
        self.policy.eval()
        try:
            return super().sample(tasks, generator, spec, **engine)
        finally:
            self.policy.train(was_training)

    def state_dict(self) -> dict:
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]


def decoder_for(model: torch.nn.Module, pad_id: int, decode: str):
    """A decoder over `model`: 'trainer' (full forwards) or 'kvcache' (lrl.kvcache)."""
    if decode == "kvcache":
        from lrl.kvcache import KVCacheDecoder

        return KVCacheDecoder(model, pad_id)
    return TrainerStyleDecoder(model, pad_id)
