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


class ChatTemplateError(ValueError):
    """A chat template that cannot render the conversation an episode is (one line: what it refused)."""


# placeholder contents of the conversation from which the template's own framing of a turn is read
_USER, _ACTION = "lrl-task", "lrl-action"


class HFTokenizer:
    """A transformers fast tokenizer (``save_pretrained`` directory) behind the word tokenizer's interface.

    With a chat template, an episode is a conversation, and its tokens are the template's own rendering of it
    (token in, token out):

    - ``prompt(text)``: the system message (``system``: the task's instructions; None: the template's
      default) and the task as the user's message, then the generation prompt;
    - an action is what the model sampled, ending with the template's end of an assistant turn (``eos_id``:
      the tokenizer's eos, or the special token the template closes assistant turns with where that differs);
    - ``observation(text)``: what the template renders after that end-of-turn token for a message of role
      ``observation_role`` holding `text`, the generation prompt included. It is read off the template (the
      rendering of a conversation with the new message, less the rendering without it), never from a
      conversation started afresh, so no system prompt or begin-of-text marker is repeated.

    Differences from ``apply_chat_template`` of the whole conversation, by design: the sampled tokens of an
    action are kept as sampled (a template that would tokenise the same text differently, or re-render an
    earlier assistant turn, does not rewrite them), and nothing follows the last action's end-of-turn token.
    """

    def __init__(self, hf, system: str | None = None, observation_role: str = "user"):
        if hf.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; an action needs one to end")
        self.hf = hf
        self.eos_id = hf.eos_token_id
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else hf.eos_token_id
        self.bos_id = hf.bos_token_id
        self.chat = bool(getattr(hf, "chat_template", None))
        self.system = system
        self.observation_role = observation_role
        if self.chat:
            self.eos_id = self._turn_end()

    def conversation(self, system: str | None, observation_role: str = "user") -> HFTokenizer:
        """The same tokenizer framing episodes with this system message and observation role."""
        return type(self)(self.hf, system, observation_role)

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    # -- the chat template ----------------------------------------------------------------------------
    def _render(self, messages: list[dict], generation: bool) -> str:
        try:
            return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        except Exception as err:  # jinja raises its own types for what a template refuses
            roles = ", ".join(m["role"] for m in messages)
            raise ChatTemplateError(
                f"its chat template cannot render a conversation of roles {roles} "
                f"({type(err).__name__}: {' '.join(str(err).split())[:200]})"
            ) from None

    def _opening(self, text: str) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": text}]

    def _after_action(self) -> tuple[str, str]:
        """(the template's text right after an assistant turn's content, the rendering up to that point)."""
        messages = [*self._opening(_USER), {"role": "assistant", "content": _ACTION}]
        rendered = self._render(messages, False)
        at = rendered.rfind(_ACTION)
        if at < 0:
            raise ChatTemplateError("its chat template does not render an assistant message's content")
        return rendered[at + len(_ACTION) :], rendered[: at + len(_ACTION)]

    def _turn_end(self) -> int:
        """The token that ends an assistant turn in the template: the eos where the template closes turns with
        it, else the special token it closes them with (ChatTemplateError when it closes them with neither)."""
        after, _ = self._after_action()
        eos = self.hf.convert_ids_to_tokens(self.hf.eos_token_id)
        if after.startswith(eos):
            return self.hf.eos_token_id
        for token in sorted(
            self.hf.all_special_tokens + list(self.hf.added_tokens_encoder), key=len, reverse=True
        ):
            if token and after.startswith(token):
                return self.hf.convert_tokens_to_ids(token)
        raise ChatTemplateError(
            f"its chat template ends an assistant turn with {after[:20]!r}, neither the eos token {eos!r} nor another "
            "special token, so a sampled action has no token to end on"
        )

    def prompt(self, text: str) -> list[int]:
        if self.chat:
            out = self.hf.apply_chat_template(self._opening(text), add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if hasattr(out, "keys") else out)  # a dict in transformers 5
        return ([self.bos_id] if self.bos_id is not None else []) + self.encode(text)

    def observation(self, text: str) -> list[int]:
        if not self.chat:
            return self.encode(text)
        after, upto = self._after_action()
        end = self.hf.convert_ids_to_tokens(self.eos_id)
        before = upto + end  # the conversation as the episode holds it, up to the action's last token
        messages = [
            *self._opening(_USER),
            {"role": "assistant", "content": _ACTION},
            {"role": self.observation_role, "content": text},
        ]
        rendered = self._render(messages, True)
        if not rendered.startswith(before):
            raise ChatTemplateError(
                "its chat template renders the earlier turns differently once a new message follows them, so "
                "an episode's tokens cannot grow turn by turn"
            )
        return self.encode(rendered[len(before) :])

    def check_conversation(self) -> None:
        """ChatTemplateError, before any episode runs, for a template that cannot render an episode: one that
        drops the system message or the observation, or adds no generation prompt after an observation."""
        if not self.chat:
            return
        if self.system and self.system not in self._render(self._opening(_USER), True):
            raise ChatTemplateError("its chat template drops the system message")
        marker = "lrl-observation"
        if marker not in self.decode(self.observation(marker), skip_special=False):
            raise ChatTemplateError(
                f"its chat template drops a message of role {self.observation_role!r} (choose another "
                "--observation-role)"
            )
        messages = [
            *self._opening(_USER),
            {"role": "assistant", "content": _ACTION},
            {"role": self.observation_role, "content": marker},
        ]
        if self._render(messages, True) == self._render(messages, False):
            raise ChatTemplateError("its chat template adds no generation prompt after an observation")

    def specials_in(self, text: str) -> list[str]:
        """The tokenizer's special tokens that `text` spells (``<|im_end|>``): encoded, each is the template's own
        marker, not text, so a message holding one renders as turns it does not mean."""
        added = [t.content for t in self.hf.added_tokens_decoder.values() if t.special]
        specials = {t for t in [*self.hf.all_special_tokens, *added] if t}
        return sorted((t for t in specials if t in text), key=text.find)

    def renders_as_its_own(self, role: str) -> bool:
        """Whether the chat template renders an observation of `role` as a role it knows: ``user`` always; any
        other role only where the template treats it otherwise than any name (a template that writes whatever
        role it is given, as SmolLM2's does, would show the model a header it was never trained on)."""
        if role == "user" or not self.chat:
            return True
        marker = "lrl-observation"

        def rendered(name: str) -> str:
            messages = [*self._opening(_USER), {"role": "assistant", "content": _ACTION}]
            return self._render([*messages, {"role": name, "content": marker}], True)

        as_user = rendered("user")
        cut = as_user.rfind(_ACTION)  # the observation's part: past the action
        as_any = as_user[:cut] + (
            as_user[cut:]
            .replace("user", role)
            .replace("User", role.capitalize())
            .replace("USER", role.upper())
        )
        return rendered(role) != as_any


def load_tokenizer(path: str | Path):
    """A tokenizer directory -> HFTokenizer (transformers fast) or WordTokenizer (lrl_tokenizer.json)."""
    path = Path(path)
    if (path / TOKENIZER_FILE).exists() and not (path / "tokenizer.json").exists():
        return WordTokenizer.load(path)
    if path.is_dir() and not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"{str(path)!r} holds no tokenizer (tokenizer.json, or {TOKENIZER_FILE})")
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(path, use_fast=True)
    except Exception as err:  # transformers raises several types for a directory it cannot read
        raise ValueError(f"{str(path)!r} cannot be loaded ({type(err).__name__}: {err})") from None
    if not getattr(hf, "is_fast", False):
        raise ValueError(f"{str(path)!r} is not a fast tokenizer")
    return HFTokenizer(hf)
