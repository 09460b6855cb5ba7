"""Measure the training-inference mismatch of a model: engine-style sampling vs trainer-style recomputation.

    python -m lrl_lab.mismatch                              # the TinyAgent RL base, 30 gym prompts, 32 new tokens
    python -m lrl_lab.mismatch --model DIR --engine-batch --fp32-head --json out.json --plot figs/
    python -m lrl_lab.mismatch --model smollm2-135m --also engine-fp32 fp8 vllm   # a real chat model, every row
    python -m lrl_lab.mismatch --model smollm2-135m --arms bf16 fp16 bf16-head fp16-head fp8   # what each choice removes

For each of the 30 gym tasks the prompt is the task's prompt, a ``read`` action and the source it shows,
i.e. the point where the agent must name the buggy line; for a chat model, the same conversation rendered by
its own chat template (the task's instructions as the system message). The engine (``samplers.engine``: left-padded
batch, KV cache, one decode step per token, in ``--engine-dtype``) samples ``--new-tokens`` tokens per
prompt and records their log-probs mu. The trainer then recomputes the same tokens' log-probs the way a
trainer does (one full forward over right-padded prompt + continuation) in bf16 and in fp32, scoring
``--trainer-batch`` sequences per forward. Trainer-vs-engine rows measure the whole mismatch;
trainer-vs-trainer rows isolate batch composition; ``--engine-batch`` rescoring the engine's tokens in
decode batches of 1, 10 and 30 isolates the engine's own batch dependence. ``--fp32-head`` keeps the LM
head in fp32 on the low-precision models (log-softmax is always fp32). ``--arms`` adds one table of numerics side by
side (lrl_lab.tools.mismatch_arms): bf16, fp16, each with an fp32 head, fp32, FP8-rounded weights.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from lrl.cli import OneLineParser
from lrl.policy import continuation_log_probs, with_fp32_head
from lrl.stats import band_shares, compare, probability_bins, ratio_ranges
from lrl_lab.tools.mismatch_arms import ARMS, measure_arms
from lrl_lab.tools.mismatch_engines import ALSO_LABELS, VLLMScorer, aligned_difference, also_sample
from lrl_lab.tools.mismatch_report import plot, report

SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def gym_prompts(tok, tasks) -> list[list[int]]:
    """Per task: the prompt, the action `read <eos>`, then the source it reveals -> token ids. A chat model's
    tokenizer frames them as its template does (system message, user turn, assistant turn, observation turn,
    generation prompt); the word tokenizer as <bos> and words."""
    if getattr(tok, "chat", False):
        from lrl.envs.tinyagent import INSTRUCTIONS

        tok = tok.conversation(INSTRUCTIONS)
    read = tok.encode("read") + [tok.eos_id]
    return [tok.prompt(t.prompt) + read + tok.observation(t.source) for t in tasks]


def ragged(prompts: list[list[int]], spread: int = 13) -> list[list[int]]:
    """Cut prompt i short by i % spread tokens: unequal lengths, so batching needs left padding."""
    return [p[: len(p) - i % spread] for i, p in enumerate(prompts)]


def _bounded(cast, low, high, what: str):
    """An argparse type: `cast` the text and check low <= value <= high (None: no bound on that side)."""

    def parse(text: str):
        try:
            value = cast(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (low is not None and not value >= low) or (high is not None and not value <= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def _open_unit(text: str) -> float:
    """A top-p mass: a number in (0, 1]."""
    value = _bounded(float, None, 1.0, "a number in (0, 1]")(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m lrl_lab.mismatch",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model",
        help="local save_pretrained directory of a causal LM, or a named model (smollm2-135m) (default: the "
        "TinyAgent RL base)",
    )
    p.add_argument(
        "--also",
        nargs="+",
        default=[],
        choices=ALSO,
        help="more samplers, each sampling its own tokens, compared with the fp32 trainer: the KV-cache engine "
        "in fp32 (engine-fp32), FP8-rounded weights on the fp32 KV-cache decode (fp8), a vLLM engine on "
        "this machine in bf16 (vllm, where installed)",
    )
    p.add_argument(
        "--new-tokens",
        type=_bounded(int, 1, 4096, "an integer in [1, 4096]"),
        default=32,
        help="tokens sampled per prompt",
    )
    p.add_argument(
        "--sampler",
        default="engine",
        choices=("engine", "vllm"),
        help="the engine: lrl's KV-cache imitation (engine) or a real vLLM engine (vllm)",
    )
    p.add_argument("--engine-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument(
        "--vllm-dtype",
        default=None,
        choices=("bfloat16", "float32"),
        help="vLLM's dtype (default --engine-dtype)",
    )
    p.add_argument(
        "--vllm-kv-cache",
        type=_bounded(int, 1, 1_048_576, "a number of MiB in [1, 1048576]"),
        default=256,
        help="MiB of KV cache for vLLM (at most what the machine's memory holds)",
    )
    p.add_argument(
        "--random-model",
        choices=sorted(RANDOM_SHAPES),
        default=None,
        help="instead of --model: a randomly initialised Qwen3 of this shape (qwen3-0.6b is Qwen3-0.6B's)",
    )
    p.add_argument(
        "--trainer-batch",
        type=_bounded(int, 0, 1_000_000, "an integer >= 0"),
        nargs="+",
        default=[1, 0],
        help="sequences per trainer forward; 0 means all prompts in one batch",
    )
    p.add_argument(
        "--engine-batch",
        type=_bounded(int, 1, 1_000_000, "an integer >= 1"),
        nargs="*",
        default=None,
        help="also rescore the engine's tokens in these decode batch sizes (bare flag: 1 10 30)",
    )
    p.add_argument(
        "--prompts",
        type=_bounded(int, 1, 30, "an integer in [1, 30]"),
        default=30,
        help="how many of the 30 gym prompts to use",
    )
    p.add_argument(
        "--ragged",
        action="store_true",
        help="cut the prompts to unequal lengths (the gym's are all equal), so batches are padded",
    )
    p.add_argument("--fp32-head", action="store_true", help="LM head in fp32 on the low-precision models")
    p.add_argument(
        "--arms",
        nargs="+",
        default=[],
        choices=list(ARMS),
        help="also one table of numerics side by side, each arm sampling its own tokens with the KV-cache engine "
        "and rescored trainer-style in the same numerics (fp8: rounded weights against the fp32 trainer)",
    )
    p.add_argument(
        "--top-p", type=_open_unit, default=1.0, help="engine nucleus sampling (mu is the truncated one)"
    )
    p.add_argument(
        "--top-k",
        type=_bounded(int, 0, 2**31 - 1, "an integer >= 0"),
        default=0,
        help="engine top-k sampling (0: off)",
    )
    p.add_argument("--temperature", type=_bounded(float, 0.01, 100.0, "a number in [0.01, 100]"), default=1.0)
    p.add_argument("--seed", type=_bounded(int, 0, 2**63 - 1, "an integer in [0, 2**63 - 1]"), default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--threads",
        type=_bounded(int, 1, 1024, "an integer in [1, 1024]"),
        default=1,
        help="torch CPU threads",
    )
    p.add_argument("--json", help="write the results to this JSON file")
    p.add_argument(
        "--plot", help="write mismatch.png (CDF of |d|, mean |d| by probability bin) to this folder"
    )
    return p


# shapes of randomly initialised Qwen3 models (transformers' Qwen3Config fields), for engines at a real size
RANDOM_SHAPES = {
    "qwen3-0.6b": dict(
        vocab_size=151_936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    "qwen3-mini": dict(  # the same layer shape, 4 layers and a 32k vocabulary: minutes less on a CPU
        vocab_size=32_768,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


def random_model(shape: str, seed: int = 0):
    """A randomly initialised Qwen3ForCausalLM of a named shape, in fp32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(Qwen3Config(**RANDOM_SHAPES[shape])).float().eval()


ALSO = ("engine-fp32", "fp8", "vllm")


def load_model(path: str | None, device: str, shape: str | None = None):
    """The fp32 model and its tokenizer: a local directory or named model (with the tokenizer saved with it,
    else the gym's), a random model of a shape, or the RL base (the gym's word tokenizer)."""
    from lrl.envs.tinyagent import build_tokenizer, make_tasks
    from lrl.policy import check_vocabulary, load_policy

    gym = build_tokenizer(make_tasks("all"))
    if shape is not None:
        return random_model(shape).to(device), gym
    if path is None:
        from lrl.envs.tinyagent.base import make_rl_base

        model, tok = make_rl_base(gym, verbose=True), gym
    else:
        from lrl.models import is_named, resolve_model

        if is_named(path):
            path = str(resolve_model(path))  # ModelUnavailable (a ValueError) names the install command
        model, tok = load_policy(path)  # ModelLoadError (a ValueError) names the problem
        if tok is None:
            tok = gym
            check_vocabulary(model, tok)
    return model.to(device).float().eval(), tok


def measure(model, tok, args) -> dict:
    """Sample engine-style, recompute trainer-style, compare -> the results dict (see --json)."""
    from lrl.envs.tinyagent import make_tasks
    from lrl.kvcache import engine_generate, engine_score
    from lrl.samplers.engine import check_device_dtype, engine_dtype

    dtype = engine_dtype(args.engine_dtype)
    prompts = gym_prompts(tok, make_tasks("all")[: args.prompts])
    if args.ragged:
        prompts = ragged(prompts)
    n_prompts = len(prompts)

    def low(d):
        m = copy.deepcopy(model).to(d)
        return with_fp32_head(m, model) if args.fp32_head and d != torch.float32 else m

    models = {torch.float32: model, torch.bfloat16: low(torch.bfloat16)}
    if dtype not in models:
        models[dtype] = low(dtype)
    engine = models[dtype]
    kw = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    start = time.perf_counter()
    if args.sampler == "vllm":
        real = VLLMScorer(model, args, max(len(p) for p in prompts))
        new_ids, engine_logp = real.generate(prompts, batch=n_prompts)
    else:
        check_device_dtype(engine, args.device, dtype)
        new_ids, engine_logp = engine_generate(
            engine, prompts, args.new_tokens, torch.Generator().manual_seed(args.seed), tok.pad_id, **kw
        )
    timings = {"engine_s": time.perf_counter() - start}
    batches = sorted({b if b > 0 else n_prompts for b in args.trainer_batch})
    scores = {}
    start = time.perf_counter()
    for d in (torch.bfloat16, torch.float32):
        for b in batches:
            scores[(d, b)] = continuation_log_probs(
                models[d], prompts, new_ids, tok.pad_id, b, args.temperature
            )
    timings["trainer_s"] = time.perf_counter() - start
    comparisons = {}
    for d in (torch.bfloat16, torch.float32):
        for b in batches:
            comparisons[f"{SHORT[d]} trainer batch {b} vs engine"] = scores[(d, b)] - engine_logp
    for d in (torch.bfloat16, torch.float32):
        for b in batches[:-1]:
            comparisons[f"{SHORT[d]} trainer batch {b} vs batch {batches[-1]}"] = (
                scores[(d, b)] - scores[(d, batches[-1])]
            )
    same_prefix = {}
    if args.engine_batch is not None:
        sizes = sorted(set(args.engine_batch or [1, 10, n_prompts]))
        if (
            args.sampler == "vllm"
        ):  # the same prompts and seeds decoded in batches of b: the engine's own drift
            runs = {b: real.generate(prompts, batch=b) for b in sizes}
            for b in sizes[:-1]:
                diff, share = aligned_difference(runs[b], runs[sizes[-1]])
                comparisons[f"vllm batch {b} vs batch {sizes[-1]}"] = diff
                same_prefix[f"vllm batch {b} vs batch {sizes[-1]}"] = share
        else:
            rescored = {
                b: engine_score(engine, prompts, new_ids, tok.pad_id, batch_size=b, **kw) for b in sizes
            }
            for b in sizes[:-1]:
                comparisons[f"engine batch {b} vs batch {sizes[-1]}"] = rescored[b] - rescored[sizes[-1]]
    if args.sampler == "vllm":
        real.close()
    reference = scores[(torch.float32, batches[0])]
    for name in args.also:  # each samples its own tokens; compared with the fp32 trainer on those tokens
        start = time.perf_counter()
        ids, logp = also_sample(name, model, prompts, tok, args)
        timings[f"{name}_s"] = time.perf_counter() - start
        trainer = continuation_log_probs(model, prompts, ids, tok.pad_id, batches[0], args.temperature)
        comparisons[f"fp32 trainer batch {batches[0]} vs {ALSO_LABELS[name]}"] = trainer - logp
    del reference
    arms = measure_arms(model, prompts, tok, args, args.arms) if args.arms else {}
    headline = f"{SHORT[torch.bfloat16]} trainer batch {batches[0]} vs engine"
    return {
        "model": args.model or (f"random {args.random_model}" if args.random_model else "TinyAgent RL base"),
        "engine": "vllm" if args.sampler == "vllm" else "lrl imitation engine",
        "same_tokens_share": same_prefix,
        "engine_dtype": (args.vllm_dtype or args.engine_dtype) if args.sampler == "vllm" else SHORT[dtype],
        "fp32_head": args.fp32_head,
        "ragged": args.ragged,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "prompts": n_prompts,
        "new_tokens": args.new_tokens,
        "tokens": int(engine_logp.numel()),
        "comparisons": {
            name: {**compare(d, torch.zeros_like(d)), **band_shares(d)} for name, d in comparisons.items()
        },
        "headline": headline,
        "bins": probability_bins(engine_logp, comparisons[headline]),
        "bins_by_comparison": {name: probability_bins(engine_logp, d) for name, d in comparisons.items()},
        "ratios": ratio_ranges(comparisons[headline]),
        "ratios_by_comparison": {name: ratio_ranges(d) for name, d in comparisons.items()},
        "timings": timings,
        "arms": arms,
        "_diffs": comparisons,
        "_engine_logp": engine_logp,
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    from lrl.runs import check_output

    problems = check_output("--json", args.json, "file") + check_output("--plot", args.plot, "dir")
    if problems:
        print(f"lrl_lab.mismatch: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    try:
        if args.new_tokens < 1:
            raise ValueError(f"--new-tokens must be >= 1; got {args.new_tokens}")
        if any(b < 0 for b in args.trainer_batch) or any(b < 1 for b in args.engine_batch or []):
            raise ValueError("batch sizes must be >= 1 (0 means all prompts, for --trainer-batch only)")
        from lrl.samplers.engine import check_device, engine_dtype

        check_device(args.device, engine_dtype(args.engine_dtype))
        model, tok = load_model(args.model, args.device, args.random_model)
        res = measure(model, tok, args)
    except ValueError as err:  # bad model path, dtype/device, context length, sampling option
        print(f"lrl_lab.mismatch: error: {err}", file=sys.stderr)
        return 2
    print(report(res))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({k: v for k, v in res.items() if not k.startswith("_")}, indent=2)
        )
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot(res, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
