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

from lrl.errors import ConfigError

SHARE = 0.8  # of the available memory that one run may plan to use
# Resident memory of one rollout worker process before its model: VmRSS (/proc/<pid>/status) of a python spawned
# the way the pipeline spawns its workers, after it imported torch, transformers, lrl.pipeline.worker and
# lrl.rollout, built the tiny TinyAgent policy and ran one forward over [64, 40] tokens: 414,364 and 413,912 kB
# in two measurements (about 295 MiB of it private, the rest shared libraries), torch 2.13 on CPU. Rounded
# down to 400 MiB: the check refuses only worker counts that cannot fit, it does not plan the machine's memory.
WORKER_BYTES = 400 * 2**20


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo, else the physical memory (bytes)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def model_shape(cfg, vocab: int, default_context: int) -> tuple[int, int, int, int]:
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


def weight_bytes(cfg) -> int:
    """Rough fp32 bytes of the model's weights (embeddings and ~12 hidden^2 per layer); 0 without a --model."""
    if cfg.model is None:
        return 0  # the built-in policies are well under a megabyte
    vocab, hidden, layers, _ = model_shape(cfg, 0, 0)
    return 4 * (vocab * hidden + 12 * layers * hidden * hidden)


def check_workers(cfg) -> list[str]:
    """Problems of an async run whose rollout workers (each its own process and copy of the weights) would
    not fit in this machine's memory, counted over the processes a node runs (devices)."""
    each = WORKER_BYTES + weight_bytes(cfg)
    workers = cfg.rollout_workers * cfg.devices
    have = available_bytes()
    if workers * each <= SHARE * have:
        return []
    most = max(int(SHARE * have // each // cfg.devices), 0)
    per_process = f" on each of {cfg.devices} processes" if cfg.devices > 1 else ""
    return [
        f"rollout_workers: {cfg.rollout_workers} workers{per_process} need about {workers * each / 2**30:.1f} GiB "
        f"({each / 2**30:.2f} GiB a worker process); this machine has {have / 2**30:.1f} GiB available, "
        f"enough for at most {most}"
    ]


def bytes_per_token(vocab: int, hidden: int, layers: int, training: bool) -> int:
    """Rough bytes per token of a batch: fp32 logits (and their log-softmax and gradient when training) and
    per-layer activations (about 24 hidden-sized tensors a layer kept for the backward pass)."""
    if training:
        return 4 * (3 * vocab + 24 * hidden * layers)
    return 4 * (2 * vocab + 4 * hidden * layers)


def check_budget(cfg, spec, default_context: int) -> dict[str, int]:
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
