"""Hostile or mistaken input is refused before anything is built: exit 2 and one line that says what and why.

Each case here once got through (it ran, hung, wrote where it should not, or ended in a traceback or a
misleading message); every refusal must come before the run trains, warm-starts or starts a worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import FAST, ROOT, one_clear_line, train, wait_until

from lrl.policy import make_policy, save_policy


def refused(*args, needles=()) -> str:
    out = train(*args)
    one_clear_line(out, 2, "train.py: error:", *needles)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr


# -- names and files ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../escaped", "a/b", "/abs/olute", "..", "."])
def test_a_run_name_that_is_a_path_is_refused(tmp_path, model_dir, name):
    refused(
        *FAST,
        "--model",
        str(model_dir),
        "--log-dir",
        str(tmp_path / "runs"),
        "--run-name",
        name,
        needles=("run_name",),
    )
    assert not (tmp_path / "escaped").exists() and not Path("/abs/olute").exists()


def test_a_history_file_that_is_not_an_lrl_history_is_left_alone(tmp_path, model_dir):
    config = tmp_path / "mine.yaml"
    config.write_text("lr: 0.001\nmax_steps: 3\n")
    refused(
        *FAST,
        "--model",
        str(model_dir),
        "--log-dir",
        str(tmp_path / "runs"),
        "--history-file",
        str(config),
        needles=("history_file", "not an lrl history"),
    )
    assert config.read_text() == "lr: 0.001\nmax_steps: 3\n"


@pytest.mark.slow  # 15 s on 2 cores: out of the default run (pytest -m slow)
def test_a_checkpoint_dir_in_use_by_a_live_run_is_refused(tmp_path, model_dir):
    shared = tmp_path / "ck"
    history = tmp_path / "first.jsonl"
    first = [*FAST, "--model", str(model_dir), "--checkpoint-dir", str(shared), "--checkpoint-every", "1"]
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *first,
            "--max-steps",
            "100000",
            "--history-file",
            str(history),
            "--log-dir",
            str(tmp_path / "first"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: history.exists() and history.read_text().strip(), 120, "the first run's first step"
        )
        refused(*first, "--log-dir", str(tmp_path / "runs"), needles=("checkpoint_dir", "in use"))
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # the lock goes with the process that held it: the folder can be used again at once
    again = train(*first, "--log-dir", str(tmp_path / "runs"), "--max-steps", "1", "--overwrite")
    assert again.returncode == 0, again.stderr[-2000:]


# -- plugins --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raised", ["SystemExit(0)", "SystemExit('bye')", "KeyboardInterrupt()"])
def test_a_plugin_that_exits_or_interrupts_on_import_is_a_config_error(tmp_path, monkeypatch, raised):
    name = f"exiting_{abs(hash(raised))}"
    (tmp_path / f"{name}.py").write_text(f"raise {raised}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    refused("--plugins", name, *FAST, needles=("plugins", name, raised.split("(")[0]))


# -- YAML -----------------------------------------------------------------------------------------------
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i, name in enumerate("bcdefghi"):
        previous = "abcdefghi"[i]
        lines.append(f"{name}: &{name} [{','.join(['*' + previous] * 9)}]")
    lines.append("plugins: *i")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 400
    start = time.time()
    refused("--config", str(bomb), needles=("config", "alias"))
    assert time.time() - start < 5


def test_a_huge_yaml_file_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000 + "lr: 0.001\n")
    refused("--config", str(big), needles=("config", "larger than"))


def test_a_yaml_key_given_twice_is_refused(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("lr: 0.001\nmax_steps: 3\nlr: 0.1\n")
    refused("--config", str(twice), needles=("lr", "twice"))


# -- options that do not apply ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--rollout-workers", "4"], "rollout_workers"),
        (["--deterministic", "true"], "deterministic"),
        (["--max-staleness", "7"], "max_staleness"),
        (["--partial-rollouts", "drain"], "partial_rollouts"),
        (
            [
                "--pipeline",
                "async",
                "--partial-rollouts",
                "drain",
                "--deterministic",
                "true",
                "--switch-tokens",
                "8",
            ],
            "switch_tokens",
        ),
        (["--pipeline", "async", "--switch-tokens", "8"], "switch_tokens"),
        (["--worker-timeout", "5"], "worker_timeout"),
    ],
)
def test_options_that_do_not_apply_to_the_pipeline_are_refused(flags, needle):
    refused(*FAST, *flags, needles=(needle,))


def test_more_workers_than_groups_of_work_is_refused():
    refused(*FAST, "--pipeline", "async", "--rollout-workers", "4", needles=("rollout_workers", "groups"))


def test_workers_that_do_not_fit_in_memory_are_refused(monkeypatch, tmp_path):
    import lrl.budget

    # the preflight's check, on a machine of 2 GiB (a config with more workers than groups of work is refused
    # before: the values alone rule it out)
    monkeypatch.setattr(lrl.budget, "available_bytes", lambda: 2 * 2**30)
    flags = (
        "--pipeline",
        "async",
        "--rollout-workers",
        "8",
        "--tasks-per-step",
        "16",
        "--episodes-per-task",
        "16",
    )
    refused(
        *flags, "--log-dir", str(tmp_path / "runs"), needles=("rollout_workers", "GiB", "2.0 GiB available")
    )
    assert not (tmp_path / "runs").exists()  # refused before the run started


# -- update options that the chosen loss, correction or masks do not read ------------------------------------
UNREAD = [
    (["--loss", "pg", "--eps-low", "0.1"], ("eps_low: 0.1 is not used", "pg")),
    (["--loss", "cispo", "--eps-low", "0.1"], ("eps_low: 0.1 is not used", "cispo")),
    (["--loss", "pg", "--eps-high", "0.4"], ("eps_high: 0.4 is not used", "pg")),
    (["--level", "sequence"], ("level: 'sequence' is not used by correction 'none'",)),
    (["--normalize", "true"], ("normalize: true is not used by correction 'none'",)),
    (["--masks", "kl,kl"], ("masks: 'kl' is given twice",)),
]


@pytest.mark.parametrize("flags, needles", UNREAD, ids=lambda v: " ".join(v))
def test_an_update_option_that_nothing_reads_is_refused(tmp_path, flags, needles):
    refused(*FAST, *flags, "--log-dir", str(tmp_path / "runs"), needles=needles)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("loss: pg\neps_low: 0.1\neps_high: 0.4\n", "eps_high: 0.4 is not used"),
        ("loss: cispo\neps_low: 0.1\n", "eps_low: 0.1 is not used"),
        ("correction: none\nlevel: geometric\n", "level: 'geometric' is not used by correction 'none'"),
        ("normalize: true\n", "normalize: true is not used by correction 'none'"),
        ("masks: [kl, opsm, kl]\n", "masks: 'kl' is given twice"),
    ],
)
def test_an_update_option_that_nothing_reads_is_refused_in_yaml(tmp_path, text, needle):
    config = tmp_path / "update.yaml"
    config.write_text(text)
    refused("--config", str(config), *FAST, "--log-dir", str(tmp_path / "runs"), needles=(needle,))
    assert not (tmp_path / "runs").exists()


def test_a_plugin_entry_that_reads_an_option_that_does_not_exist_is_refused(tmp_path, monkeypatch):
    from lrl.registry import MASKS

    monkeypatch.setattr(MASKS, "entries", dict(MASKS.entries))  # the plugin's mask is gone after the test
    (tmp_path / "misspelt_mask.py").write_text(
        "from lrl.masks import register_mask\n\n\n"
        "@register_mask('misspelt', uses=('kl_treshold',), per_row=True)\n"
        "def keep(logp_trainer, logp_sampler, mask, advantage, options):\n"
        "    return mask.bool()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    flags = ("--plugins", "misspelt_mask", "--masks", "misspelt", *FAST, "--log-dir", str(tmp_path / "runs"))
    refused(*flags, needles=("masks: 'misspelt'", "'kl_treshold'"))
    assert not (tmp_path / "runs").exists()


# -- models and tokenizers --------------------------------------------------------------------------------
def test_a_model_with_a_context_shorter_than_an_episode_is_refused(tmp_path, tok):
    short = make_policy(tok, max_position_embeddings=16)
    save_policy(short, tok, tmp_path / "short")
    refused(*FAST, "--model", str(tmp_path / "short"), needles=("model", "16", "positions"))


def test_huge_weights_are_not_called_a_non_causal_model(tmp_path, tok):
    model = make_policy(tok)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e15)
    save_policy(model, tok, tmp_path / "huge")
    err = refused(*FAST, "--model", str(tmp_path / "huge"), needles=("model",))
    assert "not a causal LM" not in err
    assert "finite" in err or "large" in err


def test_a_tokenizer_that_cannot_spell_the_actions_is_refused_before_the_warm_start(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", "hello", "world"])}
    word = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=word, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(tmp_path / "tok")
    start = time.time()
    err = refused(*FAST, "--tokenizer", str(tmp_path / "tok"), needles=("tokenizer", "read"))
    assert time.time() - start < 20  # not after a warm start
    assert err.count("tokenizer:") == 1


def test_a_broken_tokenizer_folder_names_the_option_once(tmp_path):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{ not json")
    err = refused(*FAST, "--tokenizer", str(tmp_path / "tok"), needles=("tokenizer",))
    assert "tokenizer: tokenizer:" not in err


# -- messages -----------------------------------------------------------------------------------------------
def test_a_checkpoint_of_random_bytes_gets_lrl_words_not_torch_advice(tmp_path):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(os.urandom(2048))
    err = refused(*FAST, "--resume", str(junk), "--log-dir", str(tmp_path / "runs"), needles=("junk.ckpt",))
    assert "weights_only" not in err and "likely succeed" not in err and "trust" not in err


@pytest.mark.parametrize("flags", [["--max-steps", "abc"], ["--lr", "fast"], ["--max-steps"]])
def test_a_flag_of_the_wrong_type_is_one_line(flags):
    out = train(*flags)
    text = out.stderr
    assert out.returncode == 2
    assert len(text.strip().splitlines()) == 1, text
    assert flags[0].lstrip("-").replace("-", "_") in text or flags[0] in text
    assert "usage:" not in text


def test_the_jump_monitor_never_prints_a_ratio_to_zero():
    from lrl.callbacks.jumps import JumpMonitor

    monitor = JumpMonitor(factor=5.0)
    text = monitor.describe(7, "train/step_kl", "KL of the step", 0.125, 0.0)
    assert "x its median" not in text and "0.125" in text and "median 0" in text
    text = monitor.describe(7, "train/invalid", "malformed-action rate", 0.5, 0.05)
    assert "10.0x its rate 0.05" in text
