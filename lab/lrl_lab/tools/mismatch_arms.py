"""The mismatch tool's arms (``python -m lrl_lab.mismatch --arms ...``): one row per choice of numerics, each sampling
its own tokens with the KV-cache engine and rescoring them trainer-style in the same numerics, so one table says
what each choice removes: bf16 against fp16, an fp32 LM head, fp32 throughout, FP8-rounded weights.

An arm is (dtype of the weights, fp32 LM head or not, FP8 rounding or not). The engine decodes with a copy of the
model in that dtype; the trainer scores the engine's tokens with a copy in the same dtype, one full forward over
the right-padded batch. The FP8 arm samples with the rounded weights (fp32 arithmetic) and is scored by the fp32
trainer with the weights unrounded, as an FP8 sampler of a full-precision trainer is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from lrl.stats import band_shares, compare, kl_k3


@dataclass(frozen=True)
class Arm:
    dtype: torch.dtype
    fp32_head: bool = False
    fp8: bool = False
    label: str = ""


ARMS = {
    "fp32": Arm(torch.float32, label="fp32 engine vs fp32 trainer"),
    "bf16": Arm(torch.bfloat16, label="bf16 engine vs bf16 trainer"),
    "bf16-head": Arm(torch.bfloat16, fp32_head=True, label="bf16 + fp32 head, both sides"),
    "fp16": Arm(torch.float16, label="fp16 engine vs fp16 trainer"),
    "fp16-head": Arm(torch.float16, fp32_head=True, label="fp16 + fp32 head, both sides"),
    "fp8": Arm(torch.float32, fp8=True, label="FP8-rounded weights (fp32 decode) vs fp32 trainer"),
}


def arm_models(model, arm: Arm):
    """(engine, trainer) copies of the fp32 `model` in the arm's numerics."""
    from lrl.policy import with_fp32_head
    from lrl.samplers.fp8 import fp8_transform

    def cast(dtype):
        m = copy.deepcopy(model).to(dtype).eval()
        return with_fp32_head(m, model) if arm.fp32_head and dtype != torch.float32 else m

    if arm.fp8:
        engine = copy.deepcopy(model).eval()
        fp8_transform("none")(engine)
        return engine, model
    shared = cast(arm.dtype)  # the same weights on both sides: only the computation differs
    return shared, shared


def measure_arms(model, prompts, tok, args, names) -> dict[str, dict]:
    """Every arm of `names` on the same prompts and seed -> {name: mean, median, p99, max, over_cap, outside_band,
    kl_k3, nonfinite (tokens whose log-prob was not finite on either side), seconds}."""
    import time

    from lrl.kvcache import engine_generate
    from lrl.policy import continuation_log_probs

    kw = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    out = {}
    for name in names:
        start = time.perf_counter()
        engine, trainer = arm_models(model, ARMS[name])
        generator = torch.Generator().manual_seed(args.seed)
        ids, mu = engine_generate(engine, prompts, args.new_tokens, generator, tok.pad_id, **kw)
        batch = max(min(b if b > 0 else len(prompts) for b in args.trainer_batch), 1)
        logp = continuation_log_probs(trainer, prompts, ids, tok.pad_id, batch, args.temperature)
        d = (logp - mu).float()
        finite = torch.isfinite(d)
        kept = torch.where(finite, d, 0.0)
        out[name] = {
            "label": ARMS[name].label,
            **compare(kept, torch.zeros_like(kept), finite),
            **band_shares(kept, finite),
            "kl_k3": kl_k3(kept[finite]).item(),
            "nonfinite": int((~finite).sum()),
            "tokens": int(d.numel()),
            "seconds": time.perf_counter() - start,
        }
    return out


def arms_report(arms: dict[str, dict]) -> list[str]:
    """The arm table as lines: mean, p99 and max of |log pi - log mu|, shares over the TIS cap and outside the MIS
    band, k3 of KL(mu || pi)."""
    width = max(len(a["label"]) for a in arms.values()) + 2
    lines = [
        "",
        "arms: each samples its own tokens and is rescored trainer-style in the same numerics",
        f"{'arm':<{width}}{'mean|d|':>10}{'p99':>10}{'max':>10}{'over cap':>10}{'out band':>10}{'k3':>10}",
    ]
    for a in arms.values():
        note = f"  ({a['nonfinite']} of {a['tokens']} tokens not finite)" if a["nonfinite"] else ""
        lines.append(
            f"{a['label']:<{width}}{a['mean']:>10.2e}{a['p99']:>10.2e}{a['max']:>10.2e}{a['over_cap']:>10.4f}"
            f"{a['outside_band']:>10.4f}{a['kl_k3']:>10.2e}{note}"
        )
    return lines
