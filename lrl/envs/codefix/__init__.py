"""codefix: a code-fixing environment whose every tool call runs a real test suite in a sandboxed process.

Each task is a small Python module with one bug, its tests, and K candidate patches; ``test K`` runs the tests
on candidate K in a fresh sandbox, ``submit K`` ends the episode with a real run's verdict as the reward.
Registered as ``codefix`` (``--env codefix``); ``--codefix-tasks DIR`` reads a user's own tasks. See
docs/sandbox.md for the task format, the sandbox levels and the failure kinds.
"""

from __future__ import annotations

import sys
import threading

from lrl.envs.base import EnvSpec
from lrl.envs.codefix.env import COUNTERS, CodeFixEnv
from lrl.envs.codefix.folder import TaskFolderError, load_tasks
from lrl.envs.codefix.tasks import (
    FAMILIES,
    MAX_CANDIDATES,
    CodeTask,
    make_code_tasks,
    vocabulary_words,
)
from lrl.envs.workers import REAL_TOOL_ENVS
from lrl.registry import ENVS
from lrl.sections import EnvironmentOptions
from lrl.tokenizers import WordTokenizer

_POOLS: dict = {}
_LOCK = threading.Lock()


def codefix_tokenizer() -> WordTokenizer:
    return WordTokenizer(vocabulary_words())


def shared_pool(workers: int, level: str, wall: float, retries: int):
    """This process's environment worker pool for a configuration, started on first use (its line printed)."""
    from lrl.envs.codefix.pool import EnvPool, default_workers
    from lrl.envs.codefix.sandbox.harness import Limits

    n = workers or default_workers()
    key = (n, level, wall, retries)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            cpu = max(int(wall + 0.999), 1)
            pool = _POOLS[key] = EnvPool(n, level, Limits(wall_seconds=wall, cpu_seconds=cpu), retries)
            print(pool.describe(), file=sys.stderr, flush=True)
        return pool


def close_pools() -> None:
    with _LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


def codefix_spec(tok=None, max_turns: int = 5, tasks_dir=None, workers: int = 0, level: str = "auto",
                 wall: float = 1.0, retries: int = 1) -> EnvSpec:  # fmt: skip
    """The codefix EnvSpec: its word tokenizer (or `tok`), the generated tasks or a folder's, the pool's settings."""
    from lrl.envs.codefix.base import RL_BASE

    tok = tok if tok is not None else codefix_tokenizer()
    tasks = load_tasks(tasks_dir) if tasks_dir else make_code_tasks("all")
    train = [t for t in tasks if t.split == "train"]
    heldout = [t for t in tasks if t.split == "heldout"]
    k_max = max(t.n for t in tasks)
    actions = tuple(f"{verb} {k}" for verb in ("test", "submit") for k in range(1, k_max + 1))
    budget = max(len(tok.encode(a)) for a in actions) + 1
    obs = max(len(tok.observation(f"{k_max} timeout {len(t.calls)} of {len(t.calls)}")) for t in tasks)
    longest = max(len(tok.prompt(t.prompt)) for t in tasks) + max_turns * (budget + obs)
    pool = lambda: shared_pool(workers, level, wall, retries)  # noqa: E731
    return EnvSpec(
        name="codefix",
        tok=tok,
        make=lambda: CodeFixEnv(tok, pool, max_turns),
        train_tasks=train,
        heldout_tasks=heldout,
        max_action_tokens=budget,
        metrics=("tests",),
        warm_start=lambda: RL_BASE.policy(tok, verbose=True),
        max_episode_tokens=longest,
        actions=actions,
        counters=COUNTERS,
    )


def _check(environment: EnvironmentOptions) -> list[str]:
    """The values alone: a turn to test before submitting."""
    if environment.max_turns < 2:
        return [f"max_turns: {environment.max_turns} leaves no turn to test a candidate before submitting one"]
    return []


def _check_machine(environment: EnvironmentOptions) -> list[str]:
    """The preflight's: a task folder that can be read; a sandbox level asked by name that works on this machine
    (a probe, in a process of its own)."""
    if environment.codefix_tasks is not None:
        try:
            load_tasks(environment.codefix_tasks)
        except TaskFolderError as err:
            return [f"codefix_tasks: {err}"]
    return _namespaces_work(environment.test_timeout) if environment.sandbox == "namespaces" else []


INSTRUCTIONS = (
    "You choose the patch that fixes a function. Reply with exactly one action and nothing else: 'test K' runs "
    "the tests on candidate K and says how many passed; 'submit K' submits candidate K and ends the episode."
)


_PROBED: dict = {}


def _namespaces_work(wall: float) -> list[str]:
    """``--sandbox namespaces`` asked by name: a pool of one worker probes it here, once per process, so that a
    machine that does not allow it stops the run before it starts (``auto`` would fall back, and say so)."""
    if "namespaces" not in _PROBED:
        from lrl.envs.codefix.pool import EnvPool
        from lrl.envs.codefix.sandbox.harness import Limits

        try:
            EnvPool(
                1, "namespaces", Limits(wall_seconds=wall, cpu_seconds=max(int(wall + 0.999), 1)), 0
            ).close()
            _PROBED["namespaces"] = []
        except OSError as err:
            why = str(err).removeprefix("an environment worker could not start: ").removeprefix("OSError: ")
            _PROBED["namespaces"] = [
                f"sandbox: namespaces does not work here: {why}; --sandbox auto takes the best level that does "
                "(the run's first line says what it isolates)"
            ]
    return _PROBED["namespaces"]


CODEFIX_DEFAULTS = {
    "max_turns": 5,
    "tasks_per_step": 8,
    "episodes_per_task": 8,
    "max_steps": 12,
    "slots": 64,  # continuous batching: an episode waiting on a slow test holds up no other
    "eval_episodes": 4,
    "eval_every": 12,
}


@ENVS.register(
    "codefix",
    uses=("max_turns", "env_workers", "env_retries", "sandbox", "codefix_tasks", "test_timeout"),
    check=_check,
    check_machine=_check_machine,
    defaults=CODEFIX_DEFAULTS,
    instructions=INSTRUCTIONS,
)
def codefix(environment: EnvironmentOptions, tok=None) -> EnvSpec:
    """fix a bug: test candidate patches in real sandboxed test runs, submit one (reward: a real run passes)"""
    e = environment
    return codefix_spec(tok, e.max_turns, e.codefix_tasks, e.env_workers, e.sandbox, e.test_timeout, e.env_retries)


REAL_TOOL_ENVS.add("codefix")

__all__ = [
    "CodeFixEnv",
    "CodeTask",
    "FAMILIES",
    "MAX_CANDIDATES",
    "TaskFolderError",
    "codefix_spec",
    "codefix_tokenizer",
    "close_pools",
    "load_tasks",
    "make_code_tasks",
    "shared_pool",
]
