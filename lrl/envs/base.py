"""The environment interface: what the rollout loop, the stream, evaluation and the callbacks need of a task.

An environment is reset on a task and stepped with the token ids of one action; it answers with the
observation's token ids, a reward, whether the episode ended, and an ``info`` dict (``invalid``,
``truncated`` and ``metrics``, per-episode counts such as TinyAgent's reads). It knows tasks, observations
and rewards; it knows nothing of samplers, versions or worker failures: :class:`FailureInjection` wraps any
environment to stand in for an unreliable worker.

An :class:`EnvSpec` is what a registered environment factory ``fn(environment, tok) -> EnvSpec`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from lrl.sections import PolicyOptions


@dataclass
class StepResult:
    """What one action returns: observation ids to append, reward, whether the episode ended, and why."""

    observation: list[int]
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Env(Protocol):
    def reset(self, task: Any) -> list[int]:
        """Start an episode on `task` -> the prompt's token ids."""

    def step(self, action: list[int]) -> StepResult:
        """Apply the ids of one action (ending with the tokenizer's eos when well formed)."""


@dataclass
class EnvSpec:
    """A registered environment, ready to run: tokenizer, env factory, task lists and action budget.

    Tasks are any objects with an integer ``task_id`` (episodes of one task form an advantage group).
    """

    name: str
    tok: Any
    make: Callable[[], Env]  # a fresh env for one episode
    train_tasks: Sequence[Any]
    heldout_tasks: Sequence[Any]
    max_action_tokens: int  # the longest action of one turn, its eos included
    metrics: tuple[str, ...] = ()  # per-episode counts in info["metrics"], logged as train/<m> and val/<m>
    warm_start: Callable[[], torch.nn.Module] | None = None  # the env's RL base policy, if it has one
    eval_decode: str = "trainer"  # held-out evaluation decodes "trainer"-style, or with a "kvcache"
    max_episode_tokens: int | None = None  # an upper bound on an episode's length, for the memory estimate
    actions: tuple[str, ...] = ()  # examples of well-formed actions: the run's tokenizer must spell them
    counters: tuple[str, ...] = ()  # per-episode counts in info["metrics"] logged as env/<m>, summed per step


class FailureInjection:
    """Wraps an env: each turn the worker fails with probability ``1 - (1 - rate) * exp(-hazard * n)``.

    ``n`` counts the tokens the turn adds to the episode (the prompt counts toward the first turn), so a
    whole episode survives with probability ``(1 - rate)^turns * exp(-hazard * length)``: long episodes
    fail more often. A failed turn ends the episode with ``info["env_failure"]``; its reward is not a score.
    Without rate or hazard no random number is drawn.

    Each episode draws its failures from a generator of its own, seeded from ``generator`` when it is reset:
    what fails does not depend on the order in which concurrent episodes' tools answer, and an episode in
    flight is saved and resumed exactly (:meth:`state`, :meth:`replay`).
    """

    def __init__(
        self, env: Env, rate: float = 0.0, hazard: float = 0.0, generator: torch.Generator | None = None
    ):
        if not 0 <= rate < 1:
            raise ValueError(f"failure rate must be in [0, 1); got {rate}")
        if not (hazard >= 0 and math.isfinite(hazard)):
            raise ValueError(f"failure hazard must be finite and >= 0; got {hazard}")
        if (rate or hazard) and generator is None:
            raise ValueError("failure injection needs a torch.Generator, so that failures are reproducible")
        self.env = env
        self.rate = rate
        self.hazard = hazard
        self.generator = generator
        self.own = torch.Generator()  # this episode's draws
        self.turns = 0
        self.failed = False
        self._unbilled = 0

    @property
    def active(self) -> bool:
        return bool(self.rate or self.hazard)

    def reset(self, task) -> list[int]:
        prompt = self.env.reset(task)
        self.turns = 0
        self.failed = False
        self._unbilled = len(prompt)  # tokens the worker has handled that no failure draw has covered yet
        if self.active:
            self.own.manual_seed(int(torch.randint(2**62, (), generator=self.generator)))
        return prompt

    def failure_probability(self, n_tokens: int) -> float:
        """Chance that a turn adding `n_tokens` tokens ends in a worker failure."""
        return 1.0 - (1.0 - self.rate) * math.exp(-self.hazard * n_tokens)

    def step(self, action: list[int]) -> StepResult:
        result = self.env.step(action)
        self.turns += 1
        if self.active:
            n = len(action) + len(result.observation) + self._unbilled
            self._unbilled = 0
            if torch.rand((), generator=self.own).item() < self.failure_probability(n):
                self.failed = True
                info = {"invalid": False, "truncated": False, "env_failure": True}
                return StepResult([], 0.0, True, info)
        return result

    def replay(self, task, actions) -> list[int]:
        """Rebuild the wrapped env from an episode's answered actions without drawing anything -> its tokens."""
        tokens = list(self.env.reset(task))
        for action in actions:
            tokens += list(action) + list(self.env.step(list(action)).observation)
        self.turns = len(actions)
        self.failed = False
        self._unbilled = 0 if actions else len(tokens)
        return tokens

    def state(self) -> dict:
        return {"own": self.own.get_state(), "turns": self.turns, "unbilled": self._unbilled}

    def load_state(self, state: dict) -> None:
        self.own.set_state(state["own"])
        self.turns = state["turns"]
        self._unbilled = state["unbilled"]


def small_number(word: str, most: int) -> int | None:
    """The value of `word` when it is ASCII digits naming a number in [0, most], else None. A reply's word never
    reaches ``int()`` unchecked: ``str.isdigit`` is true of superscripts (which ``int`` refuses) and of every
    script's digits, and ``int`` refuses a word of more than 4,300 digits."""
    if not (word.isascii() and word.isdigit()):
        return None
    digits = word.lstrip("0") or "0"
    if len(digits) > len(str(most)):
        return None
    value = int(digits)
    return value if value <= most else None


def episode_metrics(spec: EnvSpec, episodes) -> dict[str, float]:
    """Mean of every env metric over episodes -> {name: mean}."""
    n = max(len(episodes), 1)
    return {m: sum(e.metrics.get(m, 0.0) for e in episodes) / n for m in spec.metrics}


def tokenizer_option(policy: PolicyOptions, env: str) -> str:
    """The option the run's tokenizer came from (environment `env`'s own when neither gives one)."""
    if policy.tokenizer is not None:
        return f"tokenizer: {policy.tokenizer!r}"
    if policy.model is not None:
        return f"model: the tokenizer saved with {policy.model!r}"
    return f"env: the {env} environment's own tokenizer"
