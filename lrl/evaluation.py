"""Held-out evaluation: episodes of the policy on the environment's held-out tasks, summarised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lrl.decoding import Sampling, TrainerStyleDecoder
from lrl.episode import Episode
from lrl.rollout import run_episodes
from lrl.sections import EvaluationOptions


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


def heldout(model, spec, options: EvaluationOptions, seed: int, train_temperature: float) -> dict:
    """The held-out evaluation a run's evaluation section asks for: ``eval_episodes`` per held-out task, sampled
    at ``eval_temperature`` (the training temperature where it is none); ``tasks`` holds each task's own summary
    (which problems a pass rate comes from)."""
    temperature = train_temperature if options.eval_temperature is None else options.eval_temperature
    return evaluate(model, spec, None, options.eval_episodes, seed, temperature, per_task=True)
