"""The built-in environments' RL bases are one kind of thing (lrl.warmstart.WarmStart), and the copies shipped in
the package are the ones their current code builds (a change to what draws the demonstrations or trains on them
changes the key, and leaves a first run to train the base for minutes until the copy is rebuilt); so is the copy
of the tests' own format policy (tests/format_policy.py)."""

from __future__ import annotations

from lrl.envs.codefix.base import RL_BASE as CODEFIX
from lrl.envs.review.base import RL_BASE as REVIEW
from lrl.envs.tinyagent import build_tokenizer, make_tasks
from lrl.envs.tinyagent.base import RL_BASE as TINYAGENT
from lrl.envs.tinyagent.base import BaseConfig
from lrl_lab.tools.ship_bases import main as ship_bases


def test_every_shipped_base_is_the_one_its_warm_start_builds(capsys):
    assert ship_bases(["--check"]) == 0, capsys.readouterr().out


def test_the_saved_format_policy_is_current(tok):
    """The copy of the tests' format policy in tests/data is the one today's warm-start code trains (on the machine
    that wrote it); else the tests train it every run, correct but half a minute slower."""
    from format_policy import DATA, PREFIX, saved_folder

    folder = saved_folder(tok)
    kept = sorted(p.name for p in DATA.glob(f"{PREFIX}*"))
    assert (folder / "model.safetensors").exists(), f"{kept} is not {folder.name}: python tests/format_policy.py"
    assert kept == [folder.name], kept  # one copy: an older key's was removed


def test_a_warm_start_key_covers_its_options_and_names_its_folder():
    tok = build_tokenizer(make_tasks("all"))
    assert TINYAGENT.key(tok) == TINYAGENT.key(tok, BaseConfig())
    assert TINYAGENT.key(tok, BaseConfig(steps=151)) != TINYAGENT.key(tok)
    assert TINYAGENT.folder(tok).startswith("base-")
    assert len({TINYAGENT.name, REVIEW.name, CODEFIX.name}) == 3  # one cache folder prefix each


def _cached(cache, built, name):
    """In a process of its own: the policy cached as `name`, its build marking `built` and taking half a second."""
    import os
    import time

    from lrl.policy import make_policy
    from lrl.warmstart import cached_policy

    os.environ["LRL_CACHE"] = str(cache)
    tok = build_tokenizer(make_tasks("all"))

    def build():
        with open(built, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # long enough that the other process asks while this one builds
        return make_policy(tok, seed=0)

    model = cached_policy(name, tok, build)
    return [p.detach().sum().item() for p in model.parameters()]


def test_runs_started_together_on_an_empty_cache_build_a_base_once_and_share_it(tmp_path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from lrl.policy import make_policy

    built = tmp_path / "built"
    fresh = make_policy(build_tokenizer(make_tasks("all")), seed=0)  # (and the processes fork with its imports done)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        both = [pool.submit(_cached, tmp_path / "cache", built, "base-test") for _ in range(2)]
        sums = [f.result() for f in both]
    assert len(built.read_text().splitlines()) == 1  # one process built it, the other waited and loaded it
    assert sums[0] == sums[1] == [p.detach().sum().item() for p in fresh.parameters()]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["base-test", "base-test.lock"]
