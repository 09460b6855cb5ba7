"""The review RL base: a supervised warm start on demonstrations whose labels are wrong for two operators.

Demonstrations are whole episodes on generated files (never one of the 60 fixed tasks), with loss on every
token of every action. Their labels follow the rule, except that a ``min`` line (suspect) is labelled ``ok``
half of the time and a ``max`` line (safe) ``bad`` a quarter of the time. The base therefore judges about 95%
of lines right, and its pass rate falls with the file's length (0.95^N): RL on the checker's reward has to
fix exactly the verdicts the demonstrations got wrong, and long files are where that shows.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

import torch

from lrl.envs.review.tasks import MAX_LINES, make_reviews, random_review
from lrl.policy import make_policy
from lrl.warmstart import (
    cached_policy,
    fit_demonstrations,
    fixed_threads,
    source_fingerprint,
    tokenizer_fingerprint,
)

DEMO_SEED = 2718
NOISE = {"min": ("ok", 0.5), "max": ("bad", 0.25)}  # operator -> (wrong label, how often the demos use it)
CONTEXT = 1024


@dataclass(frozen=True)
class ReviewBaseConfig:
    """Hyper-parameters of the warm start; part of the cache key."""

    steps: int = 500
    """first phase: files log-uniform in [20, max_lines] lines (cheap; learns the format and the rule)"""
    max_lines: int = 60
    long_steps: int = 200
    """second phase: files up to the environment's longest, so that late pages are judged like early ones"""
    batch_size: int = 16
    lr: float = 3e-3
    seed: int = 0
    threads: int = 2


def demonstration(task, tok, rng: random.Random) -> tuple[list[int], list[bool]]:
    """One whole episode with the noisy labels -> token ids and a loss flag per token."""
    ids = tok.prompt(task.prompt)
    loss = [False] * len(ids)
    for page in range(task.n_pages):
        verdicts = []
        for i, k in enumerate(task.page_lines(page), 1):
            label = task.verdict(k)
            wrong, rate = NOISE.get(task.ops[k - 1], (label, 0.0))
            verdicts.append(f"{i} {wrong if rng.random() < rate else label}")
        action = tok.encode(" ".join(verdicts)) + [tok.eos_id]
        ids += action
        loss += [True] * len(action)
        if page + 1 < task.n_pages:
            obs = tok.observation(task.page_text(page + 1))
            ids += obs
            loss += [False] * len(obs)
    return ids, loss


def train_review_base(tok, cfg: ReviewBaseConfig = ReviewBaseConfig(), log_every: int = 0) -> torch.nn.Module:
    """Supervised warm start from scratch -> the review RL base (deterministic for a given cfg)."""
    rng = random.Random(DEMO_SEED + cfg.seed)
    fixed = {t.ops for t in make_reviews("all")}

    def draw(step: int):
        out = []
        while len(out) < cfg.batch_size:
            task = random_review(rng, hi=cfg.max_lines if step < cfg.steps else MAX_LINES)
            if task.ops not in fixed:
                out.append(demonstration(task, tok, rng))
        return out

    with fixed_threads(cfg.threads):
        model = make_policy(tok, seed=cfg.seed, max_position_embeddings=CONTEXT)
        return fit_demonstrations(model, draw, cfg.steps + cfg.long_steps, cfg.lr, tok.pad_id, log_every)


def review_base_key(tok, cfg: ReviewBaseConfig) -> str:
    """Cache key: the warm-start config, the vocabulary, the model size and context, the label noise, and the
    code that draws the demonstrations and trains on them."""
    import sys

    from lrl.envs.review import tasks
    from lrl.policy import DEFAULT_SIZE, make_policy

    code = source_fingerprint(sys.modules[__name__], tasks, fit_demonstrations, make_policy)
    blob = json.dumps(
        ["review", asdict(cfg), tokenizer_fingerprint(tok), DEFAULT_SIZE, CONTEXT, NOISE, code],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_review_base(
    tok, cfg: ReviewBaseConfig = ReviewBaseConfig(), cache: bool = True, verbose: bool = False
):
    """The review RL base, loaded from the cache or trained once and saved there (atomically)."""
    build = lambda: train_review_base(tok, cfg, log_every=50 if verbose else 0)  # noqa: E731
    return cached_policy(f"review-base-{review_base_key(tok, cfg)}", tok, build, cache, verbose)
