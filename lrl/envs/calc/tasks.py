"""calc tasks: short problems over two-digit numbers whose answer is one arithmetic expression.

A task names two numbers, as a plain question or in a story; the answer is ``a op b`` for one of +, -, * (a
difference is never negative). Tasks are generated from a seed; the train and held-out splits are fixed sets of distinct problems
that never share a (story, a, b) triple, nor a pair of numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# (story with {a} and {b}, the operator that answers it): three plain questions, eight stories whose expression the
# model must build itself
STORIES: tuple[tuple[str, str], ...] = (
    ("What is {a} * {b}?", "*"),
    ("What is {a} + {b}?", "+"),
    ("What is {a} - {b}?", "-"),
    ("A box holds {a} pencils. How many pencils are in {b} boxes?", "*"),
    ("A train has {a} cars with {b} seats each. How many seats does it have?", "*"),
    ("Each of {a} students reads {b} pages. How many pages do they read in all?", "*"),
    ("A farm has {a} rows of {b} trees. How many trees is that?", "*"),
    ("Tom had {a} marbles and won {b} more. How many marbles does he have now?", "+"),
    ("A shelf holds {a} books and another holds {b}. How many books are on both?", "+"),
    ("A bus carried {a} people and {b} got off. How many are still on the bus?", "-"),
    ("Ann saved {a} coins and spent {b} of them. How many coins are left?", "-"),
)
SPLIT_SEED = 4242
N_TRAIN, N_HELDOUT = 512, 64


@dataclass(frozen=True)
class CalcTask:
    """One problem: ``answer`` is the value of ``a op b``."""

    task_id: int
    story: int  # index into STORIES
    a: int
    b: int

    @property
    def op(self) -> str:
        return STORIES[self.story][1]

    @property
    def expression(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def answer(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def prompt(self) -> str:
        return STORIES[self.story][0].format(a=self.a, b=self.b)

    @property
    def kind(self) -> str:
        """'plain' (the question states the expression) or 'story' (the model must build it): the part of the
        held-out set a run's pass rate comes from."""
        return "plain" if self.story < PLAIN else "story"


PLAIN = 3  # the first three entries of STORIES are plain questions: half the problems are drawn among them


def draw(rng: random.Random, task_id: int) -> CalcTask:
    story = rng.randrange(PLAIN) if rng.random() < 0.5 else rng.randrange(PLAIN, len(STORIES))
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    if STORIES[story][1] == "-" and b > a:
        a, b = b, a
    return CalcTask(task_id, story, a, b)


def make_calc_tasks(split: str) -> list[CalcTask]:
    """The fixed train (512) or held-out (64) problems, or 'all'; no pair of numbers is in both splits."""
    rng = random.Random(SPLIT_SEED)
    heldout: list[CalcTask] = []
    train: list[CalcTask] = []
    pairs_held: set[tuple[int, int]] = set()
    pairs_train: set[tuple[int, int]] = set()
    while len(heldout) < N_HELDOUT or len(train) < N_TRAIN:
        task = draw(rng, len(heldout) + len(train))
        pair = (min(task.a, task.b), max(task.a, task.b))
        if len(heldout) < N_HELDOUT and pair not in pairs_train and pair not in pairs_held:
            heldout.append(task)
            pairs_held.add(pair)
        elif len(train) < N_TRAIN and pair not in pairs_held and pair not in pairs_train:
            train.append(task)
            pairs_train.add(pair)
    if split == "train":
        return train
    if split == "heldout":
        return heldout
    if split == "all":
        return train + heldout
    raise ValueError(f"split must be train, heldout or all; got {split!r}")
