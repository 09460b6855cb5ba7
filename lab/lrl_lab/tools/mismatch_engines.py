"""The samplers the mismatch tool (:mod:`lrl_lab.tools.mismatch`) sets beside the engine: the ``--also`` rows (the
engine in fp32, FP8 weights, vLLM), each on its own tokens, and vLLM as a scorer of fixed-length continuations."""

from __future__ import annotations

import argparse
import copy

import torch

ALSO_LABELS = {
    "engine-fp32": "engine fp32",
    "fp8": "fp8 weights (KV cache, fp32)",
    "vllm": "vllm bf16",
}


def also_sample(name: str, model, prompts, tok, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their log-probs mu from one of the --also samplers -> ids, log-probs [B, n]."""
    from lrl.kvcache import engine_generate
    from lrl.samplers.fp8 import fp8_transform

    generator = torch.Generator().manual_seed(args.seed + 1)
    kw = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if name == "vllm":
        scorer = VLLMScorer(
            model, argparse.Namespace(**{**vars(args), "vllm_dtype": "bfloat16"}), max(map(len, prompts))
        )
        try:
            return scorer.generate(prompts, batch=len(prompts))
        finally:
            scorer.close()
    copy_ = copy.deepcopy(model)
    if name == "fp8":
        fp8_transform("none")(copy_)
    return engine_generate(copy_, prompts, args.new_tokens, generator, tok.pad_id, **kw)


def aligned_difference(a, b) -> tuple[torch.Tensor, float]:
    """Log-prob differences of two generations of the same prompts, where they sampled the same tokens so far
    (a token after the first divergence has another context): (differences [B, n] with 0 past it, share kept)."""
    (ids_a, lp_a), (ids_b, lp_b) = a, b
    same = (ids_a == ids_b).long().cumprod(-1).bool()  # [B, n] the prefix of equal tokens
    return (lp_a - lp_b) * same, float(same.float().mean())


class VLLMScorer:
    """vLLM sampling fixed-length continuations of the gym prompts, in batches of a given size."""

    def __init__(self, model, args, longest: int):
        from lrl.errors import EngineError
        from lrl.samplers.vllm import VLLMSampler, kv_cache_problems, vllm_missing

        missing = vllm_missing()
        if missing:
            raise ValueError(missing)
        problems = kv_cache_problems(args.vllm_kv_cache, next(model.parameters()).device.type == "cuda")
        if problems:
            raise ValueError("; ".join(p.replace("vllm_kv_cache:", "--vllm-kv-cache:") for p in problems))
        self.args = args
        dtype = args.vllm_dtype or args.engine_dtype
        if dtype not in ("bfloat16", "float32"):
            raise ValueError(f"--vllm-dtype: vLLM runs bfloat16 or float32 here, not {dtype}")
        tok = type("Tok", (), {"eos_id": -1})()
        length = (
            -(-(longest + args.new_tokens) // 16) * 16
        )  # the sequences it will see, not the model's context
        self.sampler = VLLMSampler(
            tok, dtype=dtype, kv_cache_mib=args.vllm_kv_cache, seed=args.seed, max_model_len=length
        )
        try:
            self.sampler.setup(model, 0)
        except EngineError as err:
            raise ValueError(str(err)) from None

    def generate(self, prompts, batch: int):
        """n tokens per prompt (eos does not stop it), each prompt with its own seed -> ids, log-probs [B, n]."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        a = self.args
        ids, logps = [], []
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            params = [
                SamplingParams(
                    temperature=a.temperature,
                    top_p=a.top_p,
                    top_k=a.top_k or -1,
                    max_tokens=a.new_tokens,
                    ignore_eos=True,  # not min_tokens: that masks eos, and mu would no longer be the model's
                    logprobs=0,
                    detokenize=False,
                    seed=a.seed * 1000 + start + i,
                )
                for i in range(len(chunk))
            ]
            outs = self.sampler.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in chunk], params, use_tqdm=False
            )
            for out in outs:
                made = out.outputs[0]
                ids.append(list(made.token_ids))
                logps.append([made.logprobs[j][t].logprob for j, t in enumerate(made.token_ids)])
        return torch.tensor(ids), torch.tensor(logps)

    def close(self) -> None:
        self.sampler.close()
