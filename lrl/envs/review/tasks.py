"""Review tasks: a file of N lines, each an operator, to be judged line by line (``ok`` or ``bad``).

A page shows PAGE lines, numbered 1 to PAGE within the page, as ``K op``; an operator is safe (``+ * < == and max``: the line is ``ok``) or suspect
(``- / > != or min``: the line is ``bad``). Files have a whole number of pages, log-uniform between
MIN_LINES and MAX_LINES lines, so a batch mixes files that differ several-fold in length: the long-tailed
episode durations of an agent fleet. The agent sees the file a page at a time and answers each page with
its verdicts; every page has the same shape, so a long file is more of the same work, not harder work.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from lrl.envs.tinyagent.tasks import SAFE_OPS, SUSPECT_OPS

MIN_LINES, MAX_LINES = 20, 140
PAGE = 10  # lines shown per turn
BAD_SHARE = 0.2  # share of lines with a suspect operator
SPLIT_SEED = 4242
N_TRAIN, N_HELDOUT = 40, 20


@dataclass(frozen=True)
class ReviewTask:
    """One file: its operators, line by line (line K is ops[K - 1])."""

    task_id: int
    ops: tuple[str, ...]

    @property
    def n_lines(self) -> int:
        return len(self.ops)

    @property
    def n_pages(self) -> int:
        return math.ceil(len(self.ops) / PAGE)

    def verdict(self, line: int) -> str:
        """'ok' or 'bad' for 1-based line number `line`."""
        return "bad" if self.ops[line - 1] in SUSPECT_OPS else "ok"

    def page_lines(self, page: int) -> range:
        """1-based file line numbers of 0-based page `page`."""
        return range(page * PAGE + 1, min((page + 1) * PAGE, len(self.ops)) + 1)

    def page_verdicts(self, page: int) -> list[str]:
        return [self.verdict(k) for k in self.page_lines(page)]

    def page_text(self, page: int) -> str:
        """The page as the agent sees it: lines numbered from 1 within the page."""
        lines = " ".join(f"{i} {self.ops[k - 1]}" for i, k in enumerate(self.page_lines(page), 1))
        return f"page {page + 1} : {lines}"

    @property
    def prompt(self) -> str:
        return f"review : {self.n_lines} lines . {self.page_text(0)}"


def random_review(
    rng: random.Random, task_id: int = -1, lo: int = MIN_LINES, hi: int = MAX_LINES
) -> ReviewTask:
    """A file of whole pages, log-uniform in [lo, hi] lines, each line bad with probability BAD_SHARE."""
    n = PAGE * round(math.exp(rng.uniform(math.log(lo), math.log(hi))) / PAGE)
    ops = tuple(rng.choice(SUSPECT_OPS if rng.random() < BAD_SHARE else SAFE_OPS) for _ in range(n))
    return ReviewTask(task_id, ops)


def make_reviews(split: str = "all") -> list[ReviewTask]:
    """The fixed train (40) and held-out (20) files, deterministic; `all` is both."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all'; got {split!r}")
    rng = random.Random(SPLIT_SEED)
    tasks = [random_review(rng, i) for i in range(N_TRAIN + N_HELDOUT)]
    return {"train": tasks[:N_TRAIN], "heldout": tasks[N_TRAIN:], "all": tasks}[split]


def review_words() -> list[str]:
    """Every word the environment can emit."""
    words = {"review", ":", "lines", ".", "page", ";", "ok", "bad", *SAFE_OPS, *SUSPECT_OPS}
    words.update(str(i) for i in range(1, MAX_LINES + 1))  # page and file sizes; lines count 1..PAGE
    return sorted(words)
