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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lrl.errors import ConfigError

if TYPE_CHECKING:
    from lrl.sections import BatchOptions, PolicyOptions, RolloutOptions, RunOptions, UpdateOptions

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


def model_shape(policy: PolicyOptions, vocab: int, default_context: int) -> tuple[int, int, int, int]:
    """(vocabulary, hidden size, layers, context) of the run's model, from its config.json when it has one."""
    from lrl.policy import DEFAULT_SIZE

    shape = {"vocab_size": vocab, **DEFAULT_SIZE, "max_position_embeddings": default_context}
    if policy.model is not None:
        try:
            shape.update(json.loads((Path(policy.model) / "config.json").read_text()))
        except (OSError, ValueError):
            pass  # load_policy reports an unreadable model
    get = lambda *keys: next((int(shape[k]) for k in keys if isinstance(shape.get(k), int)), 0)  # noqa: E731
    return (
        get("vocab_size"),
        get("hidden_size", "n_embd", "d_model"),
        get("num_hidden_layers", "n_layer"),
        get("max_position_embeddings", "n_positions"),
    )


def weight_bytes(policy: PolicyOptions) -> int:
    """Rough fp32 bytes of the model's weights (embeddings and ~12 hidden^2 per layer); 0 without a --model."""
    if policy.model is None:
        return 0  # the built-in policies are well under a megabyte
    vocab, hidden, layers, _ = model_shape(policy, 0, 0)
    return 4 * (vocab * hidden + 12 * layers * hidden * hidden)


def check_workers(rollout: RolloutOptions, policy: PolicyOptions, devices: int) -> list[str]:
    """Problems of an async run whose rollout workers (each its own process and copy of the weights) would
    not fit in this machine's memory, counted over the processes a node runs (devices)."""
    each = WORKER_BYTES + weight_bytes(policy)
    workers = rollout.rollout_workers * devices
    have = available_bytes()
    if workers * each <= SHARE * have:
        return []
    most = max(int(SHARE * have // each // devices), 0)
    per_process = f" on each of {devices} processes" if devices > 1 else ""
    return [
        f"rollout_workers: {rollout.rollout_workers} workers{per_process} need about {workers * each / 2**30:.1f} GiB "
        f"({each / 2**30:.2f} GiB a worker process); this machine has {have / 2**30:.1f} GiB available, "
        f"enough for at most {most}"
    ]


def model_config(policy: PolicyOptions) -> dict:
    """The run's model's config.json as a dict ({} without a --model, or when it cannot be read)."""
    if policy.model is None:
        return {}
    try:
        config = json.loads((Path(policy.model) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def parameter_count(policy: PolicyOptions) -> int:
    """Parameters of the run's model, read from its safetensors headers (no weight is loaded); a rough count
    from its config.json where there are none; 0 without a --model (the built-in policies are tiny)."""
    if policy.model is None:
        return 0
    folder = Path(policy.model)
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if size > 100 * 2**20:
                    raise ValueError("header too large")
                header = json.loads(f.read(size))
            for name, entry in header.items():
                if name != "__metadata__":
                    n = 1
                    for dim in entry["shape"]:
                        n *= int(dim)
                    total += n
        except (OSError, ValueError, KeyError, TypeError):
            total = 0
            break
    return total or weight_bytes(policy) // 4


# Bytes a training forward and backward keep per token and decoder layer, as multiples of the hidden size and of
# the MLP's intermediate size (fp32; norms, projections, attention output, residuals and the MLP's products), and
# per attention head and position of the sequence (the attention weights the backward pass keeps). Measured on
# SmolLM2-135M (30 layers): 1.93 MiB a trained token in fp32, 1.44 MiB under bf16 autocast, at 128-256 tokens a
# row (bench/bench_real_model.py); tests/engines/test_real_model.py compares the estimate with a measured step.
TRAIN_HIDDEN, TRAIN_INTERMEDIATE = 12, 6
SCORE_HIDDEN, SCORE_INTERMEDIATE = 6, 3
HEAD_TENSORS = 4  # a head chunk's logits, their softmax, and (training) their gradient and a copy
HEAD_KEPT = 6  # fp32 [tokens, vocab] tensors a training forward keeps through the head when it does not recompute it
BF16_ACTIVATIONS = (
    0.75  # under bf16 autocast a trained token keeps 1.44 MiB where fp32 keeps 1.93 (SmolLM2-135M)
)
# the most padded tokens in one training forward: past a few thousand a CPU forward goes no faster, and the
# memory it holds is the run's peak
MICRO_TOKENS = 2048
# Resident memory of train.py before any model: python, torch, transformers, lightning and lrl imported (VmRSS,
# 0.52 GiB measured with torch 2.13 on CPU), rounded up
PROCESS_BYTES = 600 * 2**20


@dataclass(frozen=True)
class MemoryPlan:
    """How one training step uses memory: what stays (weights, gradients, optimizer state, the sampler's and
    the update guard's copies), what a token of a forward costs, and how many padded tokens one training
    microbatch or one scoring forward may hold. ``chunked``: the LM head runs in chunks (lrl.logprobs);
    ``step_peak``: the estimated peak of this run's steps (its batch, sampling, scoring and training), the
    process itself included."""

    budget: int
    static: int
    train_token: int
    score_token: int
    head: int  # bytes of the head's chunk buffers during one forward
    train_tokens: int | None  # None: the whole minibatch in one forward (the built-in policies)
    score_tokens: int | None
    chunked: bool
    step_peak: int = 0
    vocab: int = 0

    def logits_fit(self, action_tokens: int) -> bool:
        """Whether a training forward may keep the LM head's fp32 tensors of `action_tokens` positions for its
        backward (logits, log-softmax and softmax, their gradients: :data:`HEAD_KEPT` of them) beside the
        step's planned peak, instead of recomputing each chunk of them in the backward pass."""
        return action_tokens * self.vocab * 4 * HEAD_KEPT <= self.budget - self.step_peak

    def describe(self) -> str:
        gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
        return (
            f"memory plan: {gib(self.static)} of weights, gradients, optimizer state and copies, "
            f"{self.train_token / 2**10:.0f} KiB a trained token, microbatches of up to {self.train_tokens:,} "
            f"tokens; {gib(self.step_peak)} at a step's peak, within a budget of {gib(self.budget)}"
        ) + (self.narrowed() or "")

    def narrowed(self) -> str | None:
        """What to know when the budget, not :data:`MICRO_TOKENS`, sets the microbatches: another microbatch size
        sums a gradient in another order, so the run computes other numbers than one with more memory (on SmolLM2
        calc, seed 0: the same to step 8, parted sampled tokens from step 10, 0.500 against 0.406 at step 30)."""
        if self.train_tokens is None or self.train_tokens >= MICRO_TOKENS:
            return None
        return (
            f" (narrowed from {MICRO_TOKENS:,} by the budget: a run with more memory takes larger microbatches and "
            "computes other numbers, so its sampled tokens part from this one's; --memory-budget pins the plan)"
        )


def plan_memory(
    vocab: int,
    episode_tokens: int,
    train_episodes: int,
    sampler=None,
    *,
    policy: PolicyOptions,
    update: UpdateOptions,
    batch: BatchOptions,
    rollout: RolloutOptions,
    run: RunOptions,
) -> MemoryPlan:
    """The memory plan of a run (see :class:`MemoryPlan`); ConfigError when not even one episode fits. `sampler`:
    the behavior sampler that keeps its copies in this process (a synchronous run's; None where workers hold
    them), asked for them through its ``traits`` (``lrl.samplers.Sampler``)."""
    from lrl.logprobs import CHUNK_TOKENS, FULL_LOGITS_LIMIT

    config = model_config(policy)
    params = parameter_count(policy)
    get = lambda key, default: int(config.get(key) or default)  # noqa: E731
    hidden = get("hidden_size", 0)
    layers = get("num_hidden_layers", 0)
    inter = get("intermediate_size", 4 * hidden)
    heads = get("num_attention_heads", 1)
    kv_width = get("num_key_value_heads", heads) * get("head_dim", hidden // max(heads, 1))
    budget = int(policy.memory_budget * 2**30) if policy.memory_budget else int(SHARE * available_bytes())
    chunked = params > 0 and train_episodes * episode_tokens * vocab > FULL_LOGITS_LIMIT
    if not chunked:
        return MemoryPlan(budget, 16 * params, 0, 0, 0, None, None, False)
    from lrl.precision import accelerator_device, resolve_precision

    static = PROCESS_BYTES + static_bytes(update, params, sampler)
    attention = 4 * heads * episode_tokens  # per layer and token: one row of attention weights
    train_token = 4 * (TRAIN_HIDDEN * hidden + TRAIN_INTERMEDIATE * inter) * layers + attention * layers
    if resolve_precision(policy.precision, params, accelerator_device(run.accelerator)) in ("bf16", "fp16"):
        train_token = int(train_token * BF16_ACTIVATIONS)
    score_token = 4 * (SCORE_HIDDEN * hidden + SCORE_INTERMEDIATE * inter) + attention
    head = HEAD_TENSORS * 4 * CHUNK_TOKENS * vocab
    room = budget - static - head
    if room < episode_tokens * train_token:
        need = static + head + episode_tokens * train_token
        raise ConfigError(
            f"model: {policy.model!r} needs about {need / 2**30:.1f} GiB to train on one episode of {episode_tokens} "
            f"tokens ({static / 2**30:.1f} GiB of weights, gradients, optimizer state and copies); the budget is "
            f"{budget / 2**30:.1f} GiB (--memory-budget, or 0.8 of the memory available)"
        )
    train_tokens, score_tokens = min(room // train_token, MICRO_TOKENS), room // score_token
    batch_tokens = train_episodes * episode_tokens
    minibatch = -(-train_episodes // update.minibatches) * episode_tokens
    cache = 8 * layers * kv_width  # a sampled token's keys and values in fp32
    decoded = min(rollout.slots, train_episodes) if rollout.slots else train_episodes  # episodes decoded together
    step = max(
        head + min(train_tokens, minibatch) * train_token,
        head + min(score_tokens, batch_tokens) * score_token,
        decoded * episode_tokens * cache,
    )
    if static + step > budget:  # microbatches bound training and scoring; nothing bounds the sampled batch
        raise ConfigError(
            f"episodes_per_task: {batch.episodes_per_task} ({train_episodes:,} episodes a step of up to "
            f"{episode_tokens} tokens, {decoded:,} decoded together) needs about {(static + step) / 2**30:.1f} GiB "
            f"at a step's peak, the keys and values of the sampled batch {decoded * episode_tokens * cache / 2**30:.1f} "
            f"GiB of it; the budget is {budget / 2**30:.1f} GiB (--memory-budget, or 0.8 of the memory available): "
            "fewer episodes a step, or --slots N to decode N at a time"
        )
    return MemoryPlan(
        budget, static, train_token, score_token, head, train_tokens, score_tokens, True, static + step, vocab
    )


def static_bytes(update: UpdateOptions, params: int, sampler=None) -> int:
    """What a step keeps whatever its batch: fp32 weights, gradients and Adam's two moments (16 bytes a
    parameter), the update guard's copy of weights and moments, and the copies the sampler in this process
    declares (its kept versions, its behavior model, an engine's cache)."""
    static = 16 * params
    if update.max_step_kl is not None:
        static += 12 * params
    if sampler is not None:
        static += sampler.traits.kept_bytes(params)
    return static


def bytes_per_token(vocab: int, hidden: int, layers: int, training: bool) -> int:
    """Rough bytes per token of a batch scored with its full logits: fp32 logits (and their log-softmax and
    gradient when training) and per-layer activations (about 24 hidden-sized tensors a layer kept for the
    backward pass). The built-in policies' path (lrl.logprobs.FULL_LOGITS_LIMIT)."""
    if training:
        return 4 * (3 * vocab + 24 * hidden * layers)
    return 4 * (2 * vocab + 4 * hidden * layers)


def check_budget(
    spec,
    default_context: int,
    sampler=None,
    *,
    policy: PolicyOptions,
    update: UpdateOptions,
    batch: BatchOptions,
    rollout: RolloutOptions,
    run: RunOptions,
    eval_episodes: int,
) -> MemoryPlan:
    """Refuse a config whose step or evaluation would not fit in memory -> the step's memory plan.

    A model whose logits would be too large to hold for a whole batch (a real vocabulary) is planned in
    microbatches (:func:`plan_memory`, `sampler` as there): the step is refused only when one episode alone does
    not fit."""
    vocab, hidden, layers, context = model_shape(policy, len(spec.tok), default_context)
    tokens = spec.max_episode_tokens or context
    train = batch.tasks_per_step * batch.episodes_per_task // run.world_size
    evaluation = len(spec.heldout_tasks) * eval_episodes
    sections = dict(policy=policy, update=update, batch=batch, rollout=rollout, run=run)
    plan = plan_memory(vocab, tokens, train, sampler, **sections)
    if plan.chunked:
        return plan
    need = {
        "episodes_per_task": train * tokens * bytes_per_token(vocab, hidden, layers, True),
        "eval_episodes": evaluation * tokens * bytes_per_token(vocab, hidden, layers, False),
    }
    have = available_bytes()
    value = {"episodes_per_task": batch.episodes_per_task, "eval_episodes": eval_episodes}
    what = {
        "episodes_per_task": f"{train:,} episodes a step",
        "eval_episodes": f"{evaluation:,} episodes an evaluation",
    }
    for option, needed in need.items():
        if needed > SHARE * have:
            raise ConfigError(
                f"{option}: {value[option]} needs about {needed / 2**30:.1f} GiB ({what[option]} of up to "
                f"{tokens} tokens, vocabulary {vocab}); this machine has {have / 2**30:.1f} GiB available"
            )
    return plan
