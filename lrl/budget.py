"""Bounded work: the memory a step and an evaluation will need, estimated before anything is built.

A batch of episodes is tensors of ``[episodes, tokens]``; the largest are the logits (``[.., vocab]`` in fp32,
kept with their log-softmax and gradient during the update) and the activations of every layer. The estimate
is deliberately rough (a factor of two either way) and only has to tell a run that fits from one that would be
killed by the kernel: a run whose estimate exceeds the memory this machine has available is refused, naming
the option, its value and the numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lrl.config import Config, ConfigError

SHARE = 0.8  # of the available memory that one run may plan to use


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo, else the physical memory (bytes)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def model_shape(cfg: Config, vocab: int, default_context: int) -> tuple[int, int, int, int]:
    """(vocabulary, hidden size, layers, context) of the run's model, from its config.json when it has one."""
    from lrl.policy import DEFAULT_SIZE

    shape = {"vocab_size": vocab, **DEFAULT_SIZE, "max_position_embeddings": default_context}
    if cfg.model is not None:
        try:
            shape.update(json.loads((Path(cfg.model) / "config.json").read_text()))
        except (OSError, ValueError):
            pass  # load_policy reports an unreadable model
    get = lambda *keys: next((int(shape[k]) for k in keys if isinstance(shape.get(k), int)), 0)  # noqa: E731
    return (
        get("vocab_size"),
        get("hidden_size", "n_embd", "d_model"),
        get("num_hidden_layers", "n_layer"),
        get("max_position_embeddings", "n_positions"),
    )


def bytes_per_token(vocab: int, hidden: int, layers: int, training: bool) -> int:
    """Rough bytes per token of a batch: fp32 logits (and their log-softmax and gradient when training) and
    per-layer activations (about 24 hidden-sized tensors a layer kept for the backward pass)."""
    if training:
        return 4 * (3 * vocab + 24 * hidden * layers)
    return 4 * (2 * vocab + 4 * hidden * layers)


def check_budget(cfg: Config, spec, default_context: int) -> dict[str, int]:
    """Refuse a config whose step or evaluation would not fit in memory -> the estimates, in bytes."""
    vocab, hidden, layers, context = model_shape(cfg, len(spec.tok), default_context)
    tokens = spec.max_episode_tokens or context
    train = cfg.tasks_per_step * cfg.episodes_per_task // cfg.world_size
    evaluation = len(spec.heldout_tasks) * cfg.eval_episodes
    need = {
        "episodes_per_task": train * tokens * bytes_per_token(vocab, hidden, layers, True),
        "eval_episodes": evaluation * tokens * bytes_per_token(vocab, hidden, layers, False),
    }
    have = available_bytes()
    what = {
        "episodes_per_task": f"{train:,} episodes a step",
        "eval_episodes": f"{evaluation:,} episodes an evaluation",
    }
    for option, needed in need.items():
        if needed > SHARE * have:
            raise ConfigError(
                f"{option}: {getattr(cfg, option)} needs about {needed / 2**30:.1f} GiB ({what[option]} of up to "
                f"{tokens} tokens, vocabulary {vocab}); this machine has {have / 2**30:.1f} GiB available"
            )
    return need
