"""Bad input gets a clear ConfigError naming the key, the value and what is allowed; shipped YAML parses."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lrl.config import Config, ConfigError, from_dict, parse_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--sampler", "bogus"], "invalid command line"),
        (["--max-steps", "0"], "max_steps: 0 is not allowed; it must be > 0"),
        (["--max-steps", "-3"], "max_steps"),
        (["--episodes-per-task", "0"], "episodes_per_task"),
        (["--tasks-per-step", "0"], "tasks_per_step"),
        (["--lr", "nan"], "lr"),
        (["--model", "/no/such/dir"], "model: '/no/such/dir' does not exist"),
        (["--lag", "-1", "--sampler", "lagged"], "lag: -1 is not allowed"),
        (["--lag", "2"], "needs a stale sampler"),
        (["--cap", "0"], "cap: 0.0 is not allowed"),
        (["--low", "2", "--high", "1"], r"band \[2.0, 1.0\] is empty"),
        (["--fp8-scale", "tensor"], "applies to the fp8 sampler only"),
        (["--correction", "full"], "invalid command line"),
        (["--level", "episode"], "invalid command line"),
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
    with pytest.raises(ConfigError, match="max_steps: '10' is not allowed; it must be int"):
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
    for argv, needle in [(["--sampler", "nope"], "invalid choice"), (["--max-steps", "0"], "max_steps"),
                         (["--model", str(tmp_path)], "not a causal LM")]:  # fmt: skip
        out = subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr and "Traceback" not in out.stderr


def test_help_lists_every_option():
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, timeout=60)
    for flag in ("--config", "--seed", "--max-steps", "--lr", "--sampler", "--model", "--log-dir", "--lag",
                 "--correction", "--level", "--cap", "--veto"):  # fmt: skip
        assert flag in out.stdout
