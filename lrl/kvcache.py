"""The engine's KV-cache decode path: a left-padded batch sharing one cache, and the decoder built on it.

What makes it "engine-style" rather than trainer-style (``lrl.decoding.TrainerStyleDecoder``):

- sequences are **left-padded** into one batch, and position ids count only real tokens, so padding
  never shifts a sequence's positions;
- a **KV cache** (``transformers.DynamicCache``) holds keys and values: the prompt is prefilled once, then
  each generated token is one **decode step**, a forward of length 1 per sequence;
- the batch shrinks as sequences finish (rows leave the cache), as in an engine's continuous batching;
- between turns a finished row's cache is kept (compacted, padding removed), so the next turn prefills
  only the tokens the cache has not seen: the last action token and the observation.

:class:`KVCacheDecoder` implements the :class:`lrl.decoding.Decoder` protocol on it, for the episode loop;
:func:`engine_generate` and :func:`engine_score` decode fixed-length continuations (the mismatch tool).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lrl.decoding import context_length, sample_tokens, truncated_log_probs
from lrl.logprobs import distinct_sequences


# -- checks ----------------------------------------------------------------------------------------
def cache_argument(model) -> str:
    """Name of the forward argument that takes the KV cache; raises ValueError for a non-causal-LM model."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if not isinstance(model, torch.nn.Module) or config is None:
        raise ValueError(f"{name} is not a transformers model; the engine needs a causal LM")
    if getattr(config, "is_encoder_decoder", False) or model.get_output_embeddings() is None:
        raise ValueError(
            f"{name} is not a causal LM (no LM head, or an encoder-decoder); the engine needs one"
        )
    params = inspect.signature(model.forward).parameters
    for arg in ("cache", "past_key_values"):
        if arg in params:
            return arg
    raise ValueError(f"{name}.forward takes no KV cache (neither `cache` nor `past_key_values`)")


def check_context(model, length: int, what: str = "prompt") -> None:
    """Raise ValueError when a sequence of `length` positions does not fit the model's context."""
    limit = context_length(model)
    if limit is not None and length > limit:
        raise ValueError(
            f"{what} needs {length} positions but the model's context is {limit} "
            f"(max_position_embeddings); shorten the prompts or generate fewer tokens"
        )


# -- the KV-cache batch -------------------------------------------------------------------------------
@dataclass
class RowCache:
    """One sequence's cached keys and values, padding removed: per layer (k, v) of [heads, n, head_dim]."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    length: int


class KVBatch:
    """A left-padded batch of sequences sharing one DynamicCache; `feed` appends tokens, `keep` drops rows.

    ``mask [b, L]`` marks real cached positions; a row's next position id is its count of real tokens, so
    padding (at the left, or between turns) never shifts positions.
    """

    def __init__(self, model, pad_id: int, rows: Sequence[RowCache | None] | None = None, n: int = 0):
        self.model = model
        self.pad_id = pad_id
        self.cache_arg = cache_argument(model)
        self.keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.device = next(model.parameters()).device
        rows = list(rows) if rows is not None else [None] * n
        width = max([r.length for r in rows if r is not None], default=0)
        self.mask = torch.zeros((len(rows), width), dtype=torch.long, device=self.device)
        data = None
        if width:
            n_layers = len(next(r for r in rows if r is not None).layers)
            data = []
            for layer in range(n_layers):
                keys = []
                values = []
                for row in rows:
                    k, v = row.layers[layer] if row is not None else (None, None)
                    keys.append(_left_pad(k, width))
                    values.append(_left_pad(v, width))
                ref = next(k for k in keys if k is not None)
                data.append(
                    (
                        torch.stack([k if k is not None else torch.zeros_like(ref) for k in keys]),
                        torch.stack([v if v is not None else torch.zeros_like(ref) for v in values]),
                    )
                )
            for i, row in enumerate(rows):
                if row is not None and row.length:
                    self.mask[i, width - row.length :] = 1
        from lrl.decode_step import growing_cache  # transformers, imported when a model is decoded

        self.cache = growing_cache(model.config, data)
        self.forwards = 0  # forward passes run on this batch

    def __len__(self) -> int:
        return self.mask.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """Real (non-pad) positions cached per row: [b]."""
        return self.mask.sum(-1)

    @torch.no_grad()
    def feed(self, chunks: Sequence[Sequence[int]] | torch.Tensor) -> torch.Tensor:
        """Append one chunk of token ids per row (left-padded among themselves) -> last-position logits [b, V].

        A decode step passes a tensor [b, 1] (or any [b, w] without padding) and skips the padding work.
        """
        if len(chunks) != len(self):
            raise ValueError(f"feed got {len(chunks)} chunks for a batch of {len(self)} rows")
        if isinstance(chunks, torch.Tensor):
            ids = chunks.to(self.device, torch.long)  # [b, w], no padding
            new_mask = torch.ones_like(ids)
        else:
            if min(len(c) for c in chunks) == 0:
                raise ValueError("feed needs at least one new token per row")
            width = max(len(c) for c in chunks)
            ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
            new_mask = torch.zeros((len(chunks), width), dtype=torch.long)
            for row, chunk in enumerate(chunks):
                ids[row, width - len(chunk) :] = torch.as_tensor(chunk)
                new_mask[row, width - len(chunk) :] = 1
            ids = ids.to(self.device)
            new_mask = new_mask.to(self.device)
        position = self.lengths[:, None] + new_mask.cumsum(-1) - 1  # [b, width], positions skip the padding
        position = position.clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], dim=-1)  # [b, L + width]
        kwargs = {self.cache_arg: self.cache, "use_cache": True}
        if self.keep_last:
            kwargs["logits_to_keep"] = 1
        from lrl.decode_step import decode_attention, few_rows_linears

        one = ids.shape[1] == 1  # a decode step: its attention is one query a row (lrl.decode_step)
        with decode_attention(self.model) if one else contextlib.nullcontext(), few_rows_linears(self.model):
            out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=position, **kwargs)
        self.forwards += 1
        return out.logits[:, -1]  # [b, V]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in that order): the finished sequences leave the batch and the cache (a row named
        more than once is copied)."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]

    def export(self, row: int) -> RowCache:
        """One row's cache with its padding removed, to be carried into a later batch."""
        real = self.mask[row].bool()
        layers = [
            (layer.keys[row][:, real].clone(), layer.values[row][:, real].clone())
            for layer in self.cache.layers
        ]
        return RowCache(layers, int(real.sum()))


def _left_pad(x: torch.Tensor | None, width: int) -> torch.Tensor | None:
    """[heads, n, d] -> [heads, width, d] with zeros on the left (None stays None)."""
    if x is None or x.shape[1] == width:
        return x
    return torch.nn.functional.pad(x, (0, 0, width - x.shape[1], 0))


class KVCacheDecoder:
    """The Decoder protocol on a KVBatch: each call feeds every row only what its cache has not seen.

    While the rows of consecutive calls are the same episodes, each bringing one token, a call is one decode
    step on the batch as it is (rows that left are exported first). Any other call (an episode joins, one
    comes back from its tool with an observation) builds a new batch from the rows' kept caches, left-padded
    to one width, and prefills the unseen tokens of every row in one forward. A batch of rows that all start from
    nothing prefills each distinct sequence once and copies its cache to the rows that share it (the samples of
    one task share their prompt).
    """

    def __init__(self, model, pad_id: int, reuse_cache: bool = True):
        cache_argument(model)
        self.model = model
        self.pad_id = pad_id
        self.reuse_cache = reuse_cache
        self.context = context_length(model)
        self.seqs: dict[int, list[int]] = {}  # episode key -> every token fed for it
        self.kept: dict[int, RowCache] = {}  # episode key -> its cache when it last left the batch
        self.keys: list[int] = []  # the rows of the current batch
        self.batch: KVBatch | None = None

    def decode(self, rows: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor:
        keys = [key for key, _ in rows]
        for key, tokens in rows:
            self.seqs.setdefault(key, []).extend(tokens)
        if self.batch is not None and self._one_token_each(rows) and self._in_batch_order(keys):
            self._leave([j for j, k in enumerate(self.keys) if k not in set(keys)], keys)
            tokens = torch.tensor([[tokens[0]] for _, tokens in rows])  # [b, 1]
            return self.batch.feed(tokens)  # one decode step
        self._leave(list(range(len(self.keys))), [])
        cached = [self.kept.pop(key, None) if self.reuse_cache else None for key in keys]
        self.keys = keys
        if all(r is None for r in cached):
            return self._prefill_shared([self.seqs[key] for key in keys])
        self.batch = KVBatch(self.model, self.pad_id, cached)
        seen = [r.length if r is not None else 0 for r in cached]
        return self.batch.feed([self.seqs[key][n:] for key, n in zip(keys, seen)])  # prefill what is new

    def _prefill_shared(self, seqs: list[list[int]]) -> torch.Tensor:
        """A new batch of rows that start from nothing: each distinct sequence is prefilled once (the samples of one
        task share their prompt), then its cache and logits are copied to every row that holds it -> [b, V]."""
        distinct, index = distinct_sequences(seqs)
        self.batch = KVBatch(self.model, self.pad_id, n=len(distinct))
        logits = self.batch.feed([list(seq) for seq in distinct])
        if len(distinct) == len(seqs):
            return logits
        self.batch.keep(index)  # every row a copy of its sequence's cache
        return logits[torch.as_tensor(index, device=logits.device)]

    def release(self, keys: Sequence[int]) -> None:
        for key in keys:
            self.seqs.pop(key, None)
            self.kept.pop(key, None)
        if self.batch is not None and any(k in self.keys for k in keys):
            gone = set(keys)
            self.batch.keep([j for j, k in enumerate(self.keys) if k not in gone])
            self.keys = [k for k in self.keys if k not in gone]

    def reset(self) -> None:
        """Forget every cache (the weights changed): the next call starts from the sequences themselves."""
        self.seqs = {}
        self.kept = {}
        self.batch = None
        self.keys = []

    def _one_token_each(self, rows) -> bool:
        return all(len(tokens) == 1 for _, tokens in rows)

    def _in_batch_order(self, keys: list[int]) -> bool:
        """`keys` are rows of the current batch, in its order (some may have left)."""
        position = {k: j for j, k in enumerate(self.keys)}
        if not keys or any(k not in position for k in keys):
            return False
        order = [position[k] for k in keys]
        return order == sorted(order)

    def _leave(self, rows: list[int], stay: list[int]) -> None:
        """Rows `rows` of the current batch leave it (their caches are kept); the batch keeps `stay` (keys)."""
        if self.batch is None or not rows:
            return
        if self.reuse_cache:
            for j in rows:
                self.kept[self.keys[j]] = self.batch.export(j)
        if stay:
            position = {k: j for j, k in enumerate(self.keys)}
            self.batch.keep([position[k] for k in stay])
        else:
            self.batch = None
        self.keys = list(stay)


# -- fixed-length generation (the mismatch tool and the benchmark) -------------------------------------
@torch.no_grad()
def engine_generate(
    model,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    generator: torch.Generator,
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `new_tokens` per prompt engine-style (no stop at eos) -> ids [B, n], log-probs mu [B, n]."""
    cache_argument(model)
    check_context(model, max(len(p) for p in prompts) + new_tokens, "prompt + new tokens")
    batch_size = batch_size or len(prompts)
    ids = []
    logps = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        batch = KVBatch(model, pad_id, n=len(chunk))
        logits = batch.feed(chunk)  # prefill
        step_ids = []
        step_logp = []
        for step in range(new_tokens):
            token, lp = sample_tokens(truncated_log_probs(logits, temperature, top_p, top_k), generator)
            step_ids.append(token)
            step_logp.append(lp)
            if step + 1 < new_tokens:
                logits = batch.feed(token[:, None])  # one decode step
        ids.append(torch.stack(step_ids, 1).cpu())
        logps.append(torch.stack(step_logp, 1).cpu())
    return torch.cat(ids), torch.cat(logps)


@torch.no_grad()
def engine_score(
    model,
    prompts: Sequence[Sequence[int]],
    new_ids: torch.Tensor,
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int | None = None,
) -> torch.Tensor:
    """Engine-style log-probs of given continuations (teacher-forced decode steps): new_ids [B, n] -> [B, n]."""
    cache_argument(model)
    check_context(model, max(len(p) for p in prompts) + new_ids.shape[1], "prompt + new tokens")
    batch_size = batch_size or len(prompts)
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        forced = new_ids[start : start + batch_size]  # [b, n]
        batch = KVBatch(model, pad_id, n=len(chunk))
        logits = batch.feed(chunk)
        rows = []
        for step in range(forced.shape[1]):
            logp = truncated_log_probs(logits, temperature, top_p, top_k)  # [b, V]
            rows.append(logp.gather(1, forced[:, step : step + 1].to(logp.device)).squeeze(1).cpu())
            if step + 1 < forced.shape[1]:
                logits = batch.feed(forced[:, step : step + 1])
        out.append(torch.stack(rows, 1))
    return torch.cat(out)
