"""The built-in environments' RL bases are one kind of thing (lrl.warmstart.WarmStart), and the copies shipped in
the package are the ones their current code builds (a change to what draws the demonstrations or trains on them
changes the key, and leaves a first run to train the base for minutes until the copy is rebuilt)."""

from __future__ import annotations

from lrl.envs.codefix.base import RL_BASE as CODEFIX
from lrl.envs.review.base import RL_BASE as REVIEW
from lrl.envs.tinyagent import build_tokenizer, make_tasks
from lrl.envs.tinyagent.base import RL_BASE as TINYAGENT
from lrl.envs.tinyagent.base import BaseConfig
from lrl_lab.tools.ship_bases import main as ship_bases


def test_every_shipped_base_is_the_one_its_warm_start_builds(capsys):
    assert ship_bases(["--check"]) == 0, capsys.readouterr().out


def test_a_warm_start_key_covers_its_options_and_names_its_folder():
    tok = build_tokenizer(make_tasks("all"))
    assert TINYAGENT.key(tok) == TINYAGENT.key(tok, BaseConfig())
    assert TINYAGENT.key(tok, BaseConfig(steps=151)) != TINYAGENT.key(tok)
    assert TINYAGENT.folder(tok).startswith("base-")
    assert len({TINYAGENT.name, REVIEW.name, CODEFIX.name}) == 3  # one cache folder prefix each
