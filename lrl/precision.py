"""The arithmetic of the trainer and of the samplers that share its weights: fp32, or bf16 or fp16 autocast.

``precision: auto`` takes bf16 for a real model (more than :data:`LARGE_MODEL` parameters) where the processor
computes bf16 natively (AMX or AVX512-BF16 on a CPU; a GPU that supports bf16), and fp32 otherwise: the
built-in policies of a hundred thousand weights gain nothing from it and keep their exact numbers. bf16 here
is autocast: matrix products in bf16, weights, gradients and the optimizer in fp32. ``precision: fp16`` is the same
autocast in float16 (10 mantissa bits where bf16 has 7, and a range that ends at 65504): only where it is asked for,
and only where the device's autocast computes float16 (:func:`fp16_problem` tries it once).

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
def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "flags", ...; empty where there is none to read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():  # the end of the first processor's block
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags in /proc/cpuinfo (empty where there is none to read)."""
    return frozenset(cpu_info().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name in /proc/cpuinfo ("" where there is none to read)."""
    return cpu_info().get("model name", "")


def cpu_bf16_features() -> tuple[str, ...]:
    """The CPU's native bf16 instruction sets found in /proc/cpuinfo (amx_bf16, avx512_bf16), in that order."""
    return tuple(name for name in ("amx_bf16", "avx512_bf16") if name in cpu_flags())


def cpu_fp16_features() -> tuple[str, ...]:
    """The CPU's native fp16 arithmetic instruction sets found in /proc/cpuinfo (amx_fp16, avx512_fp16)."""
    return tuple(name for name in ("amx_fp16", "avx512_fp16") if name in cpu_flags())


def accelerator_device(accelerator: str) -> str:
    """The torch device type a run's trainer computes on, for its --accelerator."""
    return "cuda" if accelerator == "gpu" else "cpu"


def native_bf16(device: torch.device | str = "cpu") -> bool:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(cpu_bf16_features())


def resolve_precision(setting: str, model, device: torch.device | str = "cpu") -> str:
    """'fp32', 'bf16' or 'fp16' for a precision setting ('auto', 'fp32', 'bf16', 'fp16') and a model (or its
    parameter count); auto never picks fp16."""
    if setting != "auto":
        return setting
    count = model if isinstance(model, int) else parameters(model)
    return "bf16" if count > LARGE_MODEL and native_bf16(device) else "fp32"


def resolve_decode(setting: str, model: torch.nn.Module) -> str:
    """'trainer' or 'kvcache' for a decode setting ('auto', 'trainer', 'kvcache') and a model."""
    if setting != "auto":
        return setting
    return "kvcache" if parameters(model) > LARGE_MODEL else "trainer"


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device | str = "cpu"):
    """The context a forward runs in: bf16 or fp16 autocast, or nothing for fp32."""
    if precision not in AUTOCAST_DTYPES:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=AUTOCAST_DTYPES[precision])


@lru_cache(maxsize=4)
def fp16_problem(device_type: str = "cpu") -> str | None:
    """Why this device's autocast cannot run a run in fp16 (None: it can), found by trying it: a linear layer under
    float16 autocast must give float16 outputs that match the float16-rounded product, forward and backward."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return "precision: fp16 needs a GPU here, and torch sees none"
    try:
        gen = torch.Generator().manual_seed(0)  # its own stream: trying it draws nothing from the run's
        layer = torch.nn.Linear(64, 64, device="meta").to_empty(device=device_type)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(64, 64, generator=gen) / 8)
            layer.bias.copy_(torch.randn(64, generator=gen))
        x = torch.randn(8, 64, generator=gen).to(device_type)
        with torch.autocast(device_type=device_type, dtype=torch.float16):
            y = layer(x)
        y.float().sum().backward()
    except (RuntimeError, TypeError) as err:
        return f"precision: fp16 autocast does not run on this {device_type} with torch {torch.__version__} ({err})"
    rounded = x.half().float() @ layer.weight.half().float().T + layer.bias.half().float()
    if y.dtype != torch.float16:
        return f"precision: fp16 autocast on this {device_type} computes in {y.dtype}, not float16 (torch {torch.__version__})"
    if not torch.allclose(y.float(), rounded, atol=1e-2) or not torch.isfinite(layer.weight.grad).all():
        return (
            f"precision: fp16 autocast on this {device_type} gives wrong products (torch {torch.__version__})"
        )
    return None


class LossScale:
    """fp16's dynamic loss scale. float16 flushes numbers below 6e-8 to zero, and a backward in float16 flushes
    small gradients with them (on SmolLM2 under fp16 autocast, 3% of the gradient's entries where fp32 has none;
    at a scale of 2^12, 0.002%). The loss is multiplied by ``scale`` before its backward and the gradients divided
    by it before anything reads them; a non-finite gradient halves the scale and its minibatch is taken again (down
    to a scale of 1, where the numerical guard reports it), and every ``growth_every`` finite minibatches double
    it. Off (scale 1, nothing done) for fp32 and bf16, whose range is fp32's."""

    def __init__(self, enabled: bool, scale: float = 2.0**12, growth_every: int = 200):
        self.enabled = enabled
        self.scale = scale if enabled else 1.0
        self.growth_every = growth_every
        self.finite_in_a_row = 0

    def __call__(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to take the backward of."""
        return loss * self.scale if self.enabled else loss

    def unscale(self, parameters) -> bool:
        """Divide the gradients by the scale -> False when one is not finite and the scale was halved (take the
        minibatch again), True otherwise."""
        if not self.enabled:
            return True
        grads = [p.grad for p in parameters if p.grad is not None]
        for g in grads:
            g.div_(self.scale)
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True
        if finite:
            self.finite_in_a_row += 1
            if self.finite_in_a_row % self.growth_every == 0:
                self.scale *= 2
            return True
        self.finite_in_a_row = 0
        if self.scale <= 1.0:
            return True  # nothing left to halve: the guard reports the non-finite gradient
        self.scale /= 2
        return False


def describe(precision: str, device: torch.device | str = "cpu") -> str:
    """One line for the run's first lines: what the trainer computes in, and why."""
    device = torch.device(device)
    if precision == "fp16":
        native = device.type == "cuda" or "avx512_fp16" in cpu_fp16_features()
        speed = "" if native else "; no native fp16 arithmetic on this CPU: slower than bf16 and fp32"
        return f"precision: fp16 autocast (fp32 weights and optimizer, a dynamic loss scale{speed})"
    if precision != "bf16":
        return "precision: fp32"
    where = ", ".join(cpu_bf16_features()) if device.type == "cpu" else torch.cuda.get_device_name(device)
    return f"precision: bf16 autocast (fp32 weights and optimizer; native bf16 here: {where or 'none found'})"
