"""TinyAgent tasks: a short source file (prefix notation, `K : op a b ;`) with exactly one buggy line, an issue, and 5 candidate answers.

The rule an agent can learn: every operator belongs to a *safe* or a *suspect* set, and the buggy line is
the one line whose operator is suspect. The issue names the function and the symptom but not the line, so
the information needed to answer is only in the source, which the agent sees only after a ``read``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

N_LINES = 5
LINE_FORMAT = "{op} {left} {right}"
SAFE_OPS = ("+", "*", "<", "==", "and", "max")
SUSPECT_OPS = ("-", "/", ">", "!=", "or", "min")
VARIABLES = ("a", "b", "c", "d", "n", "i", "j", "k", "x", "y", "z", "total", "count", "size", "step", "acc")
FUNCTIONS = (
    "parse",
    "scale",
    "merge",
    "clamp",
    "window",
    "score",
    "index",
    "split",
    "pack",
    "rank",
    "shift",
    "blend",
    "count_up",
    "reduce",
    "norm",
    "offset",
    "bucket",
    "fold",
    "probe",
    "trim",
)
SYMPTOMS = ("returns a wrong value", "fails the unit test", "gives an off result", "breaks on large input")
SPLIT_SEED = 1729  # fixes the 30 evaluation tasks
N_TRAIN = 20
N_HELDOUT = 10


@dataclass(frozen=True)
class Task:
    """One bug-fix task: `answer` is the 1-based number of the buggy line, one of `candidates`."""

    task_id: int
    issue: str
    lines: tuple[str, ...]
    answer: int
    candidates: tuple[int, ...] = tuple(range(1, N_LINES + 1))

    @property
    def prompt(self) -> str:
        """What the agent sees before acting: the issue and the candidate line numbers."""
        return f"issue : {self.issue} . candidates {' '.join(map(str, self.candidates))} ."

    @property
    def source(self) -> str:
        """The numbered source file, the observation of a `read`."""
        return " ".join(f"{i} {line} ;" for i, line in enumerate(self.lines, 1))


def random_task(rng: random.Random, task_id: int = -1) -> Task:
    """Draw one task from `rng`: N_LINES assignments, one with a suspect operator."""
    func = rng.choice(FUNCTIONS)
    bug = rng.randrange(N_LINES)
    lines = []
    for i in range(N_LINES):
        op = rng.choice(SUSPECT_OPS if i == bug else SAFE_OPS)
        target, left, right = rng.sample(VARIABLES, 3)
        lines.append(LINE_FORMAT.format(target=target, left=left, op=op, right=right))
    issue = f"{func} {rng.choice(SYMPTOMS)}"
    return Task(task_id=task_id, issue=issue, lines=tuple(lines), answer=bug + 1)


def make_tasks(split: str = "all") -> list[Task]:
    """The 30 fixed evaluation tasks: `train` (20), `heldout` (10) or `all` (30), deterministic."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all'; got {split!r}")
    rng = random.Random(SPLIT_SEED)
    tasks: list[Task] = []
    seen: set[tuple[str, ...]] = set()
    while len(tasks) < N_TRAIN + N_HELDOUT:
        task = random_task(rng, len(tasks))
        if task.lines not in seen:
            seen.add(task.lines)
            tasks.append(task)
    return {"train": tasks[:N_TRAIN], "heldout": tasks[N_TRAIN:], "all": tasks}[split]


def vocabulary_words() -> list[str]:
    """Every word the gym can ever emit (tasks, demonstrations, actions), so no text is out of vocabulary."""
    words = {"issue", ":", ".", ";", "=", "candidates", "read", "answer"}
    words.update(SAFE_OPS + SUSPECT_OPS + VARIABLES + FUNCTIONS)
    words.update(w for s in SYMPTOMS for w in s.split())
    words.update(str(i) for i in range(1, N_LINES + 1))
    return sorted(words)
