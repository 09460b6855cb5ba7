import json

import pytest
import torch
from conftest import rollout

from lrl.batch import collate
from lrl.envs.tinyagent import make_tasks
from lrl.logprobs import token_log_probs
from lrl.policy import ModelLoadError, load_policy, save_policy


def test_policy_size_is_tiny(tiny_policy):
    n = sum(p.numel() for p in tiny_policy.parameters())
    assert 100_000 <= n <= 200_000


def test_saved_policy_reloads_with_from_pretrained_and_same_log_probs(tmp_path, tok, tiny_policy, spec):
    from transformers import AutoModelForCausalLM

    save_policy(tiny_policy, tok, tmp_path)
    episodes = rollout(tiny_policy, make_tasks("train")[:4], spec)
    batch = collate(episodes, tok.pad_id)
    with torch.no_grad():
        before = token_log_probs(tiny_policy, batch["ids"], batch["attention_mask"])
        plain = AutoModelForCausalLM.from_pretrained(tmp_path)
        after = token_log_probs(plain, batch["ids"], batch["attention_mask"])
        loaded, loaded_tok = load_policy(tmp_path)
        again = token_log_probs(loaded, batch["ids"], batch["attention_mask"])
    assert torch.equal(before, after) and torch.equal(before, again)
    assert loaded_tok.vocab == tok.vocab


def test_load_policy_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        load_policy(tmp_path / "missing")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ModelLoadError, match="not a causal LM"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ModelLoadError, match="weights cannot be loaded"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot be read"):
        load_policy(tmp_path)
