"""The behavior sampler: (which weights) x (what is done to them) x (how tokens are decoded).

A sampler keeps the last ``lag + 1`` versions of the policy's weights as CPU copies, samples with the
oldest of them, optionally transformed (rounded to FP8), and tags every generated token with its
log-prob under the distribution it was drawn from and with the version of the weights that drew it.
The trainer calls :meth:`BehaviorSampler.sync` after each update; that call is the weight sync.

Every sampler honours the same contract: ``setup``, ``sync``, ``decoder()`` (an ``lrl.decoding.Decoder``
over its behavior weights), ``sample(tasks, generator, spec)`` (one episode per task in the environment
``spec``), ``behavior_version``, ``kept_versions``, ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence

import torch

from lrl.decoding import Sampling, TrainerStyleDecoder
from lrl.precision import autocast, resolve_decode, resolve_precision
from lrl.rollout import Episode, run_episodes

Transform = Callable[[torch.nn.Module], None]


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's weights (kept off the accelerator)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class BehaviorSampler:
    """Samples episodes with the policy `lag` versions old, optionally transformed, decoded trainer-style."""

    name = "custom"

    def __init__(
        self,
        tok,
        lag: int = 0,
        transform: Transform | None = None,
        sampling: Sampling | None = None,
        decode: str = "trainer",
        precision: str = "fp32",
    ):
        if lag < 0:
            raise ValueError(f"lag must be >= 0; got {lag}")
        self.tok = tok
        self.lag = lag
        self.transform = transform
        self.sampling = sampling or Sampling()
        self.decode = decode  # 'trainer', 'kvcache' or 'auto' (resolved for the model at setup)
        self.precision = precision  # the trainer's: 'fp32', 'bf16', 'fp16' or 'auto' (resolved at setup)
        self.versions: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=lag + 1)
        self.behavior: torch.nn.Module | None = None
        self.policy: torch.nn.Module | None = None

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

    def __init__(
        self, tok, sampling: Sampling | None = None, decode: str = "trainer", precision: str = "fp32"
    ):
        super().__init__(tok, 0, None, sampling, decode, precision)
        self.version = 0

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
