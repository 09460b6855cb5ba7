"""TinyAgent: a bug-fixing agent gym. 30 fixed tasks (20 train, 10 held out), ``read`` and ``answer K``.

Registered as the environment ``tinyagent`` (the default). Its word tokenizer is built from the tasks; any
tokenizer that can spell the actions works (``--tokenizer``).
"""

from __future__ import annotations

from lrl.envs.base import EnvSpec
from lrl.envs.tinyagent.env import BugFixEnv
from lrl.envs.tinyagent.tasks import N_LINES, Task, make_tasks, random_task, vocabulary_words
from lrl.registry import ENVS
from lrl.sections import EnvironmentOptions
from lrl.tokenizers import WordTokenizer


def build_tokenizer(tasks=()) -> WordTokenizer:
    """The gym's word tokenizer: its fixed vocabulary plus every word of `tasks`."""
    words = set(vocabulary_words())
    for task in tasks:
        words.update(task.prompt.split())
        words.update(task.source.split())
    return WordTokenizer(words)


# a chat model's system message (--system-prompt replaces it): what the actions are, in words
INSTRUCTIONS = (
    "You find the bug in a short program written in prefix notation. Reply with exactly one action and nothing "
    "else: 'read' shows the program's numbered lines; 'answer K' says that line K holds the bug and ends the "
    "episode."
)


@ENVS.register("tinyagent", uses=("max_turns",), instructions=INSTRUCTIONS)
def tinyagent(environment: EnvironmentOptions, tok=None) -> EnvSpec:
    """the TinyAgent bug-fix gym: read the source, answer the buggy line (reward 1 or 0)"""
    return tinyagent_spec(tok, environment.max_turns)


def tinyagent_spec(tok=None, max_turns: int = 3) -> EnvSpec:
    """TinyAgent's EnvSpec for a tokenizer (None: the gym's word tokenizer) and turn limit."""
    from lrl.envs.tinyagent.base import RL_BASE

    tok = tok if tok is not None else build_tokenizer(make_tasks("all"))
    actions = ("read", *(f"answer {k}" for k in range(1, N_LINES + 1)))
    budget = max(len(tok.encode(a)) for a in actions) + 1  # + eos
    tasks = make_tasks("all")
    longest = max(len(tok.prompt(t.prompt)) for t in tasks) + max_turns * (
        budget + max(len(tok.observation(t.source)) for t in tasks)
    )
    return EnvSpec(
        name="tinyagent",
        tok=tok,
        make=lambda: BugFixEnv(tok, max_turns),
        train_tasks=make_tasks("train"),
        heldout_tasks=make_tasks("heldout"),
        max_action_tokens=budget,
        metrics=("reads",),
        warm_start=lambda: RL_BASE.policy(tok, verbose=True),
        max_episode_tokens=longest,
        actions=actions,
    )


__all__ = [
    "BugFixEnv",
    "Task",
    "make_tasks",
    "random_task",
    "build_tokenizer",
    "N_LINES",
    "tinyagent",
    "tinyagent_spec",
]
