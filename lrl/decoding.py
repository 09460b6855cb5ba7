"""How tokens are decoded: the Decoder protocol, the trainer-style decoder, and the sampling distribution.

A decoder turns token sequences into next-token logits for the episodes in flight, one batched forward per
call. Episodes are named by a key; the decoder remembers what it has seen of each:

- ``decode(rows)``: ``rows`` is a list of ``(key, new_tokens)``; append each row's new tokens to what the decoder
  holds for that key (a new key starts empty) and return the logits of every row's next token, ``[b, V]``, in
  the order of ``rows``. One call may mix a new episode's prompt, an observation after a tool call and single
  decode tokens: that is continuous batching;
- ``release(keys)``: these episodes left (finished); forget them;
- ``reset()``: forget everything (the weights changed); every later row must bring its whole sequence.

The trainer-style decoder is the simplest implementation: every call is one full forward over the
right-padded sequences of its rows, exactly the computation the trainer repeats when it scores the batch. The
engine-style decoder (``lrl.kvcache``) keeps a KV cache and decodes one position per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from lrl.batch import pad_right


class Decoder(Protocol):
    def decode(self, rows: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor: ...

    def release(self, keys: Sequence[int]) -> None: ...

    def reset(self) -> None: ...


@dataclass
class Produced:
    """What an engine produced for one episode in one step: new tokens, their log-probs, whether the action ended."""

    tokens: list[int]
    logps: list[float]
    finished: bool


@runtime_checkable
class TurnEngine(Protocol):
    """An inference engine that samples whole actions itself (vLLM), the other kind of decode path.

    - ``submit(key, ids, max_tokens, seed)``: start generating an action after the episode's tokens ``ids``, at
      most ``max_tokens`` long, ending at the tokenizer's eos (which the action includes);
    - ``step()``: one engine step for every action in flight -> ``{key: Produced}`` for those that advanced;
      the log-probs are those of the distribution each token was sampled from;
    - ``abort(keys)``: stop those actions (their partial tokens are kept by the caller);
    - ``release(keys)``: those episodes ended (a no-op unless an action is somehow still in flight);
    - ``running``: the keys with an action in flight.
    """

    running: set

    def submit(self, key: int, ids: Sequence[int], max_tokens: int, seed: int) -> None: ...

    def step(self) -> dict[int, Produced]: ...

    def abort(self, keys: Sequence[int]) -> None: ...

    def release(self, keys: Sequence[int]) -> None: ...


@dataclass(frozen=True)
class Sampling:
    """The distribution tokens are drawn from: temperature, then top-k, then top-p (nucleus)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 is off); got {self.top_k}")

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """See :func:`truncated_log_probs`: logits [B, V] -> log-probs [B, V] in fp32, -inf off the kept set."""
        return truncated_log_probs(logits, self.temperature, self.top_p, self.top_k)


def truncated_log_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0):
    """log-probs of the distribution sampled from, in fp32: logits [B, V] -> [B, V], -inf off the kept set.

    Temperature 0 is greedy decoding: all the mass on the most likely token (log-prob 0 there, -inf elsewhere).

    Temperature first, then top-k (the k largest), renormalised, then top-p on that renormalised
    distribution (the smallest set, in order of probability, whose mass reaches top_p; the most likely token
    is always kept), then renormalisation: the order and the renormalisation of transformers' warpers.
    """
    if temperature == 0:
        best = logits.float().argmax(dim=-1, keepdim=True)  # [B, 1]
        return torch.full_like(logits, float("-inf"), dtype=torch.float32).scatter(-1, best, 0.0)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, V]
    if top_k and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logp = torch.log_softmax(logp.masked_fill(logp < kth, float("-inf")), dim=-1)
    if top_p < 1:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # [B, V]
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # mass of the more likely tokens
        drop = torch.zeros_like(mass_before, dtype=torch.bool).scatter(-1, order, mass_before >= top_p)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


# the largest vocabulary whose tokens a CPU draws with torch.multinomial; above it, by the inverse CDF of one uniform
# a row (multinomial's cost grows with the vocabulary: at SmolLM2's 49,152 words and 32 rows it took several times
# the inverse CDF's, bench/bench_sampling.py). The built-in policies' hundred-word vocabularies keep multinomial, so
# their published seeded runs draw the same tokens as they always have
MULTINOMIAL_VOCAB = 4096


def sample_tokens(logp: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from exp(logp) -> (tokens [B], their log-probs [B]), on the generator's device.

    Where log-probs and generator share a device (the CPU) and the vocabulary is small, ``torch.multinomial``
    draws. Otherwise one uniform per row comes from the generator and the token is found where the log-probs are,
    by :func:`inverse_cdf_tokens`: on an accelerator, moving the [B, V] log-probs to the CPU generator at every
    decode step would cost more than the model's forward (a 151,936-token vocabulary: 18 MB a step, and a
    one-thread multinomial over it); on the CPU, at a real vocabulary, the inverse CDF is the faster exact draw.
    The stream stays the generator's: a seed repeats a run on the same device.
    """
    if logp.device == generator.device and logp.shape[-1] <= MULTINOMIAL_VOCAB:
        token = torch.multinomial(logp.exp(), 1, generator=generator)  # [B, 1]
        return token.squeeze(1), logp.gather(1, token).squeeze(1)
    uniform = torch.rand(logp.shape[0], 1, generator=generator, dtype=torch.float64, device=generator.device)
    token = inverse_cdf_tokens(logp, uniform.to(logp.device))  # [B, 1], on the log-probs' device
    chosen = logp.gather(1, token)
    return token.squeeze(1).to(generator.device), chosen.squeeze(1).to(generator.device)


def inverse_cdf_tokens(logp: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token of each row whose cumulative mass first exceeds the row's uniform in [0, 1) -> [B, 1].

    The probabilities are exp(logp) in fp32 (as ``torch.multinomial`` takes them) and their cumulative sum runs in
    float64, so no token's share of the mass is lost to rounding however far down the sum it stands, and a token of
    zero probability (-inf, off a top-k or top-p set) is never chosen: its cumulative mass equals its
    predecessor's and cannot be the first to exceed the threshold.
    """
    cdf = logp.float().exp().double().cumsum(-1)  # [B, V]
    total = cdf[:, -1:].contiguous()  # [B, 1]
    token = torch.searchsorted(cdf, uniform.reshape(-1, 1).to(cdf) * total, right=True)
    # a uniform within 2**-53 of 1 can round the threshold up to the total: the last token of positive mass then
    last = torch.searchsorted(cdf, total)
    return torch.minimum(token, last)


class TrainerStyleDecoder:
    """Re-runs the full right-padded sequences of a call's rows at every call: the trainer's own computation."""

    def __init__(self, model: torch.nn.Module, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.seqs: dict[int, list[int]] = {}
        self.context = context_length(model)

    def decode(self, rows: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor:
        for key, tokens in rows:
            self.seqs.setdefault(key, []).extend(tokens)
        return self._forward([self.seqs[key] for key, _ in rows])

    def release(self, keys: Sequence[int]) -> None:
        for key in keys:
            self.seqs.pop(key, None)

    def reset(self) -> None:
        self.seqs = {}

    @torch.no_grad()
    def _forward(self, seqs: list[list[int]]) -> torch.Tensor:
        ids, mask = pad_right(seqs, self.pad_id)
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [B, T, V]
        last = (mask.sum(-1) - 1).to(device)  # [B]
        return logits[torch.arange(len(seqs), device=device), last]  # [B, V]


def context_length(model) -> int | None:
    """The model's context (max_position_embeddings, or n_positions), or None when it declares none."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
