"""The engine-style sampler: the decode path of an inference engine (KV cache, its own dtype), any causal LM.

The weights are a **copy in the engine's own dtype** (float32, bfloat16 or float16), refreshed at every
weight sync, optionally rounded to FP8 and optionally ``lag`` versions old (the other two sampler axes).
Each token is drawn from that step's logits normalised in fp32 at the sampling temperature, optionally
truncated by top-k / top-p; the recorded log-prob is that of the truncated, renormalised distribution the
token was actually drawn from (mu). The decode path itself is ``lrl.kvcache``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from lrl.kvcache import KVCacheDecoder, cache_argument
from lrl.samplers.base import BehaviorSampler, LaggedArguments, Traits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def engine_dtype(name: str | torch.dtype) -> torch.dtype:
    """An engine dtype by name ('float32', 'bfloat16', 'float16') -> torch.dtype; anything else is an error."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name not in DTYPES:
        raise ValueError(f"engine dtype {name!r} is not supported; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def check_device(device: str | torch.device, dtype: torch.dtype) -> torch.device:
    """Raise ValueError for a device that is absent or cannot compute in `dtype` at all -> torch.device."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for but CUDA is not available; use --device cpu")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"engine dtype bfloat16 is not supported by {torch.cuda.get_device_name(device)}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device} is not supported by the engine; use cpu or cuda")
    return device


def check_device_dtype(model, device: str | torch.device, dtype: torch.dtype) -> None:
    """Raise ValueError when `device` cannot run `model` in `dtype` (checked with a one-token forward)."""
    device = check_device(device, dtype)
    try:
        with torch.no_grad():
            probe = torch.zeros((1, 1), dtype=torch.long, device=device)
            logits = model(input_ids=probe, attention_mask=torch.ones_like(probe)).logits
    except (RuntimeError, NotImplementedError, TypeError) as err:
        raise ValueError(f"the model cannot run in {dtype} on {device}: {err}") from None
    if not torch.isfinite(logits.float()).all():
        raise ValueError(f"the model gives non-finite logits in {dtype} on {device}")


@dataclass(frozen=True)
class EngineArguments(LaggedArguments):
    """Those weights decoded on the engine path: a copy in `dtype` (a name, made a torch.dtype here) on `device`,
    its KV cache kept between calls where `reuse_cache`."""

    dtype: str | torch.dtype = "float32"
    device: str | torch.device = "cpu"
    reuse_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "dtype", engine_dtype(self.dtype))


class EngineSampler(BehaviorSampler):
    """Behavior sampler on the engine decode path: its own dtype and device, KV cache, top-k/top-p.

    Composes with the other two axes: ``lag`` picks the weights (the oldest of the last lag + 1 versions)
    and ``transform`` (e.g. FP8 rounding) is applied to the engine's copy after it is cast to `dtype`.
    """

    name = "engine"
    Arguments = EngineArguments
    decode = "kvcache"  # its own decode path (decoder), in fp32 arithmetic over its copy in `dtype`
    precision = "fp32"

    def __init__(self, tok, *args, **kwargs):
        super().__init__(tok, *args, **kwargs)
        self.device = check_device(self.device, self.dtype)

    @classmethod
    def declare(cls, arguments: EngineArguments) -> Traits:
        """The weights `lag` updates old, `transform`-ed, decoded with a KV cache in `dtype` (fp32 arithmetic
        otherwise); it keeps lag + 1 fp32 versions and the engine's copy in `dtype`."""
        a = arguments
        copies = 4 * (a.lag + 1) + a.dtype.itemsize
        return Traits(a.sampling, a.lag, a.transform, "kvcache", a.dtype, bytes_per_parameter=copies)

    def setup(self, policy: torch.nn.Module, version: int = 0) -> None:
        """Attach to the trainer's policy: a copy of it in the engine's dtype and on its device."""
        cache_argument(policy)
        self.policy = policy
        self.behavior = copy.deepcopy(policy).to(device=self.device, dtype=self.dtype).eval()
        check_device_dtype(self.behavior, self.device, self.dtype)
        self.versions.clear()
        self.sync(policy, version)

    def decoder(self) -> KVCacheDecoder:
        """The engine decode path over the behavior copy: KV cache, one decode step per token."""
        return KVCacheDecoder(self.behavior, self.tok.pad_id, self.reuse_cache)
