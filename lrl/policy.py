"""The TinyAgent policy: a transformers causal LM built from a config, or loaded from a local directory."""

from __future__ import annotations

from pathlib import Path

import torch

from lrl.gym.tokenizer import TOKENIZER_FILE, WordTokenizer

DEFAULT_SIZE = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256)  # fmt: skip


class ModelLoadError(ValueError):
    """A --model path that does not exist or does not hold a causal LM."""


def make_policy(tok: WordTokenizer, seed: int = 0, **size) -> torch.nn.Module:
    """A freshly initialised tiny Qwen3ForCausalLM (~150k parameters) over the gym's vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tok), tie_word_embeddings=True, pad_token_id=tok.pad_id,
                         bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, **{**DEFAULT_SIZE, **size})  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.float().eval()


def load_policy(path: str | Path, tok: WordTokenizer | None = None, dtype=torch.float32):
    """Load a local `save_pretrained` directory -> (model, tokenizer). Clear errors for bad paths."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"--model {path}: no such directory")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"--model {path}: not a transformers model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as err:  # transformers raises several types for a broken config
        raise ModelLoadError(f"--model {path}: config.json cannot be read ({err})") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"--model {path}: model type {config.model_type!r} is not a causal LM "
            f"(AutoModelForCausalLM supports e.g. qwen3, llama, gpt2)"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"--model {path}: the weights cannot be loaded ({err})") from None
    if tok is None and (path / TOKENIZER_FILE).exists():
        tok = WordTokenizer.load(path)
    if tok is not None and model.config.vocab_size < len(tok):
        raise ModelLoadError(
            f"--model {path}: vocabulary of {model.config.vocab_size} is smaller than the gym's {len(tok)}"
        )
    return model.eval(), tok


def save_policy(model, tok: WordTokenizer, path: str | Path) -> Path:
    """save_pretrained plus the gym tokenizer, so that load_policy restores both."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save(path)
    return path


def selected_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) at `targets`, computed in fp32: [B, T, V], [B, T] -> [B, T]."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_log_probs(model, ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0):
    """Trainer-style log-prob of every next token, one full forward: ids [B, T] -> [B, T-1]."""
    logits = model(input_ids=ids, attention_mask=attention_mask).logits  # [B, T, V]
    return selected_log_probs(logits[:, :-1], ids[:, 1:], temperature)
