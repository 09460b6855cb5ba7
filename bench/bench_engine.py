"""Benchmark the engine's KV-cache decoder: 64 prompts x 128 new tokens, three ways, ratios from one run.

    python bench/bench_engine.py                   # the TinyAgent model size, CPU, one thread
    python bench/bench_engine.py --hidden 256 --layers 6 --threads 2
    python bench/bench_engine.py --shape qwen3-0.6b --device cuda --dtype bfloat16 --prompts 30 --new-tokens 32

- engine:    samplers.engine.engine_generate (left-padded prefill, then one decode step per token);
- recompute: a full forward over every (right-padded) sequence at every step, the trainer-style decoder;
- generate:  transformers' model.generate with the same cache (DynamicCache), sampling at temperature 1,
             no top-k/top-p, no stop at eos, returning the step scores (the engine records log-probs too).

Targets: engine >= 5x faster than recompute, and no slower than generate. The machine is shared and
noisy, so only ratios measured in the same run are printed; nothing here is asserted.
"""

from __future__ import annotations

import copy
import time

import torch

from lrl.batch import pad_right
from lrl.cli import OneLineParser
from lrl.envs.tinyagent import build_tokenizer, make_tasks
from lrl.kvcache import engine_generate
from lrl.policy import make_policy
from lrl_lab.tools.mismatch import RANDOM_SHAPES, gym_prompts, ragged


def recompute_generate(model, prompts, new_tokens, generator, pad_id):
    """Sample by re-running every whole (right-padded) sequence at each step, as the trainer-style decoder
    does -> ids [B, n], log-probs [B, n]."""
    seqs = [list(p) for p in prompts]
    rows = torch.arange(len(seqs))
    ids, logps = [], []
    for _ in range(new_tokens):
        batch, mask = pad_right(seqs, pad_id)  # [B, T]
        device = next(model.parameters()).device
        logits = model(input_ids=batch.to(device), attention_mask=mask.to(device)).logits.cpu()  # [B, T, V]
        logp = torch.log_softmax(logits[rows, mask.sum(-1) - 1].float(), dim=-1)  # [B, V]
        token = torch.multinomial(logp.exp(), 1, generator=generator)  # [B, 1]
        ids.append(token.squeeze(1))
        logps.append(logp.gather(1, token).squeeze(1))
        for s, t in zip(seqs, token.squeeze(1).tolist()):
            s.append(t)
    return torch.stack(ids, 1), torch.stack(logps, 1)


def hf_generate(model, prompts, new_tokens, pad_id):
    """transformers' generate on the same left-padded batch, sampling every step, no early stop."""
    from transformers import DynamicCache

    ids = torch.full((len(prompts), max(len(p) for p in prompts)), pad_id, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, ids.shape[1] - len(p) :] = torch.as_tensor(p)
    mask = (
        torch.arange(ids.shape[1]) >= ids.shape[1] - torch.tensor([len(p) for p in prompts])[:, None]
    ).long()
    config = copy.deepcopy(model.generation_config)
    config.update(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=None,
        pad_token_id=pad_id,
        max_new_tokens=new_tokens,
        min_new_tokens=0,
        return_dict_in_generate=True,
        output_scores=True,
    )
    device = next(model.parameters()).device
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        generation_config=config,
        past_key_values=DynamicCache(config=model.config),
    )
    return out.sequences[:, ids.shape[1] :]


def interleaved(methods: dict, repeats: int) -> tuple[dict[str, float], dict]:
    """Best wall time per method over `repeats` rounds, the methods taking turns within each round, so a
    burst of load from other processes hits them alike -> (seconds, last results)."""
    best, results = {name: float("inf") for name in methods}, {}
    for round_ in range(repeats):
        for name, (fn, rounds) in methods.items():
            if rounds is not None and round_ >= rounds:
                continue
            start = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def device_problem(text: str) -> str:
    """Why torch cannot compute on device `text` here ('' where it can)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        return f"{text!r} is not a device torch knows (cpu, cuda, cuda:N, ...)"
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"{text!r}: torch sees no GPU here"
    if device.type not in ("cpu", "cuda"):
        return f"{text!r}: this bench runs on cpu or cuda"
    return ""


def main(argv=None) -> None:
    p = OneLineParser(prog="bench_engine.py", description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default: the TinyAgent size, 64)")
    p.add_argument("--layers", type=int, default=None, help="layers (default: the TinyAgent size, 3)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of engine and generate; best kept")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--shape", default=None, choices=sorted(RANDOM_SHAPES), help="a random Qwen3 of a named shape instead"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = p.parse_args(argv)
    if min(args.prompts, args.new_tokens, args.repeats, args.threads) < 1:
        p.error("--prompts, --new-tokens, --repeats and --threads must be at least 1")
    if args.layers is not None and args.layers < 1:
        p.error(f"--layers: {args.layers} is not allowed; it must be at least 1")
    if args.hidden is not None and (args.hidden < 4 or args.hidden % 4):
        p.error(f"--hidden: {args.hidden} is not allowed; it must be a multiple of 4 (4 heads), at least 4")
    if problem := device_problem(args.device):
        p.error(f"--device: {problem}")
    torch.set_num_threads(args.threads)
    tok = build_tokenizer(make_tasks("all"))
    size = {"max_position_embeddings": 512}
    if args.hidden:
        size.update(hidden_size=args.hidden, intermediate_size=3 * args.hidden, head_dim=args.hidden // 4)
    if args.layers:
        size["num_hidden_layers"] = args.layers
    if args.shape:
        from lrl_lab.tools.mismatch import random_model

        model = random_model(args.shape)
    else:
        model = make_policy(tok, **size)
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype))
    tasks = make_tasks("all")
    prompts = gym_prompts(tok, [tasks[i % len(tasks)] for i in range(args.prompts)])
    prompts = ragged(prompts)  # unequal lengths: real left padding
    n = args.new_tokens
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.prompts} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens) x {n} new tokens | "
        f"{params / 1e3:.0f}k parameters | {args.device} {args.dtype} | {args.threads} thread(s) | "
        f"best of {args.repeats} rounds"
    )
    with torch.no_grad():
        engine_generate(model, prompts[:4], 4, torch.Generator().manual_seed(0), tok.pad_id)  # warm-up
        hf_generate(model, prompts[:4], 4, tok.pad_id)
        methods = {
            "engine (KV cache)": (
                lambda: engine_generate(model, prompts, n, torch.Generator().manual_seed(0), tok.pad_id)[0],
                None,
            ),
            "model.generate": (lambda: hf_generate(model, prompts, n, tok.pad_id), None),
            "recompute every step": (
                lambda: recompute_generate(model, prompts, n, torch.Generator().manual_seed(0), tok.pad_id)[
                    0
                ],
                1,
            ),  # slow: one round
        }
        seconds, results = interleaved(methods, args.repeats)
    assert all(r.shape == (len(prompts), n) for r in results.values())
    t_engine, t_generate, t_recompute = (seconds[k] for k in methods)
    tokens = len(prompts) * n
    for name, t in seconds.items():
        print(f"{name:<22} {t:8.3f} s  {tokens / t:9.0f} tokens/s")
    print(f"recompute / engine = {t_recompute / t_engine:.2f}x   (target >= 5x)")
    print(f"generate / engine  = {t_generate / t_engine:.2f}x   (target >= 1x: the engine is no slower)")


if __name__ == "__main__":
    main()
