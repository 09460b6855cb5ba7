"""The review RL base: a supervised warm start on demonstrations whose labels are wrong for two operators.

Demonstrations are whole episodes on generated files (never one of the 60 fixed tasks), with loss on every
token of every action. Their labels follow the rule, except that a ``min`` line (suspect) is labelled ``ok``
half of the time and a ``max`` line (safe) ``bad`` a quarter of the time. The base therefore judges about 95%
of lines right, and its pass rate falls with the file's length (0.95^N): RL on the checker's reward has to
fix exactly the verdicts the demonstrations got wrong, and long files are where that shows.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from functools import cache

from lrl.envs.review import tasks
from lrl.envs.review.tasks import MAX_LINES, make_reviews, random_review
from lrl.warmstart import Demo, WarmStart, WarmStartOptions

DEMO_SEED = 2718
NOISE = {"min": ("ok", 0.5), "max": ("bad", 0.25)}  # operator -> (wrong label, how often the demos use it)
CONTEXT = 1024


@dataclass(frozen=True)
class ReviewBaseConfig(WarmStartOptions):
    """Hyper-parameters of the warm start; part of the cache key. The first phase (``rule_steps``) trains on files
    log-uniform in [20, max_lines] lines (cheap; it learns the format and the rule); the second on files up to the
    environment's longest, so that late pages are judged like early ones."""

    rule_steps: int = 500
    steps: int = 200
    batch_size: int = 16
    max_lines: int = 60


def demonstration(task, tok, rng: random.Random) -> Demo:
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


@cache
def _fixed() -> frozenset:
    """The fixed tasks' files, which no demonstration is drawn on."""
    return frozenset(t.ops for t in make_reviews("all"))


def draw(tok, rng: random.Random, hp: ReviewBaseConfig, step: int) -> list[Demo]:
    """A step's demonstrations: files of at most ``max_lines`` lines for the first ``rule_steps``, then any."""
    out = []
    while len(out) < hp.batch_size:
        task = random_review(rng, hi=hp.max_lines if step < hp.rule_steps else MAX_LINES)
        if task.ops not in _fixed():
            out.append(demonstration(task, tok, rng))
    return out


RL_BASE = WarmStart(
    "review-base", ReviewBaseConfig(), draw, DEMO_SEED, code=(sys.modules[__name__], tasks), extra=(NOISE,),
    size={"max_position_embeddings": CONTEXT}, log_every=50,
)  # fmt: skip
