"""The tests' format policy: TinyAgent's warm start for a few seconds (valid actions, reads sometimes, guesses: mixed
rewards), what most trainer tests start from.

Training it costs about 27 CPU seconds, paid once by every test run and waited on by every worker that needs it
first, so a copy is kept in tests/data under the key of everything that determines it (its options, the vocabulary,
the model's size, the code of the warm start). The tests load that copy when its key is current and train the policy
(once a run, in the session folder) when it is not: a change to the warm start's code never runs the tests on a
stale policy. ``python tests/format_policy.py`` writes the copy again (test_the_saved_format_policy_is_current says
when it is due).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
PREFIX = "format-policy-"


def options():
    from lrl.envs.tinyagent.base import BaseConfig

    return BaseConfig(rule_steps=0, steps=40, read_prob=0.3)


def saved_folder(tok) -> Path:
    """Where the copy for today's code lives (it may not exist)."""
    from lrl.envs.tinyagent.base import RL_BASE

    return DATA / f"{PREFIX}{RL_BASE.key(tok, options())}"


def train(tok):
    from lrl.envs.tinyagent.base import train_base

    return train_base(tok, options())


def load_or_train(tok, session: Path):
    """The saved copy where its key is current, else the policy trained once into `session` (workers that ask at
    once wait for the first): the package's own cache of warm starts, reading tests/data as its shipped folder."""
    from lrl.warmstart import cached_policy

    return cached_policy(saved_folder(tok).name, tok, lambda: train(tok), cache_root=session, shipped=DATA)


def write(tok) -> Path:
    """Train the policy and save it as the copy for today's code, removing copies for older keys."""
    from lrl.policy import save_policy

    folder = saved_folder(tok)
    for old in DATA.glob(f"{PREFIX}*"):
        shutil.rmtree(old)
    save_policy(train(tok), tok, folder)
    return folder


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from lrl.envs.tinyagent import build_tokenizer, make_tasks

    print(write(build_tokenizer(make_tasks("all"))).relative_to(ROOT))
