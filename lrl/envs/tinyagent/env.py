"""BugFixEnv: the TinyAgent environment, one bug-fix task per episode.

Actions are token sequences ending in the tokenizer's eos: ``read`` shows the numbered source, ``answer K``
ends the episode with reward 1 if K is the buggy line, else 0. Anything else is malformed: the episode ends
with reward 0 and is marked ``invalid``. An episode that reaches ``max_turns`` without answering ends with
reward 0 and is marked ``truncated``. Actions are read as text (``tok.decode``), so any tokenizer works.
"""

from __future__ import annotations

from lrl.envs.base import StepResult, small_number
from lrl.envs.tinyagent.tasks import Task


class BugFixEnv:
    """reset(task) -> prompt ids; step(action ids) -> StepResult. ``info["metrics"]["reads"]`` counts reads."""

    def __init__(self, tok, max_turns: int = 3):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1; got {max_turns}")
        self.tok = tok
        self.max_turns = max_turns
        self.task: Task | None = None
        self.turns = 0
        self.reads = 0
        self.done = False

    def reset(self, task: Task) -> list[int]:
        """Start an episode on `task`; returns the prompt ids (for the word tokenizer: <bos> and the words)."""
        self.task = task
        self.turns = 0
        self.reads = 0
        self.done = False
        return self.tok.prompt(task.prompt)

    def parse(self, action: list[int]) -> tuple[str, int | None]:
        """Action ids -> ('read', None), ('answer', K) or ('invalid', None)."""
        if not action or action[-1] != self.tok.eos_id:
            return "invalid", None
        words = self.tok.decode(action[:-1], skip_special=False).split()
        if words == ["read"]:
            return "read", None
        if len(words) == 2 and words[0] == "answer":
            k = small_number(words[1], max(self.task.candidates))
            if k in self.task.candidates:
                return "answer", k
        return "invalid", None

    def step(self, action: list[int]) -> StepResult:
        """Apply one action of the agent."""
        if self.task is None or self.done:
            raise RuntimeError("step() called on an episode that is not running; call reset(task) first")
        self.turns += 1
        kind, value = self.parse(list(action))
        info = {"action": kind, "invalid": kind == "invalid", "truncated": False, "metrics": {}}
        if kind == "answer":
            self.done = True
            return StepResult([], float(value == self.task.answer), True, info)
        if kind == "invalid":
            self.done = True
            return StepResult([], 0.0, True, info)
        self.reads += 1
        info["metrics"] = {"reads": 1.0}
        if self.turns >= self.max_turns:
            self.done = True
            info["truncated"] = True
            return StepResult([], 0.0, True, info)
        return StepResult(self.tok.observation(self.task.source), 0.0, False, info)
