"""The TinyAgent RL base: a short supervised warm start on generated demonstrations, cached on disk.

Two kinds of demonstration teach the action format and the rule without teaching the agent to read:
- *read-then-answer*: ``read`` (no loss on the action), the source, then the right answer (with loss);
- *decision*: from the prompt alone, ``read`` with probability ``read_prob``, else a uniformly random
  answer.
The result answers well after reading but rarely reads, so a blind guess (20%) is what RL starts from.
Demonstrations are drawn from a generator of their own and never coincide with the 30 evaluation tasks.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, replace

import torch

from lrl.envs.tinyagent.tasks import Task, make_tasks, random_task
from lrl.policy import make_policy
from lrl.warmstart import (
    cached_policy,
    fit_demonstrations,
    fixed_threads,
    source_fingerprint,
    tokenizer_fingerprint,
)

DEMO_SEED = 31337


@dataclass(frozen=True)
class BaseConfig:
    """Hyper-parameters of the warm start; part of the cache key."""

    rule_steps: int = 600
    """first phase: optimizer steps on read-then-answer demonstrations only (learns the rule)"""
    steps: int = 150
    """second phase: optimizer steps on the mix below (sets how often the agent reads)"""
    batch_size: int = 64
    """demonstrations per step"""
    lr: float = 3e-3
    """Adam learning rate"""
    read_then_answer: float = 0.5
    """share of read-then-answer demonstrations; the rest are decision demonstrations"""
    read_prob: float = 0.1
    """probability that a decision demonstration reads"""
    seed: int = 0
    """initialisation and demonstration-order seed"""
    threads: int = 2
    """torch threads used while training: float reduction order depends on it, so it is fixed here"""


def _demo(task: Task, tok, rng: random.Random, cfg: BaseConfig) -> tuple[list[int], list[bool]]:
    """One demonstration -> token ids and a per-token loss flag."""
    read = tok.encode("read")
    answer = tok.encode("answer")
    eos = [tok.eos_id]
    ids = tok.prompt(task.prompt)
    loss = [False] * len(ids)

    def add(tokens, with_loss):
        ids.extend(tokens)
        loss.extend([with_loss] * len(tokens))

    if rng.random() < cfg.read_then_answer:
        add(read + eos, False)
        add(tok.observation(task.source), False)
        rule_only = cfg.read_then_answer == 1.0  # the first phase trains the answer's line number alone
        add(answer, not rule_only)
        add(tok.encode(f" {task.answer}"), True)
        add(eos, not rule_only)
    elif rng.random() < cfg.read_prob:
        add(read + eos, True)
    else:
        add(answer + tok.encode(f" {rng.choice(task.candidates)}") + eos, True)
    return ids, loss


def demonstrations(n: int, tok, rng: random.Random, cfg: BaseConfig):
    """`n` demonstrations on generated tasks that are never one of the evaluation tasks."""
    held = {t.lines for t in make_tasks("all")}
    out = []
    while len(out) < n:
        task = random_task(rng)
        if task.lines not in held:
            out.append(_demo(task, tok, rng, cfg))
    return out


def train_base(tok, cfg: BaseConfig = BaseConfig(), log_every: int = 0) -> torch.nn.Module:
    """Supervised warm start from scratch -> the RL base policy (deterministic for a given cfg)."""
    rng = random.Random(DEMO_SEED + cfg.seed)
    rule_only = replace(cfg, read_then_answer=1.0)

    def draw(step: int):
        return demonstrations(cfg.batch_size, tok, rng, rule_only if step < cfg.rule_steps else cfg)

    with fixed_threads(cfg.threads):
        model = make_policy(tok, seed=cfg.seed)
        return fit_demonstrations(model, draw, cfg.rule_steps + cfg.steps, cfg.lr, tok.pad_id, log_every)


def base_key(tok, cfg: BaseConfig) -> str:
    """Cache key: the warm-start config, the vocabulary, the model size, and the code that draws the
    demonstrations and trains on them."""
    import sys

    from lrl.envs.tinyagent import tasks
    from lrl.policy import DEFAULT_SIZE, make_policy

    code = source_fingerprint(sys.modules[__name__], tasks, fit_demonstrations, make_policy)
    blob = json.dumps([asdict(cfg), tokenizer_fingerprint(tok), DEFAULT_SIZE, code], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_rl_base(tok, cfg: BaseConfig = BaseConfig(), cache: bool = True, verbose: bool = False):
    """The RL base policy, loaded from the cache or trained once and saved there (atomically)."""
    build = lambda: train_base(tok, cfg, log_every=100 if verbose else 0)  # noqa: E731
    return cached_policy(f"base-{base_key(tok, cfg)}", tok, build, cache, verbose)
