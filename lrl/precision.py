"""The arithmetic of the trainer and of the samplers that share its weights: fp32, or bf16 autocast.

``precision: auto`` takes bf16 for a real model (more than :data:`LARGE_MODEL` parameters) where the processor
computes bf16 natively (AMX or AVX512-BF16 on a CPU; a GPU that supports bf16), and fp32 otherwise: the
built-in policies of a hundred thousand weights gain nothing from it and keep their exact numbers. bf16 here
is autocast: matrix products in bf16, weights, gradients and the optimizer in fp32.

The same size rule picks the decode path of the samplers that use the trainer's weights (``decode: auto``):
a full forward per generated token is exact but costs the whole sequence every token, which for a real model
is minutes a step; a KV cache costs one position.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache

import torch

LARGE_MODEL = 10_000_000  # parameters: above this, auto means bf16 (where native) and the KV-cache decode


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@lru_cache(maxsize=1)
def cpu_bf16_features() -> tuple[str, ...]:
    """The CPU's native bf16 instruction sets found in /proc/cpuinfo (amx_bf16, avx512_bf16), in that order."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(name for name in ("amx_bf16", "avx512_bf16") if name in flags)
    except OSError:
        pass
    return ()


def accelerator_device(accelerator: str) -> str:
    """The torch device type a run's trainer computes on, for its --accelerator."""
    return "cuda" if accelerator == "gpu" else "cpu"


def native_bf16(device: torch.device | str = "cpu") -> bool:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(cpu_bf16_features())


def resolve_precision(setting: str, model, device: torch.device | str = "cpu") -> str:
    """'fp32' or 'bf16' for a precision setting ('auto', 'fp32', 'bf16') and a model (or its parameter count)."""
    if setting != "auto":
        return setting
    count = model if isinstance(model, int) else parameters(model)
    return "bf16" if count > LARGE_MODEL and native_bf16(device) else "fp32"


def resolve_decode(setting: str, model: torch.nn.Module) -> str:
    """'trainer' or 'kvcache' for a decode setting ('auto', 'trainer', 'kvcache') and a model."""
    if setting != "auto":
        return setting
    return "kvcache" if parameters(model) > LARGE_MODEL else "trainer"


def autocast(precision: str, device: torch.device | str = "cpu"):
    """The context a forward runs in: bf16 autocast, or nothing for fp32."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def describe(precision: str, device: torch.device | str = "cpu") -> str:
    """One line for the run's first lines: what the trainer computes in, and why."""
    if precision != "bf16":
        return "precision: fp32"
    device = torch.device(device)
    where = ", ".join(cpu_bf16_features()) if device.type == "cpu" else torch.cuda.get_device_name(device)
    return f"precision: bf16 autocast (fp32 weights and optimizer; native bf16 here: {where or 'none found'})"
