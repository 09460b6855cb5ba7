"""Every built-in environment reads a reply in time linear in its length, whatever the reply holds.

A sampled model early in RL writes degenerate text: runs of whitespace, the same word again and again, digits
without end. A reader whose time grows faster than the text (a backtracking pattern: ``answer`` and 2,000 spaces
once took 29 s) stalls a step, and in a rollout worker it holds the interpreter where the heartbeat thread cannot
run. Each built-in reader here is fed 100,000 characters of such text; the bound is generous (a linear reader
takes milliseconds), and a reply of the real model is far shorter (40 tokens of SmolLM2's longest, 81 characters
each, are 3,240 characters).
"""

from __future__ import annotations

import time

import pytest

from lrl.envs import ENVS
from lrl.envs.calc import parse as calc_parse
from lrl.envs.codefix.env import CodeFixEnv
from lrl.envs.codefix.tasks import make_code_tasks
from lrl.envs.review.env import ReviewEnv
from lrl.envs.review.tasks import make_reviews
from lrl.envs.tinyagent.env import BugFixEnv
from lrl.envs.tinyagent.tasks import make_tasks

N = 100_000
BOUND_S = 1.0  # a linear reader takes a few ms for 100k characters; the cubic one took minutes


class TextTokenizer:
    """Decodes any action to the text it was given: what an environment reads, without a model."""

    eos_id = 1

    def __init__(self):
        self.text = ""

    def decode(self, ids, skip_special=True):
        return self.text

    def prompt(self, text):
        return [0]

    def observation(self, text):
        return [0]


def reader(env, task):
    """The environment's own reading of a reply's text (its parse, on the text decoded from one action)."""
    tok = env.tok
    env.reset(task)

    def read(text):
        tok.text = text
        return env.parse([0, tok.eos_id])

    return read


def readers() -> dict:
    tok = TextTokenizer
    return {
        "calc": calc_parse,
        "tinyagent": reader(BugFixEnv(tok()), make_tasks("train")[0]),
        "review": reader(ReviewEnv(tok()), make_reviews("train")[0]),
        "codefix": reader(CodeFixEnv(tok(), pool_of=None), make_code_tasks("train")[0]),
    }


def adversarial() -> dict[str, str]:
    """100,000 characters each, of the kinds that make a backtracking reader slow or a careless one fail."""
    cut = lambda s: (s * (N // len(s) + 1))[:N]  # noqa: E731
    return {
        "spaces": " " * N,
        "answer, spaces, a letter": "answer" + " " * (N - 7) + "x",
        "answer is, spaces, colon": "answer is" + " " * (N - 11) + ":x",
        "calc, spaces, an operator": "calc 1" + " " * (N - 8) + "+x",
        "calc and digits with spaces": "calc " + cut("1 "),
        "calc and an open expression": "calc " + cut("1 + "),
        "calc and parentheses": "calc " + cut("("),
        "calc again and again": cut("calc "),
        "answer again and again": cut("answer is "),
        "digits": "answer " + cut("9"),
        "digits to test": "test " + cut("9"),
        "digits to submit": "submit " + cut("9"),
        "digits and commas": "answer " + cut("1,"),
        "digits and points": cut("1."),
        "exponents": cut("1e"),
        "mixed whitespace": cut(" \t\n\r\x0b\x0c\xa0\u3000"),
        "SmolLM2's longest whitespace token": cut("\n" + " " * 80),
        "unicode digits": "answer " + cut("\u0667\u0660\u0668"),
        "superscript digits": "answer " + cut("\u00b2"),
        "an equals chain": "calc 1 " + cut("= 1 "),
        "words and numbers": cut("test 1 submit 2 answer 3 read "),
    }


def test_every_built_in_environment_has_a_reader_here():
    built_in = {name for name, entry in ENVS.items() if entry.factory.__module__.startswith("lrl.envs.")}
    assert built_in == set(readers())


@pytest.mark.parametrize("env", sorted(readers()))
def test_a_hundred_thousand_adversarial_characters_are_read_in_under_a_second(env):
    read = readers()[env]
    slow = {}
    for name, text in adversarial().items():
        assert len(text) >= N - 1, name
        start = time.perf_counter()
        read(text)  # any answer will do; it must come back, and soon
        took = time.perf_counter() - start
        if took > BOUND_S:
            slow[name] = round(took, 2)
    assert not slow, f"{env}: seconds to read 100,000 characters: {slow}"


@pytest.mark.parametrize(
    "env, reply, malformed",
    [
        (
            "tinyagent",
            "answer \u00b2",
            ("invalid", None),
        ),  # a superscript is a digit to str.isdigit, not to int()
        ("tinyagent", "answer \u0663", ("invalid", None)),  # an Arabic-Indic 3: not a line number here
        ("codefix", "test \u00b9", ("invalid", None)),
        ("codefix", "submit \u00b2", ("invalid", None)),
        ("review", "\u00b9 ok", None),
    ],
)
def test_digits_that_are_not_ascii_are_a_malformed_reply_not_an_error(env, reply, malformed):
    assert readers()[env](reply) == malformed
