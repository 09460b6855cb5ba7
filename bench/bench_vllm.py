"""Benchmark the vLLM sampler against the built-in samplers and transformers' generate, ratios from one run.

    python bench/bench_vllm.py [--repeats 3] [--shapes tiny mini] [--sync-shapes tiny mini qwen3-0.6b]

1. Episodes: 64 TinyAgent episodes (8 tasks x 8) sampled by the on-policy sampler (trainer-style decoding), the
   engine sampler (lrl's KV-cache imitation) and the vLLM sampler on the TinyAgent policy: episodes/s and
   generated tokens/s, mean over repeats after one warm-up.
2. Fixed-length generation: 32 prompts x 32 new tokens with transformers' ``generate`` (sampling, KV cache),
   lrl's ``engine_generate`` and vLLM, on the TinyAgent policy and on a randomly initialised Qwen3 with Qwen3's
   layer shape (hidden 1024, 16 heads of 128; ``mini``: 4 layers, a 32k vocabulary): tokens/s.
3. Weight sync: milliseconds per in-place update of the vLLM engine (median of 5) against parameter count.

The machine is shared and noisy: read the ratios between rows of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lrl.cli import OneLineParser  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def episodes_rows(repeats: int) -> list[tuple[str, float, float]]:
    import torch

    from lrl.envs.tinyagent import tinyagent_spec
    from lrl.samplers import EngineSampler, OnPolicySampler, VLLMSampler

    spec = tinyagent_spec()
    policy = spec.warm_start().eval()
    tasks = [t for t in spec.train_tasks[:8] for _ in range(8)]
    rows = []
    for name, sampler in [
        ("onpolicy (trainer-style)", OnPolicySampler(spec.tok)),
        ("engine (lrl KV cache)", EngineSampler(spec.tok)),
        ("vllm", VLLMSampler(spec.tok)),
    ]:
        sampler.setup(policy, 0)
        made = []

        def run(sampler=sampler, made=made):
            made[:] = sampler.sample(tasks, torch.Generator().manual_seed(0), spec)

        seconds = statistics.fmean(timed(run, repeats))
        tokens = sum(e.action_tokens for e in made)
        rows.append((name, len(made) / seconds, tokens / seconds))
        getattr(sampler, "close", lambda: None)()
    return rows


def generation_rows(shape: str, repeats: int) -> list[tuple[str, float]]:
    import torch

    from lrl.envs.tinyagent import build_tokenizer, make_tasks
    from lrl.kvcache import engine_generate
    from lrl.samplers import VLLMSampler
    from lrl_lab.tools.mismatch import gym_prompts, random_model

    tok = build_tokenizer(make_tasks("all"))
    if shape == "tiny":
        from lrl.envs.tinyagent.base import make_rl_base

        model = make_rl_base(tok)
    else:
        model = random_model("qwen3-mini" if shape == "mini" else shape)
    prompts = gym_prompts(tok, make_tasks("all"))[:30]
    prompts += prompts[:2]
    n = 32
    out = []
    generated = len(prompts) * n
    # transformers generate needs one padded batch: left padding, attention mask
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_id).long()
    mask[:, -1] = 1

    def hf():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=True,
            pad_token_id=tok.pad_id,
        )

    out.append(("transformers generate", generated / statistics.fmean(timed(hf, repeats))))

    def lrl_engine():
        engine_generate(model, prompts, n, torch.Generator().manual_seed(0), tok.pad_id)

    out.append(("lrl engine_generate", generated / statistics.fmean(timed(lrl_engine, repeats))))
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sampler = VLLMSampler(tok, kv_cache_mib=256)
    sampler.setup(model, 0)
    params = SamplingParams(max_tokens=n, ignore_eos=True, logprobs=0, detokenize=False, seed=0)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def vllm():
        sampler.llm.generate(batch, params, use_tqdm=False)

    out.append(("vllm", generated / statistics.fmean(timed(vllm, repeats))))
    sampler.close()
    return out


def sync_ms(shape: str) -> tuple[int, float]:
    import torch

    from lrl.envs.tinyagent import build_tokenizer, make_tasks
    from lrl.samplers import VLLMSampler
    from lrl_lab.tools.mismatch import random_model

    tok = build_tokenizer(make_tasks("all"))
    if shape == "tiny":
        from lrl.envs.tinyagent.base import make_rl_base

        model = make_rl_base(tok)
    else:
        model = random_model("qwen3-mini" if shape == "mini" else shape)
    params = sum(p.numel() for p in model.parameters())
    sampler = VLLMSampler(tok, kv_cache_mib=256)
    sampler.setup(model, 0)
    times = []
    for version in range(1, 6):
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
        sampler.sync(model, version)
        times.append(sampler.push_seconds * 1000)
    sampler.close()
    return params, statistics.median(times)


def main(argv=None) -> int:
    p = OneLineParser(
        prog="bench_vllm.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shapes", nargs="+", default=["tiny", "mini"], choices=("tiny", "mini", "qwen3-0.6b"))
    p.add_argument(
        "--sync-shapes", nargs="+", default=["tiny", "mini"], choices=("tiny", "mini", "qwen3-0.6b")
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        p.error("--repeats and --threads must be at least 1")
    from lrl.samplers.vllm import ENGINE_ENV, vllm_missing

    missing = vllm_missing()
    if missing:
        print(f"bench_vllm: {missing}", file=sys.stderr)
        return 2
    os.environ.update(ENGINE_ENV)
    import torch

    torch.set_num_threads(args.threads)
    print(f"1. 64 TinyAgent episodes per call, mean of {args.repeats} after a warm-up")
    rows = episodes_rows(args.repeats)
    base = rows[0][1]
    for name, eps, tps in rows:
        print(f"  {name:26s} {eps:8.1f} episodes/s {tps:9.0f} tokens/s   x{eps / base:.2f} vs onpolicy")
    for shape in args.shapes:
        print(f"2. fixed-length generation, 32 prompts x 32 tokens, shape {shape}")
        gen = generation_rows(shape, args.repeats)
        for name, tps in gen:
            print(f"  {name:26s} {tps:9.0f} tokens/s   x{tps / gen[0][1]:.2f} vs transformers")
    print("3. in-place weight sync of the vLLM engine (median of 5 updates)")
    for shape in args.sync_shapes:
        params, ms = sync_ms(shape)
        print(
            f"  {shape:12s} {params / 1e6:9.2f} M parameters {ms:9.1f} ms   {ms / params * 1e6:.3f} ms per M"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
