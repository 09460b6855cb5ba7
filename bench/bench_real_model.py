"""Speed on a real model, beside the machine's own limit: ratios from one run, the machine named.

    python bench/bench_real_model.py                       # SmolLM2-135M-Instruct, two torch threads
    python bench/bench_real_model.py --batches 1 32 --skip-vllm --threads 1
    python bench/bench_real_model.py --batches 32 --skip-training --dtypes fp32   # decode beside vLLM, fp32

1. The limit: GEMM throughput of this machine in fp32 and bf16 (GFLOP/s), at the model's own shapes (a batch of
   tokens times its 576 x 1536 MLP) and at 2048 x 2048.
2. Decode: tokens/s sampling 32 new tokens after the gym's chat prompts (their prefill included) at batch 1, 32
   and 64, by lrl's KV-cache engine, transformers' generate and vLLM on this CPU (where installed), each in every
   dtype of ``--dtypes`` (fp32, and bf16 where the CPU has it natively: emulated bf16 is no one's choice); each
   beside the GFLOP/s it reaches (2 x parameters x tokens, the LM head included) and that figure's share of the
   machine's GEMM limit in the same dtype.
3. Training: tokens/s of forward + backward + Adam over 16 sequences of 128 tokens (the log-probs through the
   head in chunks, lrl.logprobs), in fp32 and under bf16 autocast; GFLOP/s at 6 x parameters x tokens.
4. Weight sync: seconds to load the trainer's weights into the engine's bf16 copy, and into vLLM in place.

Nothing is asserted: the figures are for reading, in the same run, one against the other.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lrl.cli import OneLineParser  # noqa: E402


def machine() -> str:
    from lrl.precision import cpu_bf16_features, cpu_model

    name = cpu_model() or platform.processor() or "?"
    feats = ", ".join(cpu_bf16_features()) or "no native bf16"
    return f"{name}, {os.cpu_count()} cores ({feats}), torch {torch.__version__}, {torch.get_num_threads()} threads"


def gemm(m: int, k: int, n: int, dtype, seconds: float = 1.5) -> float:
    """GFLOP/s of [m, k] x [k, n] in `dtype`, repeated for about `seconds`."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * m * k * n * count / (time.perf_counter() - start) / 1e9


def best(fn, repeats: int, warm_up: bool = True) -> float:
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def prompts_of(tok, n: int) -> list[list[int]]:
    from lrl.envs.tinyagent import make_tasks
    from lrl_lab.tools.mismatch import gym_prompts

    base = gym_prompts(tok, make_tasks("all"))
    return [base[i % len(base)] for i in range(n)]


def hf_generate(model, prompts, new_tokens: int, pad_id: int):
    ids = torch.full((len(prompts), max(map(len, prompts))), pad_id, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, ids.shape[1] - len(p) :] = torch.as_tensor(p)
    mask = (ids != pad_id).long()
    for row, p in enumerate(prompts):
        mask[row, ids.shape[1] - len(p) :] = 1
    with torch.no_grad():
        model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, pad_token_id=pad_id,
        )  # fmt: skip


def decode_rows(model, tok, batches, new_tokens, repeats, skip_vllm, limits):
    from lrl.kvcache import engine_generate

    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 2 * params
    models = {"fp32": model, "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    models = {d: m for d, m in models.items() if d in limits}
    rows = []
    for b in batches:
        prompts = prompts_of(tok, b)
        tokens = b * new_tokens
        for dtype, m in models.items():
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                s = best(lambda m=m: engine_generate(m, prompts, new_tokens, gen, tok.pad_id), repeats)  # noqa: B023
            rows.append(
                (f"lrl engine {dtype}", b, tokens / s, tokens * flops_per_token / s / 1e9, limits[dtype])
            )
            s = best(lambda m=m: hf_generate(m, prompts, new_tokens, tok.pad_id), repeats)  # noqa: B023
            rows.append((f"transformers generate {dtype}", b, tokens / s, tokens * flops_per_token / s / 1e9,
                         limits[dtype]))  # fmt: skip
        if not skip_vllm:
            for dtype, limit in limits.items():
                rows += vllm_rows(model, prompts, new_tokens, repeats, flops_per_token, limit, b, dtype)
    return rows


def vllm_rows(model, prompts, new_tokens, repeats, flops_per_token, limit, b, dtype="bf16"):
    from lrl.samplers.vllm import vllm_missing

    if vllm_missing():
        return []
    from lrl_lab.tools.mismatch_engines import VLLMScorer

    name = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    args = argparse.Namespace(
        vllm_kv_cache=512, vllm_dtype=name, engine_dtype=name, seed=0, temperature=1.0,
        top_p=1.0, top_k=0, new_tokens=new_tokens,
    )  # fmt: skip
    scorer = VLLMScorer(model, args, max(map(len, prompts)))
    try:
        s = best(lambda: scorer.generate(prompts, batch=len(prompts)), repeats)
    finally:
        scorer.close()
    tokens = len(prompts) * new_tokens
    return [(f"vllm (CPU) {dtype}", b, tokens / s, tokens * flops_per_token / s / 1e9, limit)]


def training_rows(model, repeats, limits):
    from lrl.logprobs import token_log_probs
    from lrl.precision import autocast

    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (16, 128), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    positions = torch.zeros(16, 127, dtype=torch.bool)
    positions[:, 64:] = True  # half the positions are actions, as in an agent episode
    rows = []
    for precision in limits:
        net = copy.deepcopy(model).train()
        opt = torch.optim.Adam(net.parameters(), lr=1e-7)

        def step(net=net, opt=opt, precision=precision):
            with autocast(precision):
                logp = token_log_probs(net, ids, mask, positions=positions)
            (-(logp * positions).sum() / positions.sum()).backward()
            opt.step()
            opt.zero_grad()

        s = best(step, repeats)
        tokens = ids.numel()
        rows.append(
            (f"train step {precision}", 16, tokens / s, 6 * params * tokens / s / 1e9, limits[precision])
        )
    return rows


def sync_rows(model, skip_vllm):
    engine = copy.deepcopy(model).to(torch.bfloat16)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    s = best(lambda: engine.load_state_dict(state), 3)
    rows = [("lrl engine bf16 copy", s)]
    from lrl.samplers.vllm import vllm_missing

    if not skip_vllm and not vllm_missing():
        from lrl.samplers.vllm import VLLMSampler

        class Tok:
            eos_id = -1

        sampler = VLLMSampler(Tok(), dtype="bfloat16", kv_cache_mib=256, seed=0, max_model_len=512)
        sampler.setup(model, 0)
        try:
            s = best(lambda: sampler.sync(model, 1), 3)
        finally:
            sampler.close()
        rows.append(("vllm in place (bf16)", s))
    return rows


def model_problem(value: str) -> str | None:
    """Why a bench's --model cannot be a model, told before anything loads (None: a named model or a folder, which
    the load then reads; :func:`load_checked` turns what it finds wrong there into one line too)."""
    from lrl.models import NAMED_MODELS, is_named

    if is_named(value) or Path(value).is_dir():
        return None
    return f"--model: {value!r} is neither a named model ({', '.join(NAMED_MODELS)}) nor a folder"


def load_checked(parser, value: str, device: str = "cpu"):
    """lrl_lab.tools.mismatch.load_model(value, device), where a model that cannot be loaded (a wheel not installed,
    a folder that holds no model) ends the bench with the parser's one line, not a traceback."""
    from lrl_lab.tools.mismatch import load_model

    try:
        return load_model(value, device)
    except ValueError as err:  # ModelUnavailable, ModelLoadError: each names the model and what is wrong
        parser.error(f"--model: {err}")


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_real_model.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 64])
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument(
        "--dtypes", nargs="+", choices=("fp32", "bf16"), default=None,
        help="the arithmetic of every path (default: fp32, and bf16 where the CPU has it natively)",
    )  # fmt: skip
    p.add_argument("--skip-training", action="store_true", help="decode only")
    args = p.parse_args(argv)
    if min(args.threads, args.new_tokens, args.repeats, *args.batches) < 1:
        p.error("--threads, --batches, --new-tokens and --repeats must be at least 1")
    if problem := model_problem(args.model):
        p.error(problem)
    torch.set_num_threads(args.threads)
    model, tok = load_checked(p, args.model)
    params = sum(q.numel() for q in model.parameters())
    print(f"machine: {machine()}")
    print(f"model: {args.model}, {params / 1e6:.1f}M parameters")
    from lrl.precision import native_bf16

    dtypes = args.dtypes or (["fp32", "bf16"] if native_bf16("cpu") else ["fp32"])
    kinds = {"fp32": torch.float32, "bf16": torch.bfloat16}
    limits = {d: gemm(2048, 576, 1536, kinds[d]) for d in dtypes}
    square = {d: gemm(2048, 2048, 2048, kinds[d]) for d in dtypes}
    print("GEMM limit, [2048 x 576] x [576 x 1536]: " + ", ".join(f"{d} {v:.0f} GFLOP/s" for d, v in limits.items())
          + "; 2048^3: " + ", ".join(f"{d} {v:.0f}" for d, v in square.items()))  # fmt: skip
    print(f"\n{'path':<28}{'batch':>6}{'tokens/s':>11}{'GFLOP/s':>10}{'of limit':>10}", flush=True)
    rows = [] if args.skip_training else training_rows(model, args.repeats, limits)
    for row in rows:
        print(f"{row[0]:<28}{row[1]:>6}{row[2]:>11.1f}{row[3]:>10.1f}{row[3] / row[4]:>10.1%}", flush=True)
    decoded = decode_rows(model, tok, args.batches, args.new_tokens, args.repeats, args.skip_vllm, limits)
    for name, b, tps, gflops, limit in decoded:
        print(f"{name:<28}{b:>6}{tps:>11.1f}{gflops:>10.1f}{gflops / limit:>10.1%}", flush=True)
    train = {r[0]: r[2] for r in rows if r[0].startswith("train")}
    if "train step bf16" in train and "train step fp32" in train:
        print(f"\ntraining, bf16 autocast / fp32: {train['train step bf16'] / train['train step fp32']:.2f}x")
    print("\nweight sync of the whole model:")
    for name, s in sync_rows(model, args.skip_vllm):
        print(f"  {name:<26}{s:8.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
