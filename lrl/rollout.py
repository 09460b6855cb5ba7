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


@torch.no_grad()
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
    stop = spec.tok.eos_id
    budget = spec.max_action_tokens
    sampling = sampling or Sampling()
    envs = [spec.make() for _ in tasks]
    episodes = [Episode(task, env.reset(task)) for task, env in zip(tasks, envs)]
    context = getattr(decoder, "context", None)
    active = list(range(len(episodes)))
    while active:
        longest = max(len(episodes[i].ids) for i in active) + budget
        if context is not None and longest > context:
            raise ContextError(
                f"an episode needs {longest} positions but the model's context is {context} "
                "(max_position_embeddings); lower max_turns or use a model with a longer context"
            )
        logits = decoder.prefill(active, [episodes[i].ids for i in active])  # [b, V]
        actions: dict[int, list[int]] = {i: [] for i in active}
        generating = list(active)
        for step in range(budget):
            token, chosen = sample_tokens(sampling.log_probs(logits), generator)
            token = token.tolist()
            chosen = chosen.tolist()
            for i, t, lp in zip(generating, token, chosen):
                episodes[i].extend([t], True, [lp], version)
                actions[i].append(t)
            going = [j for j, t in enumerate(token) if t != stop and step + 1 < budget]
            decoder.keep(going)
            if not going:
                break
            generating = [generating[j] for j in going]
            logits = decoder.step(torch.tensor([token[j] for j in going]))  # one decode step
        for i in active:
            episodes[i].record(envs[i].step(actions[i]))
        active = [i for i in active if not episodes[i].done]
    return episodes


@torch.no_grad()
def evaluate(
    model,
    spec,
    tasks: Sequence[Any] | None = None,
    episodes_per_task: int = 16,
    seed: int = 0,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Sample `episodes_per_task` episodes per task (default: the env spec's held-out tasks), trainer-style.

    -> pass_rate (mean reward), invalid, length (tokens per episode), action_tokens, episodes, and the
    mean of each of the env's metrics.
    """
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
    n = len(episodes)
    out = {
        "pass_rate": sum(e.reward for e in episodes) / n,
        "invalid": sum(e.invalid for e in episodes) / n,
        "length": sum(len(e.ids) for e in episodes) / n,
        "action_tokens": sum(e.action_tokens for e in episodes) / n,
        "episodes": n,
    }
    out.update({m: sum(e.metrics.get(m, 0.0) for e in episodes) / n for m in spec.metrics})
    return out
