"""Bad input gets a clear ConfigError naming the key, the value and what is allowed; shipped YAML parses."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lrl.arguments import from_dict, parse_args
from lrl.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "argv, match",
    [
        (
            ["--sampler", "bogus"],
            r"sampler: 'bogus' is not allowed; choose one of onpolicy, lagged, fp8, engine",
        ),
        (["--max-steps", "0"], r"max_steps: 0 is not allowed; it must be in \(0, 10000000\]"),
        (["--max-steps", "-3"], "max_steps"),
        (["--episodes-per-task", "0"], "episodes_per_task"),
        (["--tasks-per-step", "0"], "tasks_per_step"),
        (["--lr", "nan"], "lr"),
        (["--model", "/no/such/dir"], "model: '/no/such/dir' does not exist"),
        (["--lag", "-1", "--sampler", "lagged"], "lag: -1 is not allowed"),
        (["--lag", "2"], r"lag: 2 is not used by sampler 'onpolicy'; it applies to: lagged, fp8, engine"),
        (["--cap", "0"], "cap: 0.0 is not allowed"),
        (["--low", "2", "--high", "1"], r"band \[2.0, 1.0\] is empty"),
        (["--fp8-scale", "tensor"], r"fp8_scale: 'tensor' is not used by sampler 'onpolicy'"),
        (
            ["--sampler", "engine", "--fp8-scale", "tensor"],
            "applies to the engine only with engine_fp8: true",
        ),
        (["--correction", "full"], r"correction: 'full' is not allowed; choose one of none, tis, mis"),
        (["--level", "episode"], "level: 'episode' is not allowed; choose one of token, sequence, geometric"),
        (
            ["--max-steps", "99999999999999999999999"],
            r"max_steps: .* is not allowed; it must be in \(0, 10000000\]",
        ),
        (["--max-steps", "abc"], "invalid command line"),
    ],
)
def test_bad_flags_raise_config_error(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse_args(argv)


def test_bad_dict_values_name_key_value_and_choices():
    with pytest.raises(ConfigError, match=r"sampler: 'bogus' is not allowed; choose one of onpolicy, lagged"):
        from_dict({"sampler": "bogus"})
    with pytest.raises(ConfigError, match=r"correction: 'full' is not allowed; choose one of none, tis, mis"):
        from_dict({"correction": "full"})
    with pytest.raises(ConfigError, match="max_steps: '10' is not allowed; it must be an integer"):
        from_dict({"max_steps": "10"})
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'; known keys:"):
        from_dict({"learning_rate": 1e-3})


def test_yaml_unknown_key_and_flags_override(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampler: lagged\nlagg: 4\n")
    with pytest.raises(ConfigError, match="unknown key 'lagg'"):
        parse_args(["--config", str(bad)])
    good = tmp_path / "good.yaml"
    good.write_text("sampler: lagged\nlag: 4\nlr: 0.002\n")
    cfg = parse_args(["--config", str(good), "--lr", "1e-3"])
    assert (cfg.sampler, cfg.lag, cfg.lr) == ("lagged", 4, 1e-3)
    with pytest.raises(ConfigError, match="does not exist"):
        parse_args(["--config", str(tmp_path / "missing.yaml")])
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        parse_args(["--config", str(tmp_path / "list.yaml")])


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_yaml_parses(path):
    cfg = parse_args(["--config", str(path)])
    assert isinstance(cfg, Config)


def test_defaults_match_the_default_yaml():
    assert parse_args(["--config", str(ROOT / "configs" / "default.yaml")]) == Config()


def test_train_py_reports_bad_input_without_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    for argv, needle in [
        (["--sampler", "nope"], "choose one of onpolicy"),
        (["--max-steps", "0"], "max_steps"),
        (["--model", str(tmp_path)], "not a causal LM"),
    ]:
        out = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr and "Traceback" not in out.stderr


def test_help_lists_every_option():
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    for flag in (
        "--config",
        "--seed",
        "--max-steps",
        "--lr",
        "--sampler",
        "--model",
        "--log-dir",
        "--lag",
        "--correction",
        "--level",
        "--cap",
        "--veto",
    ):
        assert flag in out.stdout


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        Config(max_steps=0, lr=-1.0, sampler="bogus", top_p=2.0)
    message = str(err.value)
    for key in ("max_steps", "lr", "sampler", "top_p"):
        assert f"{key}: " in message


def test_optional_float_fields_are_typed(monkeypatch):
    """A field typed `float | None` is checked like any other (it used to raise KeyError)."""
    from dataclasses import dataclass

    from lrl.config import option

    @dataclass
    class Extended(Config):
        budget: float | None = option(None, "an optional number", gt=0)

    assert Extended(budget=None).budget is None and Extended(budget=2).budget == 2
    with pytest.raises(ConfigError, match="budget: 'x' is not allowed; it must be a number or null"):
        Extended(budget="x")
    with pytest.raises(ConfigError, match="budget: -1 is not allowed; it must be > 0"):
        Extended(budget=-1)
