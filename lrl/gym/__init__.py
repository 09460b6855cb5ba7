"""The TinyAgent bug-fix gym: tasks, tokenizer, environment."""

from lrl.gym.env import BugFixEnv, StepResult
from lrl.gym.tasks import N_LINES, Task, make_tasks, random_task
from lrl.gym.tokenizer import WordTokenizer, build_tokenizer

__all__ = [
    "BugFixEnv",
    "StepResult",
    "Task",
    "make_tasks",
    "random_task",
    "WordTokenizer",
    "build_tokenizer",
    "N_LINES",
]
