"""The one-step bias/variance study of the behavior-policy corrections (docs/offpolicy.md).

A softmax policy pi over `vocab` tokens with logits z and a fixed reward per token has the exact policy
gradient d E_pi[r] / dz = pi * (r - E_pi r). A sampler mu = softmax(z + sigma * noise) stands in for a
mismatch of growing size. Each estimate averages the weighted score-function gradient over `n_samples`
tokens drawn from mu with a batch-mean baseline; `reps` estimates give its squared bias and its variance,
both relative to |grad|^2. The weights are the package's own `tis_weights` and `mis_weights`.

    python -m lrl_lab.experiments.estimators  # the reference table: sigma 0.1 to 2.0; none, full IS, TIS C=2, MIS [0.5, 5]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lrl.weights import mis_weights, tis_weights

WeightFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (logp_pi, logp_mu, mask) -> w


def no_weights(logp_pi: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Ignore mu (the uncorrected estimator): the mask itself, [R, N] -> [R, N]."""
    return mask


def full_is_weights(logp_pi: torch.Tensor, logp_mu: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Untruncated importance weights pi/mu: [R, N] -> [R, N]."""
    return (logp_pi - logp_mu).exp() * mask


def weight_rules(cap: float = 2.0, low: float = 0.5, high: float = 5.0) -> dict[str, WeightFn]:
    """The four corrections of the study, by the column name the table prints."""
    return {
        "none": no_weights,
        "full IS": full_is_weights,
        f"TIS C={cap:g}": lambda lp, lm, m: tis_weights(lp, lm, m, cap=cap),
        f"MIS [{low:g}, {high:g}]": lambda lp, lm, m: mis_weights(lp, lm, m, low=low, high=high),
    }


@dataclass
class Problem:
    """A one-step softmax bandit: policy log-probs [V], reward [V], exact gradient [V]."""

    logits: torch.Tensor  # z, [V]
    reward: torch.Tensor  # [V]
    logp: torch.Tensor  # log pi, [V]
    grad: torch.Tensor  # pi * (r - E_pi r), [V]


def make_problem(vocab: int, generator: torch.Generator) -> Problem:
    """Draw logits 2 * N(0, 1) and rewards N(0, 1) over `vocab` tokens (in that order) -> Problem."""
    logits = 2.0 * torch.randn(vocab, generator=generator)
    reward = torch.randn(vocab, generator=generator)
    logp = torch.log_softmax(logits, -1)  # [V]
    grad = logp.exp() * (reward - (logp.exp() * reward).sum())  # [V]
    return Problem(logits, reward, logp, grad)


def sampler_logp(problem: Problem, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """A mismatched sampler: log softmax(z + sigma * N(0, 1)) -> [V]."""
    return torch.log_softmax(
        problem.logits + sigma * torch.randn(len(problem.logits), generator=generator), -1
    )


def kl(logp_mu: torch.Tensor, logp_pi: torch.Tensor) -> float:
    """KL(mu || pi) of two log-prob vectors [V]."""
    return (logp_mu.exp() * (logp_mu - logp_pi)).sum().item()


def gradient_estimates(
    problem: Problem, logp_mu: torch.Tensor, actions: torch.Tensor, weight_fn: WeightFn, chunk: int = 1000
) -> torch.Tensor:
    """Weighted score-function gradients, one per row of sampled actions: actions [R, N] -> [R, V].

    Row r is mean_n w_rn * A_rn * (onehot(a_rn) - pi), A the reward minus the row's mean reward. Rows are
    computed `chunk` at a time so the [chunk, N, V] intermediate stays small.
    """
    vocab = len(problem.logp)
    out = []
    probs = problem.logp.exp()  # [V]
    for a in actions.split(chunk):  # [c, N]
        adv = problem.reward[a] - problem.reward[a].mean(-1, keepdim=True)  # [c, N]
        w = weight_fn(problem.logp[a], logp_mu[a], torch.ones_like(adv))  # [c, N]
        score = torch.nn.functional.one_hot(a, vocab) - probs  # [c, N, V]
        out.append(((w * adv)[..., None] * score).mean(1))
    return torch.cat(out)


def bias_variance(
    problem: Problem,
    logp_mu: torch.Tensor,
    weight_fn: WeightFn,
    n_samples: int,
    reps: int,
    generator: torch.Generator,
) -> tuple[float, float]:
    """Squared bias and variance of one estimator relative to |grad|^2 (draws reps x n_samples actions from mu)."""
    vocab = len(logp_mu)
    actions = torch.multinomial(
        logp_mu.exp().expand(reps, vocab), n_samples, replacement=True, generator=generator
    )
    grads = gradient_estimates(problem, logp_mu, actions, weight_fn)  # [R, V]
    norm2 = problem.grad.pow(2).sum()
    bias2 = (grads.mean(0) - problem.grad).pow(2).sum() / norm2
    return bias2.item(), (grads.var(0).sum() / norm2).item()


def study(
    sigmas: list[float],
    seed: int = 0,
    vocab: int = 100,
    n_samples: int = 64,
    reps: int = 4000,
    rules: dict[str, WeightFn] | None = None,
) -> list[dict]:
    """The whole study from one generator: per sigma, KL(mu || pi) and (bias^2, variance) per rule."""
    rules = rules or weight_rules()
    gen = torch.Generator().manual_seed(seed)
    problem = make_problem(vocab, gen)
    rows = []
    for sigma in sigmas:
        logp_mu = sampler_logp(problem, sigma, gen)
        cells = {
            name: bias_variance(problem, logp_mu, fn, n_samples, reps, gen) for name, fn in rules.items()
        }
        rows.append(dict(sigma=sigma, kl=kl(logp_mu, problem.logp), cells=cells))
    return rows


def table_lines(rows: list[dict]) -> list[str]:
    """The study as docs/offpolicy.md shows it: one line per sigma, a (bias^2, variance) cell per rule."""
    names = list(rows[0]["cells"]) if rows else []
    head = f"{'sigma':>5} {'KL(mu||pi)':>10} | " + " | ".join(f"{name:>14}" for name in names)
    lines = [head + "   (bias^2, variance)"]
    for row in rows:
        cells = " | ".join(f"{b:6.3f}, {v:6.3f}" for b, v in row["cells"].values())
        lines.append(f"{row['sigma']:5.1f} {row['kl']:10.3f} | {cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the study's table; returns the exit status."""
    p = argparse.ArgumentParser(
        prog="python -m lrl_lab.experiments.estimators",
        description="Bias and variance of uncorrected, full-IS, TIS and MIS policy gradients on a one-step "
        "softmax problem whose sampler has noisy logits (docs/offpolicy.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--sigmas", type=float, nargs="+", default=[0.1, 0.5, 1.0, 2.0], help="logit-noise scales of mu"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the one torch CPU generator every draw uses")
    p.add_argument("--vocab", type=int, default=100, help="tokens V")
    p.add_argument("--samples", type=int, default=64, help="sampled tokens per gradient estimate")
    p.add_argument("--reps", type=int, default=4000, help="estimates per cell")
    p.add_argument("--cap", type=float, default=2.0, help="TIS cap C")
    p.add_argument("--low", type=float, default=0.5, help="MIS band, low end")
    p.add_argument("--high", type=float, default=5.0, help="MIS band, high end")
    args = p.parse_args(argv)
    for name in ("vocab", "samples", "reps"):
        if getattr(args, name) < (2 if name == "reps" else 1):
            p.error(f"--{name} must be >= {2 if name == 'reps' else 1}; got {getattr(args, name)}")
    if any(not s >= 0 for s in args.sigmas):
        p.error(f"--sigmas must be >= 0; got {args.sigmas}")
    if not args.cap > 0:
        p.error(f"--cap must be > 0; got {args.cap}")
    if not 0 < args.low <= args.high:
        p.error(f"need 0 < --low <= --high; got {args.low}, {args.high}")
    rows = study(
        args.sigmas,
        args.seed,
        args.vocab,
        args.samples,
        args.reps,
        weight_rules(args.cap, args.low, args.high),
    )
    print("\n".join(table_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
