"""The episode loop: multi-turn rollouts of any environment with any decoder, and held-out evaluation.

One loop serves every sampler: the decode path is a :class:`lrl.decoding.Decoder` (trainer-style full
forwards, or an engine-style KV cache), the distribution a :class:`lrl.decoding.Sampling`, and the
environment an :class:`lrl.envs.EnvSpec`. All episodes of a call advance in lockstep, one turn at a time:
each active episode generates one action (up to the env spec's ``max_action_tokens``, ending at eos), then
every environment answers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lrl.decoding import Decoder, Sampling, TrainerStyleDecoder, sample_tokens


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
    metrics: dict[str, float] = field(default_factory=dict)  # the env's per-episode counts

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


class ContextError(ValueError):
    """An episode grew longer than the model's context."""


class Rollout:
    """The episode loop as a state machine, advanced a token (or a turn of the environments) at a time.

    The sync path runs it to the end (:func:`run_episodes`). An asynchronous worker advances it step by step:
    it switches weights at a token boundary (:meth:`switch`), adds episodes between turns (:meth:`add`), takes
    finished ones out (:meth:`take`) and hands its state over at a boundary (:meth:`state`). Episodes are kept by
    a key (their order of arrival), which is also the decoder's key for their cached state.
    """

    def __init__(
        self,
        decoder: Decoder,
        spec,
        tasks: Sequence[Any],
        generator: torch.Generator,
        sampling: Sampling | None = None,
        version: int = 0,
    ):
        self.decoder, self.spec, self.generator, self.version = decoder, spec, generator, version
        self.stop, self.budget = spec.tok.eos_id, spec.max_action_tokens
        self.sampling = sampling or Sampling()
        self.episodes: dict[int, Episode] = {}
        self.envs: dict[int, Any] = {}
        self.active: list[int] = []
        self.generating: list[int] = []
        self.actions: dict[int, list[int]] = {}
        self.step = 0  # tokens of the current action generated so far
        self.logits: torch.Tensor | None = (
            None  # next-token logits of the generating rows (None: prefill first)
        )
        self.next_key = 0
        self.add(tasks)

    @property
    def done(self) -> bool:
        return not self.active

    @property
    def between_turns(self) -> bool:
        """No action is half-generated: episodes can be added or taken out, or the state handed over cheaply."""
        return not self.generating

    def add(self, tasks: Sequence[Any]) -> list[int]:
        """Start one episode per task (between turns only) -> their keys; they take part from the next turn."""
        if self.generating:
            raise RuntimeError("episodes can only be added between turns")
        keys = []
        for task in tasks:
            env = self.spec.make()
            self.episodes[self.next_key] = Episode(task, env.reset(task))
            self.envs[self.next_key] = env
            self.active.append(self.next_key)
            keys.append(self.next_key)
            self.next_key += 1
        return keys

    def take(self, keys: Sequence[int]) -> list[Episode]:
        """Remove finished episodes -> them, in the order of `keys`."""
        out = [self.episodes.pop(k) for k in keys]
        for k in keys:
            self.envs.pop(k, None)
        return out

    @torch.no_grad()
    def advance(self) -> bool:
        """One token for every generating episode (a turn starts with a prefill), or, when every action of the
        turn is complete, one step of every active environment. -> False once every episode is done."""
        if self.done:
            return False
        if not self.generating:
            self._start_turn()
        if self.logits is None:  # a turn's first token, or the first after a weight switch or a restore
            self.logits = self.decoder.prefill(
                self.generating, [self.episodes[k].ids for k in self.generating]
            )
        token, chosen = sample_tokens(self.sampling.log_probs(self.logits), self.generator)
        token = token.tolist()
        chosen = chosen.tolist()
        for k, t, lp in zip(self.generating, token, chosen):
            self.episodes[k].extend([t], True, [lp], self.version)
            self.actions[k].append(t)
        self.step += 1
        going = [j for j, t in enumerate(token) if t != self.stop and self.step < self.budget]
        self.decoder.keep(going)
        if going:
            self.generating = [self.generating[j] for j in going]
            self.logits = self.decoder.step(torch.tensor([token[j] for j in going]))  # one decode step
            return True
        for k in self.active:
            self.episodes[k].record(self.envs[k].step(self.actions[k]))
        self.active = [k for k in self.active if not self.episodes[k].done]
        self.generating = []
        return not self.done

    def _start_turn(self) -> None:
        context = getattr(self.decoder, "context", None)
        longest = max(len(self.episodes[k].ids) for k in self.active) + self.budget
        if context is not None and longest > context:
            raise ContextError(
                f"an episode needs {longest} positions but the model's context is {context} "
                "(max_position_embeddings); lower max_turns or use a model with a longer context"
            )
        self.generating = list(self.active)
        self.actions = {k: [] for k in self.active}
        self.step = 0
        self.logits = None

    def switch(self, version: int) -> None:
        """The decoder's weights changed (to `version`) at this token boundary: later tokens are tagged with it,
        and the next one is drawn from logits the new weights compute (a fresh prefill; caches are dropped)."""
        self.version = version
        reset = getattr(self.decoder, "reset", None)
        if reset is not None:
            reset()
        self.logits = None

    def state(self) -> dict:
        """Everything needed to continue at this token boundary elsewhere (the decoder's caches are rebuilt)."""
        keys = ("episodes", "envs", "active", "generating", "actions", "step", "version", "next_key")
        return {**{k: getattr(self, k) for k in keys}, "generator": self.generator.get_state()}

    @classmethod
    def restore(cls, state: dict, decoder: Decoder, spec, sampling: Sampling | None = None) -> Rollout:
        """A rollout continuing from `state` (made by :meth:`state`) with `decoder`."""
        rollout = cls(decoder, spec, [], torch.Generator(), sampling, state["version"])
        rollout.generator.set_state(state["generator"])
        for key in ("episodes", "envs", "active", "generating", "actions", "step", "next_key"):
            setattr(rollout, key, state[key])
        return rollout


def run_episodes(
    decoder: Decoder,
    spec,
    tasks: Sequence[Any],
    generator: torch.Generator,
    sampling: Sampling | None = None,
    version: int = 0,
) -> list[Episode]:
    """Roll out one episode per task with `decoder`; every generated token is tagged with `version`.

    ``spec`` is an :class:`lrl.envs.EnvSpec` (its ``make``, ``max_action_tokens`` and ``tok.eos_id``).
    """
    rollout = Rollout(decoder, spec, tasks, generator, sampling, version)
    while rollout.advance():
        pass
    return list(rollout.episodes.values())


def summarize(episodes: Sequence[Episode], metrics: Sequence[str] = ()) -> dict[str, float]:
    """pass_rate (mean reward), invalid, length (tokens per episode), action_tokens, episodes, and the mean of
    each of the env's metrics."""
    n = max(len(episodes), 1)
    out = {
        "pass_rate": sum(e.reward for e in episodes) / n,
        "invalid": sum(e.invalid for e in episodes) / n,
        "length": sum(len(e.ids) for e in episodes) / n,
        "action_tokens": sum(e.action_tokens for e in episodes) / n,
        "episodes": len(episodes),
    }
    out.update({m: sum(e.metrics.get(m, 0.0) for e in episodes) / n for m in metrics})
    return out


@torch.no_grad()
def evaluate(
    model,
    spec,
    tasks: Sequence[Any] | None = None,
    episodes_per_task: int = 16,
    seed: int = 0,
    temperature: float = 1.0,
    per_task: bool = False,
) -> dict:
    """Sample `episodes_per_task` episodes per task (default: the env spec's held-out tasks) -> summarize(...);
    with ``per_task``, also ``tasks``: {task_id: the same summary over that task's episodes}. Trainer-style
    decoding, or the KV-cache decoder when the env spec asks for it (long episodes)."""
    tasks = spec.heldout_tasks if tasks is None else tasks
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    batch_tasks = [t for t in tasks for _ in range(episodes_per_task)]
    if spec.eval_decode == "kvcache":  # long episodes: one position per decode step (lrl/kvcache.py)
        from lrl.kvcache import KVCacheDecoder

        decoder = KVCacheDecoder(model, spec.tok.pad_id)
    else:
        decoder = TrainerStyleDecoder(model, spec.tok.pad_id)
    episodes = run_episodes(decoder, spec, batch_tasks, generator, Sampling(temperature))
    model.train(was_training)
    out = summarize(episodes, spec.metrics)
    if per_task:
        by_task: dict[int, list[Episode]] = {}
        for e in episodes:
            by_task.setdefault(e.task.task_id, []).append(e)
        out["tasks"] = {tid: summarize(eps, spec.metrics) for tid, eps in by_task.items()}
    return out
