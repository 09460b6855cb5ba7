"""The TinyAgent RL base: a short supervised warm start on generated demonstrations, cached on disk.

Two kinds of demonstration teach the action format and the rule without teaching the agent to read:
- *read-then-answer*: ``read`` (no loss on the action), the source, then the right answer (with loss);
- *decision*: from the prompt alone, ``read`` with probability ``read_prob``, else a uniformly random
  answer.
The result answers well after reading but rarely reads, so a blind guess (20%) is what RL starts from.
Demonstrations are drawn from a generator of their own and never coincide with the 30 evaluation tasks.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, replace

from lrl.envs.tinyagent import tasks
from lrl.envs.tinyagent.tasks import Task, make_tasks, random_task
from lrl.warmstart import Demo, WarmStart, WarmStartOptions

DEMO_SEED = 31337


@dataclass(frozen=True)
class BaseConfig(WarmStartOptions):
    """Hyper-parameters of the warm start; part of the cache key. The first phase (``rule_steps``) trains on
    read-then-answer demonstrations only (it learns the rule); the second on the mix below, which sets how often
    the agent reads."""

    read_then_answer: float = 0.5
    """share of read-then-answer demonstrations; the rest are decision demonstrations"""
    read_prob: float = 0.1
    """probability that a decision demonstration reads"""


def _demo(task: Task, tok, rng: random.Random, hp: BaseConfig) -> Demo:
    """One demonstration -> token ids and a per-token loss flag."""
    read = tok.encode("read")
    answer = tok.encode("answer")
    eos = [tok.eos_id]
    ids = tok.prompt(task.prompt)
    loss = [False] * len(ids)

    def add(tokens, with_loss):
        ids.extend(tokens)
        loss.extend([with_loss] * len(tokens))

    if rng.random() < hp.read_then_answer:
        add(read + eos, False)
        add(tok.observation(task.source), False)
        rule_only = hp.read_then_answer == 1.0  # the first phase trains the answer's line number alone
        add(answer, not rule_only)
        add(tok.encode(f" {task.answer}"), True)
        add(eos, not rule_only)
    elif rng.random() < hp.read_prob:
        add(read + eos, True)
    else:
        add(answer + tok.encode(f" {rng.choice(task.candidates)}") + eos, True)
    return ids, loss


def demonstrations(n: int, tok, rng: random.Random, hp: BaseConfig) -> list[Demo]:
    """`n` demonstrations on generated tasks that are never one of the evaluation tasks."""
    held = {t.lines for t in make_tasks("all")}
    out = []
    while len(out) < n:
        task = random_task(rng)
        if task.lines not in held:
            out.append(_demo(task, tok, rng, hp))
    return out


def draw(tok, rng: random.Random, hp: BaseConfig, step: int) -> list[Demo]:
    """A step's demonstrations: read-then-answer alone for the first ``rule_steps``, then the mix."""
    return demonstrations(hp.batch_size, tok, rng, replace(hp, read_then_answer=1.0) if step < hp.rule_steps else hp)


RL_BASE = WarmStart("base", BaseConfig(), draw, DEMO_SEED, code=(sys.modules[__name__], tasks))
train_base, make_rl_base = RL_BASE.train, RL_BASE.policy  # a base trained (tests) or the cached one (a run)
