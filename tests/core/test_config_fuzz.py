"""Fuzzing the config loader: any dict, YAML text or flag string gives a Config or a ConfigError, nothing else."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lrl.arguments import from_dict, parse_args
from lrl.config import OPTIONS, Config, ConfigError

FIELDS = list(OPTIONS)
BOOLEANS = [name for name, opt in OPTIONS.items() if opt.annotation is bool]
FLAGS = (
    ["--" + name.replace("_", "-") for name in FIELDS]
    + ["--no-" + name.replace("_", "-") for name in BOOLEANS]  # --flag alone, --no-flag and --flag true|false
    + ["--config"]
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-5, 70),
    st.floats(),
    st.floats(-2, 2),
    st.text(max_size=12),
    st.sampled_from(
        [
            "onpolicy",
            "lagged",
            "fp8",
            "engine",
            "tis",
            "mis",
            "token",
            "tensor",
            "cpu",
            "gpu",
            "ddp",
            "auto",
            "last",
            "1e-3",
            "nan",
            "/tmp",
            "\x00",
        ]
    ),
    st.sampled_from(
        [10**400, -(2**70), 2**63, "a" * 5000, "/".join(["b" * 200] * 30)]
    ),  # overflow, too-long names
)
values = st.one_of(
    scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=2)
)
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=10), st.integers())


def loads_or_refuses(load):
    try:
        cfg = load()
    except ConfigError as err:
        assert str(err)  # a message, naming what was wrong
        return None
    assert isinstance(cfg, Config)
    return cfg.validate()  # a returned config is valid


@FUZZ
@given(st.dictionaries(keys, values, max_size=6))
def test_random_dicts_give_a_config_or_a_config_error(data):
    loads_or_refuses(lambda: from_dict(data))


def is_help(token: str) -> bool:
    return token.startswith("-h") or (len(token) > 4 and "--help".startswith(token.split("=")[0]))


tokens = st.one_of(
    st.sampled_from(FLAGS),
    st.text(max_size=8),
    st.sampled_from(["0", "-1", "1e9", "nan", "inf", "true", "off", "2", "0.5", "-"]),
)


@FUZZ
@given(st.lists(tokens, max_size=8))
def test_random_flag_strings_give_a_config_or_a_config_error(argv):
    if any(is_help(t) for t in argv):
        return  # --help prints the help and exits 0: not a config at all
    loads_or_refuses(lambda: parse_args(argv))


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=60),
        st.dictionaries(st.sampled_from(FIELDS), scalars, max_size=4).map(
            lambda d: "\n".join(f"{k}: {v!r}" for k, v in d.items())
        ),
    )
)
def test_random_yaml_files_give_a_config_or_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(text)
    loads_or_refuses(lambda: parse_args(["--config", str(path)]))


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("env_failure_rate", 1.0, r"env_failure_rate: 1.0 is not allowed; it must be in \[0, 1\)"),
        ("env_failure_rate", -0.1, "env_failure_rate"),
        ("env_failure_hazard", -1.0, "env_failure_hazard: -1.0 is not allowed; it must be >= 0"),
        (
            "env_failure_hazard",
            float("inf"),
            "env_failure_hazard: inf is not allowed; it must be a finite number",
        ),
        ("checkpoint_every", -1, "checkpoint_every: -1 is not allowed"),
        ("resume", "/no/such.ckpt", "resume: '/no/such.ckpt' does not exist"),
        ("resume", "", "resume: an empty path is not allowed"),
        ("history_file", "", "history_file: an empty path"),
        ("devices", 0, r"devices: 0 is not allowed; it must be in \[1, 4096\]"),
        ("num_nodes", 0, "num_nodes"),
        ("strategy", "fsdp", "strategy: 'fsdp' is not allowed; choose one of auto, ddp"),
        ("accelerator", "tpu", "accelerator: 'tpu' is not allowed"),
        ("devices", 3, "tasks_per_step: 16 does not split over 3 processes"),
        ("seed", -1, r"seed: -1 is not allowed; it must be in \[0, 2147483647\]"),
        ("threads", 10**6, "threads"),
        ("temperature", 1e-9, "temperature"),
        ("lr", 10**400, "lr: 1000.* is not allowed; it must be a finite number"),
        ("model", "a\x00b", "model: 'a\\\\x00b' does not exist"),
    ],
)
def test_new_keys_are_checked_with_key_value_and_rule(key, value, match):
    from lrl.preflight import resolve

    with pytest.raises(ConfigError, match=match):
        resolve(from_dict({key: value}))  # the values, then what the machine must have (paths that exist)


def test_engine_sampler_takes_failure_injection_and_yaml_floats_parse():
    assert from_dict({"sampler": "engine", "env_failure_rate": 0.05}).env_failure_rate == 0.05
    assert from_dict({"lr": "1e-3"}).lr == 1e-3  # YAML 1.1 reads 1e-3 as a string
