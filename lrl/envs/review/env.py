"""ReviewEnv: judge every line of a file, a page per turn; the checker passes the episode only if all are right.

Turn k shows page k (up to PAGE lines, ``K op ;``, K counting from 1 within the page); the action is the page's
verdicts, ``K ok`` or ``K bad`` for each of its lines in order, then eos. After the last page the episode ends with reward 1 if every verdict was
right, else 0. An action that is not exactly the page's line numbers, each with a verdict, is malformed:
the episode ends ``invalid`` with reward 0. ``info["metrics"]`` counts ``wrong`` verdicts and ``lines``.
"""

from __future__ import annotations

from lrl.envs.base import StepResult
from lrl.envs.review.tasks import PAGE, ReviewTask


class ReviewEnv:
    """reset(task) -> prompt ids (with the first page); step(verdict ids) -> StepResult."""

    def __init__(self, tok, max_turns: int = 14):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1; got {max_turns}")
        self.tok = tok
        self.max_turns = max_turns
        self.task: ReviewTask | None = None
        self.page = 0
        self.wrong = 0
        self.done = False

    def reset(self, task: ReviewTask) -> list[int]:
        self.task = task
        self.page = 0
        self.wrong = 0
        self.done = False
        return self.tok.prompt(task.prompt)

    def parse(self, action: list[int]) -> list[str] | None:
        """The page's verdicts in line order, or None for a malformed action."""
        if not action or action[-1] != self.tok.eos_id:
            return None
        words = self.tok.decode(action[:-1], skip_special=False).split()
        n = len(self.task.page_lines(self.page))
        if len(words) != 2 * n:
            return None
        numbers, verdicts = words[0::2], words[1::2]
        if numbers != [str(k) for k in range(1, n + 1)] or any(v not in ("ok", "bad") for v in verdicts):
            return None
        return verdicts

    def step(self, action: list[int]) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() called on an episode that is not running; call reset(task) first")
        verdicts = self.parse(list(action))
        if verdicts is None:
            self.done = True
            info = {"invalid": True, "truncated": False, "metrics": {"lines": float(self.task.n_lines)}}
            return StepResult([], 0.0, True, info)
        truth = self.task.page_verdicts(self.page)
        wrong = sum(v != t for v, t in zip(verdicts, truth))
        self.wrong += wrong
        self.page += 1
        info = {"invalid": False, "truncated": False, "metrics": {"wrong": float(wrong)}}
        if self.page < self.task.n_pages and self.page >= self.max_turns:  # out of turns: not a pass
            self.done = True
            info["truncated"] = True
            info["metrics"]["lines"] = float(self.task.n_lines)
            return StepResult([], 0.0, True, info)
        if self.page < self.task.n_pages:
            return StepResult(self.tok.observation(self.task.page_text(self.page)), 0.0, False, info)
        self.done = True
        info["metrics"]["lines"] = float(self.task.n_lines)
        return StepResult([], float(self.wrong == 0), True, info)


def action_budget(tok) -> int:
    """Tokens of the longest action: a full page of verdicts, and eos."""
    return len(tok.encode(" ".join(f"{k} bad" for k in range(1, PAGE + 1)))) + 1
