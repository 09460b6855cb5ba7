"""Review: a long-horizon environment. Judge every line of a file, a page per turn; pass only if all are right.

Files are 20 to 140 lines long (whole pages of 10, log-uniform), so an episode generates about 40 to 300
tokens over 2 to 14 turns, and a batch mixes episodes of very different lengths. Registered as ``review``; see docs/review.md.
"""

from __future__ import annotations

from lrl.envs.base import EnvSpec
from lrl.envs.review.env import ReviewEnv, action_budget
from lrl.envs.review.tasks import MAX_LINES, PAGE, ReviewTask, make_reviews, random_review, review_words
from lrl.registry import ENVS
from lrl.sections import EnvironmentOptions
from lrl.tokenizers import WordTokenizer


def review_tokenizer() -> WordTokenizer:
    return WordTokenizer(review_words())


def review_spec(tok=None, max_turns: int = 14) -> EnvSpec:
    """The review environment's EnvSpec for a tokenizer (None: its word tokenizer) and turn limit."""
    from lrl.envs.review.base import RL_BASE

    tok = tok if tok is not None else review_tokenizer()
    return EnvSpec(
        name="review",
        tok=tok,
        make=lambda: ReviewEnv(tok, max_turns),
        train_tasks=make_reviews("train"),
        heldout_tasks=make_reviews("heldout"),
        max_action_tokens=action_budget(tok),
        metrics=("wrong", "lines"),
        warm_start=lambda: RL_BASE.policy(tok, verbose=True),
        eval_decode="kvcache",
        max_episode_tokens=longest_episode(tok, max_turns),
        actions=example_actions(),
    )


def example_actions() -> tuple[str, ...]:
    """Well-formed actions: a full page of verdicts of each kind, and one of each on a one-line page."""
    full = range(1, PAGE + 1)
    return ("1 ok", "1 bad", " ".join(f"{k} ok" for k in full), " ".join(f"{k} bad" for k in full))


def longest_episode(tok, max_turns: int) -> int:
    """Tokens of the longest possible episode: the longest file, every page answered in full."""
    task = ReviewTask(-1, ("+",) * MAX_LINES)
    pages = min(task.n_pages, max_turns)
    observations = sum(len(tok.observation(task.page_text(p))) for p in range(1, pages))
    return len(tok.prompt(task.prompt)) + observations + pages * action_budget(tok)


INSTRUCTIONS = (
    "You review a program one page at a time. Judge every line of the page, in order: reply with each line's "
    "number followed by ok or bad, on one line and nothing else, for example '1 ok 2 bad 3 ok'."
)
REVIEW_DEFAULTS = {
    "max_turns": 14,
    "sampler": "engine",
    "tasks_per_step": 8,
    "episodes_per_task": 8,  # 4 per task collapsed into malformed actions (docs/results/review.md)
    "minibatches": 2,
    "eval_episodes": 4,
    "eval_every": 10,
}


@ENVS.register("review", uses=("max_turns",), defaults=REVIEW_DEFAULTS, instructions=INSTRUCTIONS)
def review(environment: EnvironmentOptions, tok=None) -> EnvSpec:
    """judge every line of a 20-140 line file, a page per turn (long, varied episodes; reward 1 if all right)"""
    return review_spec(tok, environment.max_turns)


__all__ = [
    "ReviewEnv",
    "ReviewTask",
    "make_reviews",
    "random_review",
    "review_spec",
    "review_tokenizer",
    "MAX_LINES",
    "PAGE",
]
