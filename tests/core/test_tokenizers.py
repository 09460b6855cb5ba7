"""Real tokenizers: a BPE tokenizer built here with the `tokenizers` library (the hub is out of reach), saved
with save_pretrained, drives TinyAgent's text and trains a few steps; a chat template frames the turns."""

from __future__ import annotations

import pytest
import torch
from conftest import quick_cfg

from lrl.envs.tinyagent import make_tasks, tinyagent_spec
from lrl.envs.tinyagent.base import BaseConfig, train_base
from lrl.run import build_run, fit
from lrl.tokenizers import HFTokenizer, WordTokenizer, load_tokenizer

CHAT = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def corpus() -> list[str]:
    texts = []
    for t in make_tasks("all"):
        texts += [t.prompt, t.source]
    return texts + ["read", *(f"answer {k}" for k in range(1, 6))] * 20


def save_bpe(path, chat: bool = False) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"] + (
        ["<|user|>", "<|assistant|>", "<|end|>"] if chat else []
    )
    bpe.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=160, special_tokens=specials))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    if chat:
        fast.chat_template = CHAT
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return save_bpe(tmp_path_factory.mktemp("bpe"))


def test_a_saved_fast_tokenizer_loads_and_round_trips(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    assert isinstance(tok, HFTokenizer) and len(tok) <= 160
    for text in corpus()[:10]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert len(ids) < len(text.split()) * 2  # merges happened: not one token per character
    assert tok.prompt("read")[0] == tok.bos_id and tok.observation("read") == tok.encode("read")


def test_tinyagent_speaks_through_the_bpe_tokenizer(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    spec = tinyagent_spec(tok)
    assert spec.max_action_tokens >= 3
    env, task = spec.make(), make_tasks("train")[0]
    env.reset(task)
    result = env.step(tok.encode("read") + [tok.eos_id])
    assert not result.done and tok.decode(result.observation) == task.source
    result = env.step(tok.encode(f"answer {task.answer}") + [tok.eos_id])
    assert result.done and result.reward == 1.0
    env.reset(task)
    assert env.step(tok.encode("read read") + [tok.eos_id]).info["invalid"]


@pytest.mark.slow  # 21 s on 2 cores: out of the default run (pytest -m slow)
def test_a_few_training_steps_through_the_bpe_tokenizer(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    policy = train_base(tok, BaseConfig(rule_steps=0, steps=40, read_prob=0.3))
    run = build_run(quick_cfg(tokenizer=bpe_dir, max_steps=3), logger=False, policy=policy, callbacks=[])
    assert run.tok.hf is tok.hf.__class__ or isinstance(run.tok, HFTokenizer)
    before = [p.detach().clone() for p in policy.parameters()]
    fit(run)
    history = run.module.history
    assert len(history) == 3 and any(h["train/skipped"] == 0 for h in history)
    assert all(h["mismatch/abs_mean"] < 1e-5 for h in history)  # on-policy through the BPE ids
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_a_chat_template_frames_prompt_and_observations(tmp_path):
    tok = load_tokenizer(save_bpe(tmp_path, chat=True))
    assert tok.chat
    prompt = tok.decode(tok.prompt("issue : x"), skip_special=False)
    assert prompt.startswith("<|user|>") and prompt.endswith("<|end|><|assistant|>")
    observation = tok.decode(tok.observation("1 + a b ;"), skip_special=False)
    assert observation.startswith("<|user|>") and "1 + a b ;" in observation


def test_the_word_tokenizer_is_one_tokenizer_among_them(tmp_path):
    word = WordTokenizer(["read", "answer"])
    word.save(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), WordTokenizer)
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_tokenizer(tmp_path / "missing")
