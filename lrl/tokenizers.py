"""Tokenizers behind one small interface: the environments' word tokenizer, or any transformers fast tokenizer.

What an environment and the rollout loop need of a tokenizer: ``pad_id``, ``eos_id`` (ends an action),
``len(tok)``, ``encode(text)``, ``decode(ids, skip_special)``, and the framing of the text it shows the
agent: ``prompt(text)`` (the first message) and ``observation(text)`` (what a turn returns). The word
tokenizer frames a prompt as ``<bos> words``; a transformers tokenizer with a chat template frames both as
user messages followed by the assistant's generation prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

SPECIALS = ("<pad>", "<bos>", "<eos>")
TOKENIZER_FILE = "lrl_tokenizer.json"


class WordTokenizer:
    """One id per whitespace-separated word; `pad_id`, `bos_id`, `eos_id` are the special tokens."""

    def __init__(self, words: Iterable[str]):
        vocab = list(SPECIALS) + sorted(set(words) - set(SPECIALS))
        self.vocab: list[str] = vocab
        self.index = {w: i for i, w in enumerate(vocab)}
        self.pad_id, self.bos_id, self.eos_id = (self.index[s] for s in SPECIALS)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Text -> ids; an unknown word is an error, never silently mapped."""
        try:
            return [self.index[w] for w in text.split()]
        except KeyError as err:
            raise ValueError(f"word {err.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Ids -> text; padding dropped unless ``skip_special`` is False (then every id is its word)."""
        return " ".join(self.vocab[i] for i in ids if not (skip_special and i == self.pad_id))

    def id(self, word: str) -> int:
        return self.index[word]

    def prompt(self, text: str) -> list[int]:
        return [self.bos_id, *self.encode(text)]

    def observation(self, text: str) -> list[int]:
        return self.encode(text)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TOKENIZER_FILE
        path.write_text(json.dumps({"vocab": self.vocab}))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> WordTokenizer:
        vocab = json.loads((Path(directory) / TOKENIZER_FILE).read_text())["vocab"]
        tok = cls(vocab)
        if tok.vocab != vocab:
            raise ValueError(f"{directory}: tokenizer file is not in canonical order")
        return tok


class HFTokenizer:
    """A transformers fast tokenizer (``save_pretrained`` directory) behind the word tokenizer's interface."""

    def __init__(self, hf):
        if hf.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; an action needs one to end")
        self.hf = hf
        self.eos_id = hf.eos_token_id
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else hf.eos_token_id
        self.bos_id = hf.bos_token_id
        self.chat = bool(getattr(hf, "chat_template", None))

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def _message(self, text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        out = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(
            out["input_ids"] if hasattr(out, "keys") else out
        )  # a dict in transformers 5, a list before

    def prompt(self, text: str) -> list[int]:
        if self.chat:
            return self._message(text)
        return ([self.bos_id] if self.bos_id is not None else []) + self.encode(text)

    def observation(self, text: str) -> list[int]:
        if not self.chat:
            return self.encode(text)
        ids = self._message(text)
        if self.bos_id is not None and ids[:1] == [self.bos_id]:
            ids = ids[1:]  # a bos opens the conversation only once
        return ids


def load_tokenizer(path: str | Path):
    """A tokenizer directory -> HFTokenizer (transformers fast) or WordTokenizer (lrl_tokenizer.json)."""
    path = Path(path)
    if (path / TOKENIZER_FILE).exists() and not (path / "tokenizer.json").exists():
        return WordTokenizer.load(path)
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(path, use_fast=True)
    except Exception as err:  # transformers raises several types for a directory it cannot read
        raise ValueError(f"{str(path)!r} cannot be loaded ({type(err).__name__}: {err})") from None
    if not getattr(hf, "is_fast", False):
        raise ValueError(f"{str(path)!r} is not a fast tokenizer")
    return HFTokenizer(hf)
