"""BugFixEnv: the TinyAgent environment, one bug-fix task per episode.

Actions are token sequences ending in ``<eos>``: ``read <eos>`` shows the numbered source, ``answer K <eos>``
ends the episode with reward 1 if K is the buggy line, else 0. Anything else is malformed: the episode ends
with reward 0 and is marked ``invalid``. An episode that reaches ``max_turns`` without answering ends with
reward 0 and is marked ``truncated``.

The env can also stand in for an unreliable worker (seed 13.7): with ``failure_rate`` and/or
``failure_hazard`` set, each turn fails with probability ``1 - (1 - failure_rate) * exp(-failure_hazard * n)``,
where ``n`` counts the tokens the turn adds to the episode (the prompt counts toward the first turn). A whole
episode therefore survives with probability ``(1 - rate)^turns * exp(-hazard * length)``: long episodes fail
more often. A failed turn ends the episode with ``info["env_failure"]``; its reward is not a score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

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

    def __init__(self, tok: WordTokenizer, max_turns: int = 3, failure_rate: float = 0.0,
                 failure_hazard: float = 0.0, generator: torch.Generator | None = None):  # fmt: skip
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1; got {max_turns}")
        if not 0 <= failure_rate < 1:
            raise ValueError(f"failure_rate must be in [0, 1); got {failure_rate}")
        if not (failure_hazard >= 0 and math.isfinite(failure_hazard)):
            raise ValueError(f"failure_hazard must be finite and >= 0; got {failure_hazard}")
        if (failure_rate or failure_hazard) and generator is None:
            raise ValueError("failure injection needs a torch.Generator, so that failures are reproducible")
        self.tok, self.max_turns = tok, max_turns
        self.failure_rate, self.failure_hazard, self.generator = failure_rate, failure_hazard, generator
        self._read, self._answer = tok.id("read"), tok.id("answer")
        self.task: Task | None = None
        self.turns, self.failed = 0, False

    def reset(self, task: Task) -> list[int]:
        """Start an episode on `task`; returns the prompt ids, beginning with <bos>."""
        self.task, self.turns, self.reads, self.done, self.failed = task, 0, 0, False, False
        prompt = [self.tok.bos_id] + self.tok.encode(task.prompt)
        self._unbilled = len(prompt)  # tokens the worker has handled that no failure draw has covered yet
        return prompt

    def failure_probability(self, n_tokens: int) -> float:
        """Chance that a turn adding `n_tokens` tokens ends in a worker failure."""
        return 1.0 - (1.0 - self.failure_rate) * math.exp(-self.failure_hazard * n_tokens)

    def _worker_fails(self, n_tokens: int) -> bool:
        if not (self.failure_rate or self.failure_hazard):
            return False  # no draw: a run without injection consumes no randomness here
        n, self._unbilled = n_tokens + self._unbilled, 0
        return torch.rand((), generator=self.generator).item() < self.failure_probability(n)

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
        """Apply one action of the agent; with failure injection on, the worker may fail instead."""
        if self.task is None or self.done:
            raise RuntimeError("step() called on an episode that is not running; call reset(task) first")
        result = self._advance(list(action))
        if self._worker_fails(len(action) + len(result.observation)):
            self.done = self.failed = True
            info = {"action": "env_failure", "invalid": False, "truncated": False, "env_failure": True}
            return StepResult([], 0.0, True, info)
        return result

    def _advance(self, action: list[int]) -> StepResult:
        """The agent's action as a healthy worker answers it."""
        self.turns += 1
        kind, value = self.parse(action)
        info = {"action": kind, "invalid": kind == "invalid", "truncated": False, "env_failure": False}
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
