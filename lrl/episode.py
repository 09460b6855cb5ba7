"""One episode as the rollout loop builds it: a single token sequence with per-token tags (generated or not, the
behavior log-prob, the policy version) and what its environment said (reward, failures, counts, timings); and
its environment rebuilt from its actions (:func:`replay`), as a resumed rollout does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    """One episode as a single token sequence, with per-token tags for the tokens the policy generated."""

    task: Any
    ids: list[int]
    generated: list[bool] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    reward: float = 0.0
    invalid: bool = False
    truncated: bool = False
    done: bool = False
    env_failure: bool = False  # the worker failed: no score, no gradient (see lrl.batch.collate)
    timed_out: bool = False  # the failure was a tool that did not answer within --tool-timeout
    tool_error: str = ""  # the failure was a tool that raised: its exception
    metrics: dict[str, float] = field(default_factory=dict)  # the env's per-episode counts
    actions: list[list[int]] = field(default_factory=list)  # every action handed to the env, in order
    tag: Any = None  # the caller's name for it (an episode id, a position in a batch)
    seconds: float = 0.0  # wall time from its start to its end
    generating_seconds: float = 0.0  # of which decoding its actions
    tool_seconds: float = 0.0  # of which waiting for its environment
    tool_times: list[float] = field(
        default_factory=list
    )  # each tool call's own time, when the env reports it
    call_seconds: list[float] = field(
        default_factory=list
    )  # each tool call's wall time, as the runner saw it

    def __post_init__(self):
        n = len(self.ids)
        self.generated = [False] * n
        self.logp = [0.0] * n
        self.version = [-1] * n

    def record(self, result) -> None:
        """Take in the env's StepResult for the last action: reward, flags, counts, and the observation tokens."""
        info = result.info
        self.reward += result.reward
        self.invalid |= bool(info.get("invalid", False))
        self.truncated |= bool(info.get("truncated", False))
        self.env_failure |= bool(info.get("env_failure", False))
        self.timed_out |= bool(info.get("timeout", False))
        if info.get("tool_error"):
            self.tool_error = str(info.get("detail", "error"))
        if "tool_time" in info:
            self.tool_times.append(float(info["tool_time"]))
        for name, value in info.get("metrics", {}).items():
            self.metrics[name] = self.metrics.get(name, 0.0) + float(value)
        self.done = result.done
        self.extend(result.observation, False)

    def extend(self, ids: Sequence[int], generated: bool, logp=None, version: int = -1) -> None:
        self.ids.extend(ids)
        self.generated.extend([generated] * len(ids))
        self.logp.extend(logp if logp is not None else [0.0] * len(ids))
        self.version.extend([version] * len(ids))

    @property
    def action_tokens(self) -> int:
        return sum(self.generated)

    def turns(self) -> dict:
        """The episode as its turns, the simulator's workload unit: ``{"prompt": tokens before the first action,
        "turns": [[tokens decoded, tool seconds, observation tokens], ...]}`` in order."""
        n = len(self.generated)
        pos = 0
        while pos < n and not self.generated[pos]:
            pos += 1
        prompt = pos
        turns = []
        for i, action in enumerate(self.actions):
            pos += len(action)
            obs = pos
            while pos < n and not self.generated[pos]:
                pos += 1
            tool = self.call_seconds[i] if i < len(self.call_seconds) else 0.0
            turns.append([len(action), round(tool, 5), pos - obs])
        return {"prompt": prompt, "turns": turns}

    def state(self) -> dict:
        """The episode as plain data (lists, numbers, strings): what a checkpoint keeps; the task by its id."""
        out = {k: v for k, v in vars(self).items() if k != "task"}
        out["metrics"] = dict(self.metrics)
        out["task_id"] = int(self.task.task_id)
        return out

    @classmethod
    def from_state(cls, state: dict, task) -> Episode:
        """The episode of :meth:`state`, on its task object."""
        fields = {k: v for k, v in state.items() if k not in ("task_id", "generated", "logp", "version")}
        episode = cls(task, list(state["ids"]))
        for key, value in fields.items():
            setattr(episode, key, value)
        episode.generated = list(state["generated"])
        episode.logp = list(state["logp"])
        episode.version = list(state["version"])
        return episode


class ReplayError(RuntimeError):
    """An environment replayed from its actions did not give the observations it gave the first time."""


def replay(env, episode: Episode, actions: Sequence[Sequence[int]]):
    """Rebuild `episode`'s environment: reset on its task and step its `actions` again -> the env.

    The tokens it answers must be the episode's own (a deterministic environment), else :class:`ReplayError`.
    An env wrapper may define ``replay(task, actions) -> tokens`` to rebuild without side effects (no drawn
    failures, no latency); otherwise ``reset`` and ``step`` are called.
    """
    if hasattr(env, "replay"):
        tokens = env.replay(episode.task, actions)
    else:
        tokens = list(env.reset(episode.task))
        for action in actions:
            tokens += list(action) + list(env.step(list(action)).observation)
    if tokens != episode.ids[: len(tokens)]:
        raise ReplayError(
            f"task {episode.task.task_id}: replaying {len(actions)} action(s) gave other observations"
        )
    return env
