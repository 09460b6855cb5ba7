"""fp16's gradient against fp32's on a real model, with and without a loss scale: what the scale is for.

    python bench/fp16_gradients.py                        # SmolLM2-135M-Instruct, 8 rows of 96 tokens
    python bench/fp16_gradients.py --layers 2 --scales 1 4096 65536

One policy-gradient loss (random advantages on random token ids, the second half of each row scored) is taken
backward in fp32, under bf16 autocast and under fp16 autocast at each loss scale (the gradients divided by it
afterwards, as lrl.precision.LossScale does). For each arm: whether every gradient is finite, the share of gradient
entries that are exactly 0 where fp32's are not (flushed), and the relative error |g - g32| / |g32|, in float64.
Nothing is asserted: the figures are read side by side.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lrl.cli import OneLineParser  # noqa: E402


def gradient(model, ids, positions, advantage, precision: str, scale: float = 1.0) -> torch.Tensor:
    """The loss's gradient over every parameter, flattened, in float64 (divided by `scale`)."""
    from lrl.logprobs import token_log_probs
    from lrl.precision import autocast

    model.zero_grad()
    with autocast(precision):
        logp = token_log_probs(model, ids, torch.ones_like(ids), 1.0, positions=positions)
    loss = -(advantage[:, None] * logp * positions).sum() / positions.sum()
    (loss * scale).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).double() / scale


def main(argv=None) -> int:
    p = OneLineParser(prog="fp16_gradients.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a named model or a save_pretrained folder")
    p.add_argument("--layers", type=int, default=None, help="cut the model to its first N layers")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96, help="tokens a row; the second half is scored")
    p.add_argument("--scales", type=float, nargs="+", default=[1.0, 256.0, 4096.0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if min(args.rows, args.threads) < 1 or args.tokens < 2 or (args.layers is not None and args.layers < 1):
        p.error(
            "--rows, --threads and --layers must be at least 1, --tokens at least 2 (the second half is scored)"
        )
    if bad := [s for s in args.scales if not (math.isfinite(s) and s > 0)]:
        p.error(f"--scales: {bad[0]:g} is not allowed; a loss scale is a finite number above 0")
    from bench_real_model import machine, model_problem

    if problem := model_problem(args.model):
        p.error(problem)
    torch.set_num_threads(args.threads)
    from lrl.models import cut_down, is_named, resolve_model
    from lrl.policy import load_policy

    try:  # a wheel not installed, a folder of no model, more layers than it has: one line each
        path = resolve_model(args.model, verbose=False) if is_named(args.model) else Path(args.model)
        if args.layers:
            path = cut_down(path, args.layers)
        model = load_policy(str(path))[0].float().eval()
    except ValueError as err:
        p.error(f"--model: {err}")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.tokens), generator=gen)
    positions = torch.zeros(args.rows, args.tokens - 1, dtype=torch.bool)
    positions[:, args.tokens // 2 :] = True
    advantage = torch.randn(args.rows, generator=gen)
    print(f"machine: {machine()}")
    print(f"model: {path} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)")
    reference = gradient(model, ids, positions, advantage, "fp32")
    arms = [("bf16", 1.0)] + [("fp16", s) for s in args.scales]
    print(f"{'arm':<22}{'finite':>8}{'flushed':>12}{'rel. error':>12}")
    for precision, scale in arms:
        g = gradient(model, ids, positions, advantage, precision, scale)
        finite = bool(torch.isfinite(g).all())
        flushed = ((g == 0) & (reference != 0)).double().mean().item()
        error = ((g - reference).norm() / reference.norm()).item() if finite else float("nan")
        name = precision if precision == "bf16" else f"fp16, scale {scale:g}"
        print(f"{name:<22}{str(finite):>8}{flushed:>12.2e}{error:>12.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
