"""FP8 behavior weights: the trainer's weights rounded to float8 (e4m3) and back."""

from __future__ import annotations

import torch

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448


def round_fp8(tensor: torch.Tensor, scale: str = "none") -> torch.Tensor:
    """Round a tensor to float8_e4m3fn and back: plain cast, or scaled so that its absmax maps to 448.

    The scale is computed in float32 whatever the tensor's dtype: in float16 the 1e-12 floor would round to
    0 (an all-zero tensor would become NaN) and small absmax values would lose their scale.
    """
    if scale == "none":
        return tensor.to(torch.float8_e4m3fn).to(tensor.dtype)
    if scale == "tensor":
        x = tensor.float()
        s = x.abs().max().clamp(min=1e-12) / E4M3_MAX
        return ((x / s).to(torch.float8_e4m3fn).float() * s).to(tensor.dtype)
    raise ValueError(f"fp8 scale must be 'none' or 'tensor'; got {scale!r}")


def fp8_transform(scale: str = "none"):
    """An in-place transform that rounds every parameter of a model to FP8 (see round_fp8)."""

    @torch.no_grad()
    def apply(model: torch.nn.Module) -> None:
        for p in model.parameters():
            p.copy_(round_fp8(p, scale))

    return apply
