import logging
import os
import warnings

import pytest
import torch
from hypothesis import settings

from lrl.gym import build_tokenizer, make_tasks

warnings.filterwarnings("ignore", ".*dataloader_iter.*")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
torch.set_num_threads(1)

# CI explores the same examples every run, so a landing never hinges on a newly drawn one; local runs stay random
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer(make_tasks("all"))


@pytest.fixture(scope="session")
def tiny_policy(tok):
    """A fresh (untrained) tiny policy: fast, and enough for mechanics tests."""
    from lrl.policy import make_policy

    return make_policy(tok, seed=0)


def quick_cfg(**kw):
    """A small, fast Config for trainer tests."""
    from lrl.config import Config

    base = dict(max_steps=3, tasks_per_step=4, episodes_per_task=4, minibatches=2, eval_every=1000,
                eval_episodes=2, progress=False, log_dir="/tmp/lrl-test-runs")  # fmt: skip
    base.update(kw)
    return Config(**base)


@pytest.fixture(scope="session")
def format_policy(tok):
    """A policy warm-started for a few seconds: valid actions, reads sometimes, guesses: mixed rewards."""
    from lrl.base import BaseConfig, train_base

    return train_base(tok, BaseConfig(rule_steps=0, steps=40, read_prob=0.3))
