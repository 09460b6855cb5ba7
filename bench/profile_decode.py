"""Where a decode step of lrl's KV-cache engine spends its time on a real model: torch's profiler over one sampling.

    python bench/profile_decode.py                        # SmolLM2-135M-Instruct, batch 32, bf16, 32 new tokens
    python bench/profile_decode.py --batch 64 --dtype fp32

One warm-up sampling, then one under ``torch.profiler``; the operators' own (self) CPU time is summed into groups:
matrix products (``mm``, ``addmm``, ``bmm``, ``matmul`` and their kind), attention's other operators (softmax,
the cache's copies and concatenations), element-wise arithmetic (norms, activations, rotary embeddings, casts),
the draw (``sort``, ``cumsum``, ``searchsorted`` and the other sampling operators), and the rest. Beside them: the
wall time, the share of it no operator accounts for (Python and the framework between operators), the operator
calls per decoded token (a token of one row), and what the same matrix products take on their own at the model's
shapes (the floor of a decode step on this machine: weights read once per step, at batch B). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lrl.cli import OneLineParser  # noqa: E402

GROUPS = {
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"),
    "attention, other": ("aten::_softmax", "aten::softmax", "aten::cat", "aten::copy_", "aten::index_copy_",
                         "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
    "draw": ("aten::sort", "aten::cumsum", "aten::searchsorted", "aten::multinomial", "aten::exp", "aten::rand",
             "aten::uniform_", "aten::log_softmax", "aten::_log_softmax", "aten::gather"),
}  # fmt: skip


def group_of(name: str) -> str:
    for group, names in GROUPS.items():
        if name in names:
            return group
    return "element-wise and the rest"


def linear_floor(model, batch: int, repeats: int = 20) -> float:
    """Seconds of one decode step's matrix products alone: every Linear of the model (and the LM head) applied
    to a [batch, in] input of the model's dtype, in the model's order."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head = model.get_output_embeddings()
    if head is not None and head not in layers:
        layers.append(head)
    dtype = next(model.parameters()).dtype
    inputs = [torch.randn(batch, m.in_features, dtype=dtype) for m in layers]
    with torch.no_grad():
        for m, x in zip(layers, inputs):
            m(x)
        start = time.perf_counter()
        for _ in range(repeats):
            for m, x in zip(layers, inputs):
                m(x)
    return (time.perf_counter() - start) / repeats


def main(argv=None) -> int:
    p = OneLineParser(
        prog="profile_decode.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m", help="a named model or a save_pretrained folder")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.batch < 1 or args.new_tokens < 1 or args.threads < 1:
        p.error("--batch, --new-tokens and --threads must be at least 1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_real_model import load_checked, machine, model_problem, prompts_of

    if problem := model_problem(args.model):
        p.error(problem)
    torch.set_num_threads(args.threads)
    from lrl.kvcache import engine_generate

    model, tok = load_checked(p, args.model)
    if args.dtype == "bf16":
        model = copy.deepcopy(model).to(torch.bfloat16)
    prompts = prompts_of(tok, args.batch)
    gen = torch.Generator().manual_seed(0)
    print(f"machine: {machine()}")
    print(f"model: {args.model}, batch {args.batch}, {args.new_tokens} new tokens, {args.dtype} weights")
    with torch.no_grad():
        engine_generate(model, prompts, args.new_tokens, gen, tok.pad_id)  # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            engine_generate(model, prompts, args.new_tokens, gen, tok.pad_id)
            wall = time.perf_counter() - start
    seconds, calls = defaultdict(float), defaultdict(int)
    top = []
    for e in prof.key_averages():
        seconds[group_of(e.key)] += e.self_cpu_time_total / 1e6
        calls[group_of(e.key)] += e.count
        top.append((e.self_cpu_time_total / 1e6, e.count, e.key))
    covered = sum(seconds.values())
    print(f"\nwall {wall:.3f} s for {args.batch * args.new_tokens} tokens ({args.batch * args.new_tokens / wall:.1f} "
          "tokens/s; the profiler's own overhead included)")  # fmt: skip
    print(f"{'group':<28}{'seconds':>9}{'share':>8}{'calls':>9}")
    for group in (*GROUPS, "element-wise and the rest"):
        print(f"{group:<28}{seconds[group]:>9.3f}{seconds[group] / wall:>8.1%}{calls[group]:>9}")
    print(f"{'between operators':<28}{wall - covered:>9.3f}{(wall - covered) / wall:>8.1%}")
    print(f"operator calls per decode step: {sum(calls.values()) / args.new_tokens:.0f}")
    print("\nthe ten operators of most self time:")
    for s, n, key in sorted(top, reverse=True)[:10]:
        print(f"  {key:<48}{s:>8.3f} s{n:>8} calls")
    floor = linear_floor(model, args.batch)
    print(f"\nthe model's matrix products alone at batch {args.batch}: {floor * 1e3:.1f} ms a decode step; the "
          f"sampling took {wall / args.new_tokens * 1e3:.1f} ms a new token (prefill included)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
