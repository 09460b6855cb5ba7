"""A word-level tokenizer for the TinyAgent gym: one id per whitespace-separated word."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from lrl.gym.tasks import Task, vocabulary_words

SPECIALS = ("<pad>", "<bos>", "<eos>")
TOKENIZER_FILE = "lrl_tokenizer.json"


class WordTokenizer:
    """Maps words to ids and back; `pad_id`, `bos_id`, `eos_id` are the special tokens."""

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
            raise ValueError(f"word {err.args[0]!r} is not in the TinyAgent vocabulary") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text, padding dropped."""
        return " ".join(self.vocab[i] for i in ids if i != self.pad_id)

    def id(self, word: str) -> int:
        return self.index[word]

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


def build_tokenizer(tasks: Iterable[Task] = ()) -> WordTokenizer:
    """The gym's tokenizer: its fixed vocabulary plus every word of `tasks`."""
    words = set(vocabulary_words())
    for task in tasks:
        words.update(task.prompt.split())
        words.update(task.source.split())
    return WordTokenizer(words)
