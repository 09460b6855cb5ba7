"""What drawing one decode step's tokens costs, at a real model's vocabulary, by where the log-probs live.

    python bench/bench_sampling.py                 # the CPU; on a machine with a GPU, the GPU rows too
    python bench/bench_sampling.py --threads 2

Rows: torch.multinomial on the CPU (what a CPU run did at every decode step, and still does at a vocabulary of at
most ``lrl.decoding.MULTINOMIAL_VOCAB`` words); the inverse-CDF draw on the CPU (the same arithmetic as the GPU path);
``sample_tokens`` itself (the inverse CDF at these vocabularies, with its uniform from the generator); and, with a GPU, the GPU path of ``sample_tokens`` (one seeded
uniform a row from the CPU generator, the token found on the GPU) against moving the log-probs to the CPU and
drawing there (what every step did before the GPU path). Milliseconds a decode step, best of ``--repeats``
rounds in which the draws take turns (bench_engine's ``interleaved``); every draw ends with its tokens on the CPU,
so a GPU's work is finished when its time is read.
"""

from __future__ import annotations

import argparse

import torch
from bench_engine import interleaved

from lrl.cli import OneLineParser
from lrl.decoding import inverse_cdf_tokens, sample_tokens

VOCABS = {"smollm2-135m": 49_152, "qwen3-0.6b": 151_936}


def main(argv=None) -> None:
    parser = OneLineParser(
        prog="bench_sampling.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=32, help="sequences in the decode batch")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    if min(args.rows, args.repeats, args.threads) < 1:
        parser.error("--rows, --repeats and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"{args.rows} rows | {args.threads} CPU thread(s) | ms a decode step, best of {args.repeats}")
    for name, vocab in VOCABS.items():
        logp = torch.log_softmax(torch.randn(args.rows, vocab, generator=generator), -1)
        uniform = torch.rand(args.rows, 1, dtype=torch.float64, generator=generator)
        for row, ms in step_costs(logp, uniform, generator, args.repeats).items():
            print(f"{name:<13} vocab {vocab:>7,}  {row:<46} {ms:8.2f} ms")


def step_costs(logp: torch.Tensor, uniform: torch.Tensor, generator: torch.Generator, repeats: int) -> dict:
    draws = {
        "cpu: torch.multinomial": (lambda: torch.multinomial(logp.exp(), 1, generator=generator), None),
        "cpu: inverse CDF": (lambda: inverse_cdf_tokens(logp, uniform), None),
        "cpu: sample_tokens (what a CPU run draws with)": (lambda: sample_tokens(logp, generator), None),
    }
    if torch.cuda.is_available():
        on_gpu = logp.cuda()
        draws["gpu: log-probs to the CPU, multinomial there"] = (
            lambda: sample_tokens(on_gpu.cpu(), generator),
            None,
        )
        draws["gpu: sample_tokens (inverse CDF on the GPU)"] = (
            lambda: sample_tokens(on_gpu, generator),
            None,
        )
    interleaved(draws, 1)  # warm-up
    seconds, _ = interleaved(draws, repeats)
    return {name: s * 1e3 for name, s in seconds.items()}


if __name__ == "__main__":
    main()
