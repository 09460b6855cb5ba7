"""Bad input gets a clear ConfigError naming the key, the value and what is allowed; shipped YAML parses."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lrl.arguments import from_dict, parse_args
from lrl.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]


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
    from lrl.preflight import resolve

    with pytest.raises(ConfigError, match=match):
        resolve(parse_args(argv))  # the values, then what the machine must have (a model that exists)


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


def test_train_py_reports_bad_input_without_traceback(tmp_path, capsys, monkeypatch):
    from lrl import train as script

    out = subprocess.run(  # one case as a process: the exit status and stderr a shell sees
        [sys.executable, str(ROOT / "train.py"), "--sampler", "nope"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "choose one of onpolicy" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    monkeypatch.chdir(tmp_path)
    for argv, needle in [
        (["--max-steps", "0"], "max_steps"),
        (["--model", str(tmp_path)], "not a causal LM"),
    ]:
        assert script.main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def help_text():
    """train.py --help, run once for the tests that read it."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.xdist_group("train-help")  # one worker runs train.py --help once for the three
def test_help_lists_every_option(help_text):
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
        assert flag in help_text


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        Config(max_steps=0, lr=-1.0, sampler="bogus", top_p=2.0)
    message = str(err.value)
    for key in ("max_steps", "lr", "sampler", "top_p"):
        assert f"{key}: " in message


def test_optional_float_options_are_typed():
    """An option typed `float | None` is checked like any other (it used to raise KeyError)."""
    assert Config(memory_budget=None).memory_budget is None and Config(memory_budget=2).memory_budget == 2
    with pytest.raises(ConfigError, match="memory_budget: 'x' is not allowed; it must be a number or null"):
        Config(memory_budget="x")
    with pytest.raises(ConfigError, match=r"memory_budget: -1 is not allowed; it must be in \(0, 1048576\]"):
        Config(memory_budget=-1)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--deterministic"], True),
        (["--no-deterministic"], False),
        (["--deterministic", "true"], True),
        (["--deterministic", "false"], False),
        (["--deterministic", "--max-steps", "4"], True),  # a bare flag before another flag
        (["--no-deterministic", "--deterministic"], True),  # the last one given wins
    ],
)
def test_a_boolean_flag_takes_the_bare_the_negated_and_the_valued_form(argv, expected):
    assert parse_args(["--pipeline", "async", *argv]).deterministic is expected


def test_a_negated_boolean_flag_takes_no_value():
    with pytest.raises(ConfigError, match="invalid command line: .*--no-progress takes no value"):
        parse_args(["--no-progress", "true"])
    with pytest.raises(ConfigError, match="--progress.*'maybe' is not allowed; it must be true or false"):
        parse_args(["--progress", "maybe"])


@pytest.mark.xdist_group("train-help")  # one worker runs train.py --help once for the three
def test_help_shows_both_forms_of_a_boolean_flag(help_text):
    assert "--deterministic [true|false], --no-deterministic" in help_text
    assert "--progress [true|false], --no-progress" in help_text


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--max-steps", "abc"], r"--max-steps: 'abc' is not allowed; it must be an integer"),
        (["--lr", "fast"], r"--lr: 'fast' is not allowed; it must be a number"),
        (["--max-steps"], "--max-steps: expected one argument"),
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_a_bad_command_line_is_one_config_error(argv, match):
    with pytest.raises(ConfigError, match=match) as err:
        parse_args(argv)
    assert "\n" not in str(err.value) and "usage:" not in str(err.value)


@pytest.mark.parametrize(
    "settings, key",
    [
        (dict(rollout_workers=2), "rollout_workers"),
        (dict(max_staleness=0), "max_staleness"),
        (dict(partial_rollouts="drain"), "partial_rollouts"),
        (dict(deterministic=True), "deterministic"),
        (dict(worker_timeout=5.0), "worker_timeout"),
        (dict(staleness_drop=False), "staleness_drop"),
        (dict(pipeline="async", switch_tokens=8), "switch_tokens"),
        (
            dict(pipeline="async", deterministic=True, partial_rollouts="drain", switch_tokens=8),
            "switch_tokens",
        ),
    ],
)
def test_an_option_of_another_mode_is_refused(settings, key):
    with pytest.raises(
        ConfigError, match=f"^{key}: .* is not used with .*; it applies only with pipeline: async"
    ):
        Config(**settings)


def test_options_of_the_chosen_mode_are_accepted():
    cfg = Config(
        pipeline="async", deterministic=True, switch_tokens=8, rollout_workers=2, staleness_drop=False
    )
    assert cfg.switch_tokens == 8 and cfg.rollout_workers == 2
    assert (
        Config(slots=4, tool_timeout=2.0).slots == 4
    )  # the rollout engine's options belong to both pipelines
    assert Config(pipeline="async", slots=4, tool_latency="lognormal:0.01:0.5").slots == 4


def test_more_rollout_workers_than_groups_of_work_are_refused():
    with pytest.raises(ConfigError, match=r"rollout_workers: 5 is more than the 4 groups of work a step has"):
        Config(pipeline="async", rollout_workers=5, tasks_per_step=4)
    with pytest.raises(ConfigError, match=r"rollout_workers: 3 is more than the 2 groups"):
        Config(pipeline="async", rollout_workers=3, tasks_per_step=4, devices=2)
    assert Config(pipeline="async", rollout_workers=4, tasks_per_step=4).rollout_workers == 4


def test_rollout_workers_that_do_not_fit_in_memory_are_refused(monkeypatch):
    import lrl.budget
    from lrl.preflight import resolve

    monkeypatch.setattr(lrl.budget, "available_bytes", lambda: 2 * 2**30)  # a 2 GiB machine
    with pytest.raises(
        ConfigError, match=r"rollout_workers: 8 workers need about 3.1 GiB .* 2.0 GiB available"
    ):
        resolve(Config(pipeline="async", rollout_workers=8))  # the preflight's check: it reads the machine
    assert resolve(Config(pipeline="async", rollout_workers=4)).rollout_workers == 4


@pytest.mark.parametrize("name", ["../up", "a/b", "/abs", "..", ".", "a\x00b"])
def test_a_run_name_that_is_a_path_is_refused(name):
    with pytest.raises(ConfigError, match="run_name: .* must be one folder name under log_dir"):
        Config(run_name=name)
    assert Config(run_name="my-run.v2").run_name == "my-run.v2"


def test_options_live_in_sections_and_read_flat_as_before():
    from lrl.config import OPTIONS, SECTIONS
    from lrl.sections import SamplingOptions, UpdateOptions

    cfg = Config(lr=2e-3, sampler="lagged", lag=2)
    assert (cfg.update.lr, cfg.sampling.sampler, cfg.sampling.lag) == (2e-3, "lagged", 2)
    assert cfg.lr is cfg.update.lr and cfg.lag == 2
    cfg.lag = 3  # the flat name writes into the section
    assert cfg.sampling.lag == 3
    whole = Config(update=UpdateOptions(lr=5e-4), sampling=SamplingOptions(sampler="lagged", lag=1))
    assert whole == Config(lr=5e-4, sampler="lagged", lag=1)
    assert set(cfg.to_dict()) == set(OPTIONS) and len(OPTIONS) > 90
    assert {o.section for o in OPTIONS.values()} == set(SECTIONS)
    with pytest.raises(ConfigError, match="lr: -1.0 is not allowed"):
        Config(update=UpdateOptions(lr=-1.0))  # a section is checked as its flat options are
    with pytest.raises(TypeError, match="learning_rate"):
        Config(learning_rate=1e-3)


def test_the_options_a_resumed_run_may_change_are_declared_on_them():
    from lrl.checkpoint import RESUMABLE_CHANGES

    assert RESUMABLE_CHANGES == {
        "max_steps", "log_dir", "run_name", "threads", "progress", "checkpoint_every", "checkpoint_dir", "resume",
        "history_file", "eval_every", "eval_episodes", "eval_at_start", "step_kl", "accelerator", "monitor_mismatch",
        "monitor_staleness", "monitor_timing", "monitor_env", "health_check", "health_threshold",
        "health_threshold_p99", "health_strict", "histogram_every", "overwrite", "monitor_jumps", "jump_factor",
        "rollout_backend", "worker_cpus", "worker_gpus", "ray_address", "worker_restarts", "worker_threads",
        "monitor_rows",
    }  # fmt: skip


@pytest.mark.xdist_group("train-help")  # one worker runs train.py --help once for the three
def test_help_lists_the_options_section_by_section(help_text):
    from lrl.arguments import HEADINGS

    at = [help_text.index(f"\n{heading}:\n") for heading in HEADINGS.values()]
    assert at == sorted(at)  # every section, in order
    assert help_text.index("\n  --lr ") > help_text.index("\nupdate:") > help_text.index("\n  --seed ")
    assert "--max-steps MAX_STEPS" in help_text and "(may change on resume)" in help_text
