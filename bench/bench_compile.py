"""torch.compile (inductor, CPU) against the eager path on a real model: the update's forward + backward and the
engine's decode, compile time counted, ratios from one run, the machine named.

    python bench/bench_compile.py                    # SmolLM2-135M-Instruct, a calc-shaped batch, two threads
    python bench/bench_compile.py --repeats 5 --skip-decode

Where a step's time goes beside its matrix products is element-wise work and operator calls (bench/profile_step.py
--ops); fusing them is what inductor's generated C++ is for. The model's own decoder layers cannot be compiled whole
under lrl's forwards: each layer's key/value cache is a Python object whose state dynamo guards on (a layer index,
a cache already filled or not), so every layer compiles again until the recompile limit. What compiles once for all
layers are the pieces without a cache, compiled here as "regions":

- ``norms``: the RMS norms (two a layer and the last);
- ``norms+mlp``: those and each layer's MLP (gate, up, SiLU, product, down) - the update only: at a decode step
  the engine computes the MLP's products itself (lrl.decode_step.few_rows_linears) and compiling over it would trace
  the eager product instead.

Each mode is timed on a fresh copy of the model: its first call (compile included: inductor's cache on disk makes a
second process's compile shorter, which this run does not count) and the best of ``--repeats`` calls after it. The
update's gradient is compared with the eager one's (largest difference over the largest eager value); a compiled
decode's tokens with the eager engine's on the same seed. Nothing is asserted: the figures are for reading.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from lrl.cli import OneLineParser  # noqa: E402


def calc_batch(vocab: int, tasks: int = 4, samples: int = 8, prompt: int = 96, reply: int = 48, seed: int = 0):
    """A batch shaped like a calc step's: `tasks` prompts of `prompt` tokens, `samples` rows each, replies of
    reply/2..reply tokens (right-padded) -> ids, attention mask, action positions, prompt lengths."""
    from lrl.logprobs import prompt_lengths

    g = torch.Generator().manual_seed(seed)
    rows = tasks * samples
    heads = torch.randint(0, vocab, (tasks, prompt), generator=g).repeat_interleave(samples, 0)
    ids = torch.cat([heads, torch.randint(0, vocab, (rows, reply), generator=g)], 1)
    lengths = prompt + torch.randint(reply // 2, reply + 1, (rows,), generator=g)
    mask = (torch.arange(prompt + reply)[None] < lengths[:, None]).long()
    positions = torch.zeros(rows, prompt + reply - 1, dtype=torch.bool)
    for r in range(rows):
        positions[r, prompt - 1 : int(lengths[r]) - 1] = True
    return ids, mask, positions, prompt_lengths(positions)


def compile_regions(model, regions: str):
    """`model` with its RMS norms (and with ``norms+mlp`` each layer's MLP) compiled in place; "eager": unchanged."""
    if regions == "eager":
        return model
    layers = model.model.layers
    for layer in layers:
        layer.input_layernorm = torch.compile(layer.input_layernorm, dynamic=True)
        layer.post_attention_layernorm = torch.compile(layer.post_attention_layernorm, dynamic=True)
        if regions == "norms+mlp":
            layer.mlp = torch.compile(layer.mlp, dynamic=True)
    model.model.norm = torch.compile(model.model.norm, dynamic=True)
    return model


def first_and_best(fn, repeats: int):
    """(seconds of the first call, compile included; the best of `repeats` calls after it; what the first returned)."""
    from bench_real_model import best

    start = time.perf_counter()
    out = fn()
    first = time.perf_counter() - start
    return first, best(fn, repeats, warm_up=False), out


def update_mode(model, batch, regions: str, repeats: int):
    """(first call s, best later call s, the gradient) of one forward + backward of the update's log-probs."""
    from lrl.logprobs import token_log_probs

    net = compile_regions(copy.deepcopy(model).train(), regions)
    ids, mask, positions, prefix = batch

    def step():
        net.zero_grad(set_to_none=True)
        logp, _ = token_log_probs(net, ids, mask, 0.7, positions, entropy=True, prefix=prefix, entropy_grad=False)
        (-(logp * positions).sum() / positions.sum()).backward()

    first, best_s, _ = first_and_best(step, repeats)
    grad = torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])
    return first, best_s, grad


def decode_mode(model, prompts, new_tokens: int, regions: str, repeats: int, pad_id: int):
    """(first call s, best later call s, the tokens) of the engine sampling `new_tokens` after each prompt."""
    from lrl.kvcache import engine_generate

    net = compile_regions(copy.deepcopy(model).eval(), regions)

    def run():
        with torch.no_grad():
            return engine_generate(net, prompts, new_tokens, torch.Generator().manual_seed(0), pad_id)[0]

    return first_and_best(run, repeats)


def main(argv=None) -> int:
    from bench_real_model import load_checked, machine, model_problem, prompts_of

    p = OneLineParser(prog="bench_compile.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a named model or a save_pretrained folder (Llama-like)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed calls after the first, the best kept")
    p.add_argument("--batch", type=int, default=32, help="decode rows")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--skip-update", action="store_true")
    args = p.parse_args(argv)
    if problem := model_problem(args.model):
        p.error(problem)
    if args.threads < 1 or args.repeats < 1 or args.batch < 1 or args.new_tokens < 1:
        p.error("--threads, --repeats, --batch and --new-tokens must be at least 1")
    torch.set_num_threads(args.threads)
    model, tok = load_checked(p, args.model)
    if not hasattr(getattr(model, "model", None), "layers"):
        p.error(f"--model: {args.model!r} has no model.layers to compile regions of (a Llama-like model is needed)")
    print(f"machine: {machine()}")
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"commit: {commit or 'unknown'}; torch {torch.__version__}; {args.threads} threads")
    if not args.skip_update:
        batch = calc_batch(model.config.vocab_size)
        tokens = int(batch[2].sum())
        print(f"\nupdate: forward + backward of {len(batch[0])} rows, {tokens} action tokens (calc-shaped, fp32)")
        print(f"{'mode':<10} {'first s':>8} {'best s':>8} {'x eager':>8} {'grad diff':>10}")
        base = None
        for regions in ("eager", "norms", "norms+mlp"):
            first, best_s, grad = update_mode(model, batch, regions, args.repeats)
            if base is None:
                base = (best_s, grad)
            diff = float((grad - base[1]).abs().max() / base[1].abs().max())
            print(f"{regions:<10} {first:8.2f} {best_s:8.2f} {base[0] / best_s:8.2f} {diff:10.1e}")
    if not args.skip_decode:
        prompts = prompts_of(tok, args.batch)
        print(f"\ndecode: {args.batch} rows x {args.new_tokens} new tokens, prefill included (lrl engine, fp32)")
        print(f"{'mode':<10} {'first s':>8} {'best s':>8} {'tok/s':>8} {'x eager':>8} {'same tokens':>12}")
        base = None
        for regions in ("eager", "norms"):
            first, best_s, ids = decode_mode(model, prompts, args.new_tokens, regions, args.repeats, tok.pad_id)
            if base is None:
                base = (best_s, ids)
            same = statistics.mean(float(a == b) for a, b in zip(ids.flatten().tolist(), base[1].flatten().tolist()))
            print(f"{regions:<10} {first:8.2f} {best_s:8.2f} {args.batch * args.new_tokens / best_s:8.1f} "
                  f"{base[0] / best_s:8.2f} {same:12.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
