"""The codefix RL base: a supervised warm start on generated demonstrations (no sandbox, never the tasks).

Two kinds of demonstration, like TinyAgent's:
- *test-until-pass*: the candidates tested in turn from a random one, failing verdicts until the passing one, then
  ``submit`` of it; loss on every action but the first (the base learns to go on testing after a failure and
  to submit what passed, not to start by testing);
- *decision*: from the prompt alone, ``test K`` with probability ``test_prob``, else ``submit K`` of a random K.
So the base rarely tests before submitting: a blind submit passes 1 time in K, and RL on the real verdicts has
to learn to test first. The verdicts are written from the demonstration's own draw; nothing runs.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, replace

from lrl.envs.codefix.tasks import AGENT_OBS, FAMILIES, K
from lrl.warmstart import Demo, WarmStart, WarmStartOptions

DEMO_SEED = 4711


@dataclass(frozen=True)
class CodefixBaseConfig(WarmStartOptions):
    """Hyper-parameters of the warm start; part of the cache key. The first phase (``rule_steps``) trains on
    test-until-pass demonstrations only (it learns to read a verdict); the second on the mix below, which sets how
    often the base tests first."""

    steps: int = 200
    until_pass: float = 0.5
    """share of test-until-pass demonstrations; the rest are decision demonstrations"""
    test_prob: float = 0.15
    """probability that a decision demonstration tests first"""


def _prompt(family: str, k: int) -> str:
    return f"fix : {family} . candidates {' '.join(str(j) for j in range(1, k + 1))} ."


def demonstration(tok, rng: random.Random, hp: CodefixBaseConfig) -> Demo:
    family = rng.choice(["task", *sorted(FAMILIES)])
    k = K
    ids = tok.prompt(_prompt(family, k))
    loss = [False] * len(ids)

    def act(text: str, with_loss: bool) -> None:
        a = tok.encode(text) + [tok.eos_id]
        ids.extend(a)
        loss.extend([with_loss] * len(a))

    def see(text: str) -> None:
        o = tok.observation(text)
        ids.extend(o)
        loss.extend([False] * len(o))

    total = rng.choice([2, 3, 3, 3, 4, 5])
    if rng.random() < hp.until_pass:
        start = rng.randrange(k)
        order = [(start + i) % k + 1 for i in range(k)]  # in turn from a random one: after K, test K + 1
        good = rng.choice(order)
        for i, c in enumerate(order):
            act(f"test {c}", i > 0)
            if c == good:
                see(f"{c} passed {total} of {total}")
                act(f"submit {c}", True)
                break
            kind = rng.choice(AGENT_OBS)
            passed = rng.randrange(total) if kind == "failed" else 0
            see(f"{c} {kind} {passed} of {total}")
    elif rng.random() < hp.test_prob:
        act(f"test {rng.randrange(1, k + 1)}", True)
    else:
        act(f"submit {rng.randrange(1, k + 1)}", True)
    return ids, loss


def draw(tok, rng: random.Random, hp: CodefixBaseConfig, step: int) -> list[Demo]:
    """A step's demonstrations: test-until-pass alone for the first ``rule_steps``, then the mix."""
    phase = replace(hp, until_pass=1.0) if step < hp.rule_steps else hp
    return [demonstration(tok, rng, phase) for _ in range(hp.batch_size)]


RL_BASE = WarmStart("codefix-base", CodefixBaseConfig(), draw, DEMO_SEED, code=(sys.modules[__name__],))
