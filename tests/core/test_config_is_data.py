"""A configuration is data: making one parses and checks values only. What needs the machine (a named model
resolved and converted, the memory of the workers, a sandbox probe, the paths that must exist) is the preflight's,
once, in the process that starts the run; the rollout workers take the values it resolved and do neither again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import quick_cfg

from lrl.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]

# run in a fresh interpreter: every way of starting a process fails loudly, before lrl is imported
NO_PROCESSES = textwrap.dedent(
    """
    import os, subprocess, sys

    def refused(*args, **kwargs):
        raise AssertionError("a process was started")

    subprocess.Popen.__init__ = refused
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve", "execv",
                 "execve"):
        if hasattr(os, name):
            setattr(os, name, refused)
    from lrl.config import Config
    """
)


def in_fresh_process(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """`code` after NO_PROCESSES, with a cache, a home and a temporary folder of its own (all empty)."""
    for name in ("cache", "home", "tmp"):
        (tmp_path / name).mkdir()
    env = {
        **os.environ,
        "LRL_CACHE": str(tmp_path / "cache"),
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", NO_PROCESSES + textwrap.dedent(code)],
        cwd=tmp_path / "home",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def written(tmp_path: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())


def test_a_config_naming_a_model_writes_nothing_and_starts_no_process(tmp_path):
    out = in_fresh_process(
        tmp_path,
        """
        cfg = Config(model="smollm2-135m")
        assert cfg.model == "smollm2-135m", cfg.model  # a name until the run's preflight resolves it
        Config(env="calc")  # calc's default model is the named one
        Config(env="codefix", sandbox="namespaces", max_steps=1)
        Config(pipeline="async", rollout_workers=2, rollout_backend="local", model="smollm2-135m")
        print("made")
        """,
    )
    assert out.returncode == 0 and "made" in out.stdout, out.stderr[-3000:]
    assert written(tmp_path) == []  # the cache, the home folder and TMPDIR stay empty


def test_making_a_config_asks_nothing_of_the_machine(monkeypatch):
    import lrl.budget
    import lrl.envs.codefix
    import lrl.models

    def asked(*args, **kwargs):
        raise AssertionError("the machine was asked")

    monkeypatch.setattr(lrl.models, "resolve_model", asked)
    monkeypatch.setattr(lrl.budget, "available_bytes", asked)
    monkeypatch.setattr(lrl.envs.codefix, "_namespaces_work", asked)
    monkeypatch.setattr(lrl.envs.codefix, "load_tasks", asked)
    assert Config(model="smollm2-135m", tokenizer="smollm2-135m").model == "smollm2-135m"
    Config(pipeline="async", rollout_workers=8, model="/no/such/dir", resume="/no/such.ckpt")
    Config(env="codefix", sandbox="namespaces", codefix_tasks="/no/such/tasks")
    Config(pipeline="async", rollout_backend="ray", ray_address=None)


def test_the_preflight_refuses_what_the_machine_cannot_give_in_one_error(monkeypatch):
    import lrl.budget
    from lrl.preflight import resolve

    with pytest.raises(ConfigError, match=r"^model: '/no/such/dir' does not exist"):
        resolve(Config(model="/no/such/dir"))
    with pytest.raises(ConfigError, match="resume: '/no/such.ckpt' does not exist"):
        resolve(Config(resume="/no/such.ckpt"))
    monkeypatch.setattr(lrl.budget, "available_bytes", lambda: 2 * 2**30)  # a 2 GiB machine
    cfg = Config(pipeline="async", rollout_workers=8)  # made: the values alone are fine
    with pytest.raises(
        ConfigError, match=r"rollout_workers: 8 workers need about 3.1 GiB .* 2.0 GiB available"
    ):
        resolve(cfg)


def test_a_run_resolves_once_and_its_workers_take_the_resolved_values(model_dir, monkeypatch):
    """--model by name: the preflight resolves it, once; the rollout workers (threads here, so that the test sees
    them) are given the folder and neither check nor resolve their configuration again."""
    import lrl.models
    import lrl.preflight
    from lrl.run import build_run, fit

    calls = []
    monkeypatch.setattr(
        lrl.models, "resolve_model", lambda name, verbose=True: calls.append(name) or model_dir
    )
    cfg = quick_cfg(
        model="smollm2-135m",
        pipeline="async",
        rollout_backend="thread",
        rollout_workers=1,
        max_steps=1,
        eval_at_start=False,
    )
    run = build_run(cfg, callbacks=[], logger=False)
    assert calls == ["smollm2-135m"] and run.cfg.model == str(model_dir)

    def again(*args, **kwargs):
        raise AssertionError("a worker checked or resolved its configuration again")

    made = []
    resolved = Config.resolved.__func__
    monkeypatch.setattr(
        Config, "resolved", classmethod(lambda cls, values: made.append(values) or resolved(cls, values))
    )
    monkeypatch.setattr(Config, "validate", again)
    monkeypatch.setattr(lrl.preflight, "resolve", again)
    monkeypatch.setattr(lrl.models, "resolve_model", again)
    fit(run)
    assert made and all(values["model"] == str(model_dir) for values in made)
    assert calls == ["smollm2-135m"]


def test_a_workers_configuration_is_taken_as_it_is(monkeypatch):
    """Config.resolved: the values as the preflight left them, nothing checked (a value the static checks would
    refuse comes through as it is), the plugins' entries loaded."""
    import lrl.models

    monkeypatch.setattr(lrl.models, "resolve_model", lambda *a, **k: pytest.fail("resolved again"))
    values = {
        **Config().to_dict(),
        "model": "smollm2-135m",
        "lag": 3,
    }  # lag 3 with onpolicy: refused by Config()
    with pytest.raises(ConfigError, match="lag: 3 is not used by sampler 'onpolicy'"):
        Config(**values)
    cfg = Config.resolved(values)
    assert (cfg.model, cfg.lag, cfg.update.lr) == ("smollm2-135m", 3, Config().lr)
    with pytest.raises(ConfigError, match="plugins: cannot import 'no_such_plugin_module'"):
        Config.resolved({**values, "plugins": ["no_such_plugin_module"]})
