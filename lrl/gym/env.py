"""BugFixEnv: the TinyAgent environment, one bug-fix task per episode.

Actions are token sequences ending in ``<eos>``: ``read <eos>`` shows the numbered source, ``answer K <eos>``
ends the episode with reward 1 if K is the buggy line, else 0. Anything else is malformed: the episode ends
with reward 0 and is marked ``invalid``. An episode that reaches ``max_turns`` without answering ends with
reward 0 and is marked ``truncated``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lrl.gym.tasks import Task
from lrl.gym.tokenizer import WordTokenizer


@dataclass
class StepResult:
    """What one action returns: observation ids to append, reward, whether the episode ended, and why."""

    observation: list[int]
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class BugFixEnv:
    """reset(task) -> prompt ids; step(action ids) -> StepResult."""

    def __init__(self, tok: WordTokenizer, max_turns: int = 3):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1; got {max_turns}")
        self.tok, self.max_turns = tok, max_turns
        self._read, self._answer = tok.id("read"), tok.id("answer")
        self.task: Task | None = None

    def reset(self, task: Task) -> list[int]:
        """Start an episode on `task`; returns the prompt ids, beginning with <bos>."""
        self.task, self.turns, self.reads, self.done = task, 0, 0, False
        return [self.tok.bos_id] + self.tok.encode(task.prompt)

    def parse(self, action: list[int]) -> tuple[str, int | None]:
        """Action ids -> ('read', None), ('answer', K) or ('invalid', None)."""
        eos = self.tok.eos_id
        if action == [self._read, eos]:
            return "read", None
        if len(action) == 3 and action[0] == self._answer and action[2] == eos:
            word = self.tok.vocab[action[1]]
            if word.isdigit() and int(word) in self.task.candidates:
                return "answer", int(word)
        return "invalid", None

    def step(self, action: list[int]) -> StepResult:
        """Apply one action of the agent."""
        if self.task is None or self.done:
            raise RuntimeError("step() called on an episode that is not running; call reset(task) first")
        self.turns += 1
        kind, value = self.parse(list(action))
        info = {"action": kind, "invalid": kind == "invalid", "truncated": False}
        if kind == "answer":
            self.done = True
            return StepResult([], float(value == self.task.answer), True, info)
        if kind == "invalid":
            self.done = True
            return StepResult([], 0.0, True, info)
        self.reads += 1
        if self.turns >= self.max_turns:
            self.done = True
            info["truncated"] = True
            return StepResult([], 0.0, True, info)
        return StepResult(self.tok.encode(self.task.source), 0.0, False, info)
