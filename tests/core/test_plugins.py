"""A user's sampler, correction, environment and metric, defined in examples/ (outside the package), selected
from a YAML file through `plugins`, train together; bad plugins and unknown names are clear config errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrl.arguments import parse_args
from lrl.config import Config, ConfigError
from lrl.run import build_run, fit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def in_examples(monkeypatch):
    monkeypatch.chdir(EXAMPLES)


def test_plugin_sampler_correction_env_and_metric_train_together(in_examples, tmp_path):
    cfg = parse_args(
        ["--config", "plugin.yaml", "--max-steps", "3", "--progress", "false", "--log-dir", str(tmp_path)]
    )
    assert (cfg.sampler, cfg.correction, cfg.env, cfg.callbacks) == (
        "lagged_topk",
        "tis_both",
        "echo",
        ["signal"],
    )
    assert (
        cfg.max_turns == 1 and cfg.tasks_per_step == 4
    )  # the env's own defaults, for keys the YAML leaves out
    run = build_run(cfg, logger=False)
    before = [p.detach().clone() for p in run.policy.parameters()]
    # top-k sampling is not the trainer's full distribution: the first step's check says so, naming the sampler
    with pytest.warns(UserWarning, match="HealthCheck: at the first step .* 'lagged_topk' disagree"):
        fit(run)
    history = run.module.history
    assert run.spec.name == "echo" and run.sampler.name == "lagged_topk" and run.sampler.sampling.top_k == 3
    assert [h["staleness/token_mean"] for h in history] == [0.0, 1.0, 1.0]  # lag 1, from the version tags
    assert all(h["train/action_tokens"] <= 2 for h in history)  # echo's budget: a word and eos
    step = run.module.last_step
    on = step.batch["action_mask"].bool()
    raw = (step.old_logp - step.batch["sample_logp"])[on].exp()
    expected = raw.clamp(1 / cfg.cap, cfg.cap)
    assert (
        torch.allclose(step.weights[on], expected, rtol=1e-5) and (raw != expected).any()
    )  # clamped both ways
    monitor = next(c for c in run.trainer.callbacks if type(c).__name__ == "SignalMonitor")
    assert 0 <= monitor.last <= 1
    assert any(h["train/skipped"] == 0 for h in history)
    assert any(not torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))


def test_a_plugin_mask_is_chosen_like_a_built_in_and_logs_what_it_dropped(in_examples):
    cfg = parse_args(
        [
            "--plugins",
            "my_plugin",
            "--env",
            "echo",
            "--sampler",
            "lagged",
            "--lag",
            "1",
            "--masks",
            "spike,kl",
        ]
        + ["--high", "1.05", "--max-steps", "3", "--progress", "false", "--eval-at-start", "false"]
    )
    assert cfg.masks == ["spike", "kl"]
    run = build_run(cfg, logger=False)
    fit(run)
    history = run.module.history
    step = run.module.last_step
    on = step.batch["action_mask"].bool()
    over = ((step.old_logp - step.batch["sample_logp"]) > torch.tensor(1.05).log()) & on
    spiked = over.any(-1)  # [B] episodes the mask must have left out
    assert spiked.any(), "no token above the bound: the test proves nothing"
    assert (step.weights[spiked] == 0).all()
    dropped = on[spiked].sum().item() / on.sum().item()
    assert history[-1]["offpolicy/dropped_tokens/spike"] == pytest.approx(dropped)
    assert "offpolicy/dropped_seqs/kl" in history[-1]


def test_a_wrapped_built_in_sampler_trains_like_the_built_in(in_examples, tmp_path):
    flags = ["--max-steps", "2", "--tasks-per-step", "2", "--episodes-per-task", "4", "--eval-episodes", "1"]
    cfg = parse_args(
        ["--plugins", "my_plugin", "--sampler", "onpolicy_counted", *flags, "--progress", "false"]
    )
    run = build_run(cfg, logger=False)
    fit(run)
    assert run.sampler.name == "onpolicy_counted" and run.sampler.syncs >= 2  # one sync after each update
    assert all(h["staleness/token_mean"] == 0.0 for h in run.module.history)  # still on-policy


@pytest.mark.early
def test_train_py_runs_the_plugin_yaml(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "--config",
            "plugin.yaml",
            "--max-steps",
            "2",
            "--progress",
            "false",
            "--log-dir",
            str(tmp_path),
        ],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "env echo | sampler lagged_topk lag 1 correction tis_both" in out.stdout


def test_unknown_names_list_what_is_registered(in_examples):
    parse_args(["--plugins", "my_plugin"])  # registers lagged_topk, tis_both, echo, signal
    for key, value, listed in [
        ("sampler", "nope", "lagged_topk"),
        ("correction", "nope", "tis_both"),
        ("env", "nope", "echo"),
        ("callbacks", ["nope"], "signal"),
    ]:
        with pytest.raises(ConfigError, match=f"{key}: 'nope' is not allowed; choose one of .*{listed}"):
            Config(**{key: value})


def test_top_k_is_refused_for_a_sampler_that_does_not_read_it():
    with pytest.raises(ConfigError, match=r"top_k: 3 is not used by sampler 'lagged'; it applies to: engine"):
        Config(sampler="lagged", top_k=3)


@pytest.mark.parametrize(
    "source, match",
    [
        ("x = 1 / 0\n", r"plugins: cannot import 'bad_plugin' \(ZeroDivisionError: division by zero\)"),
        (
            "from lrl import samplers\n\n@samplers.register('lagged')\ndef again(cfg, tok):\n    return None\n",
            r"plugins: 'bad_plugin': sampler 'lagged' is registered twice",
        ),
    ],
)
def test_a_broken_plugin_is_a_config_error(tmp_path, monkeypatch, source, match):
    (tmp_path / "bad_plugin.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=match):
        parse_args(["--plugins", "bad_plugin"])
    assert "bad_plugin" not in sys.modules
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module' \(ModuleNotFoundError"):
        Config(plugins=["no_such_module"])
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--plugins", "bad_plugin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "bad_plugin" in out.stderr


@pytest.mark.slow  # 15 s on 2 cores: out of the default run (pytest -m slow)
def test_help_lists_registered_entries():
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--plugins", "my_plugin", "--help"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join(out.stdout.split())
    for entry in (
        "onpolicy, lagged, fp8, engine, vllm, lagged_topk",
        "none, tis, mis, tis_both",
        "tinyagent, review, echo",
    ):
        assert entry in text, entry


def test_a_plugin_staleness_policy_chooses_the_groups_a_batch_takes(in_examples):
    from lrl.pipeline.messages import GroupDone
    from lrl.pipeline.policies import ThrottleOnly, make_stale_policy
    from lrl.pipeline.schedule import FreeSchedule
    from lrl.registry import STALENESS

    # --stale-policy offers what is registered: the plugin's policy, and none (the throttle alone)
    cfg = parse_args(["--plugins", "my_plugin", "--pipeline", "async", "--stale-policy", "newest-first"])
    assert STALENESS["newest-first"].help.startswith("take the groups that finished last first")
    assert type(make_stale_policy(cfg.replace(stale_policy="none").rollout)) is ThrottleOnly
    policy = make_stale_policy(cfg.rollout)
    schedule = FreeSchedule(2, 1, 1, 1, 0, policy)  # two groups of one a batch
    for serial in (4, 0, 7):  # finished in this order
        schedule.accept(GroupDone(0, serial, [], 1.0))
    assert [s for s, _ in schedule.take()] == [7, 0]
    assert [s for s, _ in schedule.ready] == [4]


def test_the_extending_doc_shows_the_code_the_tests_run():
    import re

    # the update's parts are tests/plugins/update_parts.py, which test_loss_catalogue trains with from a file
    source = (EXAMPLES / "my_plugin.py").read_text() + (ROOT / "tests" / "plugins" / "update_parts.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "extending.md").read_text(), re.S)
    assert len(blocks) == 9  # 3 samplers, a correction, a mask, the update's parts, an environment, a metric, a policy
    for block in blocks:
        assert block.strip() in source, block[:80]
