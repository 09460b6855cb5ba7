"""An engine-style behavior sampler: the decode path of an inference engine, for any transformers causal LM.

What makes it "engine-style" rather than trainer-style (see ``lrl.rollout.trainer_style_decoder``):

- sequences are **left-padded** into one batch, and position ids count only real tokens, so padding
  never shifts a sequence's positions;
- a **KV cache** (``transformers.DynamicCache``) holds keys and values: the prompt is prefilled once, then
  each generated token is one **decode step**, a forward of length 1 per sequence;
- the batch shrinks as sequences finish (rows leave the cache), as in an engine's continuous batching;
- the weights are a **copy in the engine's own dtype** (float32, bfloat16 or float16), refreshed at every
  weight sync, optionally rounded to FP8 and optionally ``lag`` versions old (the other two sampler axes);
- each token is drawn from that step's logits normalised in fp32 at the sampling temperature, optionally
  truncated by top-k / top-p; the recorded log-prob is that of the truncated, renormalised distribution
  the token was actually drawn from (mu).

In the gym, :func:`engine_rollout` plays the multi-turn episodes. Between turns a finished row's cache
is kept (compacted, padding removed) and the next turn only prefills the tokens the cache has not seen:
the last action token and the observation. ``reuse_cache=False`` re-prefills the whole episode instead.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lrl.gym import BugFixEnv, Task, WordTokenizer
from lrl.rollout import MAX_ACTION_TOKENS, Episode
from samplers.base import BehaviorSampler, Transform

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# -- checks with clear messages ----------------------------------------------------------------------
def engine_dtype(name: str | torch.dtype) -> torch.dtype:
    """An engine dtype by name ('float32', 'bfloat16', 'float16') -> torch.dtype; anything else is an error."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name not in DTYPES:
        raise ValueError(f"engine dtype {name!r} is not supported; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


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


def context_length(model) -> int | None:
    """The model's context (max_position_embeddings, or n_positions), or None when it declares none."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_context(model, length: int, what: str = "prompt") -> None:
    """Raise ValueError when a sequence of `length` positions does not fit the model's context."""
    limit = context_length(model)
    if limit is not None and length > limit:
        raise ValueError(f"{what} needs {length} positions but the model's context is {limit} "
                         f"(max_position_embeddings); shorten the prompts or generate fewer tokens")  # fmt: skip


def check_device(device: str | torch.device, dtype: torch.dtype) -> torch.device:
    """Raise ValueError for a device that is absent or cannot compute in `dtype` at all -> torch.device."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device} was asked for but CUDA is not available; use --device cpu")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"engine dtype bfloat16 is not supported by {torch.cuda.get_device_name(device)}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device} is not supported by the engine; use cpu or cuda")
    return device


def check_device_dtype(model, device: str | torch.device, dtype: torch.dtype) -> None:
    """Raise ValueError when `device` cannot run `model` in `dtype` (checked with a one-token forward)."""
    device = check_device(device, dtype)
    try:
        with torch.no_grad():
            probe = torch.zeros((1, 1), dtype=torch.long, device=device)
            logits = model(input_ids=probe, attention_mask=torch.ones_like(probe)).logits
    except (RuntimeError, NotImplementedError, TypeError) as err:
        raise ValueError(f"the model cannot run in {dtype} on {device}: {err}") from None
    if not torch.isfinite(logits.float()).all():
        raise ValueError(f"the model gives non-finite logits in {dtype} on {device}")


# -- sampling from one decode step --------------------------------------------------------------------
def truncated_log_probs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0,
                        top_k: int = 0) -> torch.Tensor:  # fmt: skip
    """log-probs of the distribution sampled from, in fp32: logits [B, V] -> [B, V], -inf off the kept set.

    Temperature first, then top-k (the k largest), then top-p (the smallest set, in order of probability,
    whose mass reaches top_p; the most likely token is always kept), then renormalisation.
    """
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1]; got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 is off); got {top_k}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, V]
    if top_k and top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # [B, V]
        mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()  # mass of the more likely tokens
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    if top_k or top_p < 1:
        logp = torch.log_softmax(logp, dim=-1)  # renormalise over the kept tokens
    return logp


def sample_tokens(logp: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from exp(logp) -> (tokens [B], their log-probs [B]); sampled on the generator's device."""
    logp = logp.to(generator.device)
    token = torch.multinomial(logp.exp(), 1, generator=generator)  # [B, 1]
    return token.squeeze(1), logp.gather(1, token).squeeze(1)


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
        from transformers import DynamicCache

        self.model, self.pad_id = model, pad_id
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
                keys, values = [], []
                for row in rows:
                    k, v = row.layers[layer] if row is not None else (None, None)
                    keys.append(_left_pad(k, width))
                    values.append(_left_pad(v, width))
                ref = next(k for k in keys if k is not None)
                data.append((torch.stack([k if k is not None else torch.zeros_like(ref) for k in keys]),
                             torch.stack([v if v is not None else torch.zeros_like(ref) for v in values])))  # fmt: skip
            for i, row in enumerate(rows):
                if row is not None and row.length:
                    self.mask[i, width - row.length :] = 1
        self.cache = DynamicCache(data, config=model.config) if data else DynamicCache(config=model.config)
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
            ids, new_mask = ids.to(self.device), new_mask.to(self.device)
        position = self.lengths[:, None] + new_mask.cumsum(-1) - 1  # [b, width], positions skip the padding
        position = position.clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], dim=-1)  # [b, L + width]
        kwargs = {self.cache_arg: self.cache, "use_cache": True}
        if self.keep_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=position, **kwargs)
        self.forwards += 1
        return out.logits[:, -1]  # [b, V]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in that order): the finished sequences leave the batch and the cache."""
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


# -- fixed-length generation (the mismatch tool and the benchmark) -------------------------------------
@torch.no_grad()
def engine_generate(model, prompts: Sequence[Sequence[int]], new_tokens: int, generator: torch.Generator,
                    pad_id: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                    batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Sample `new_tokens` per prompt engine-style (no stop at eos) -> ids [B, n], log-probs mu [B, n]."""
    cache_argument(model)
    check_context(model, max(len(p) for p in prompts) + new_tokens, "prompt + new tokens")
    batch_size = batch_size or len(prompts)
    ids, logps = [], []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        batch = KVBatch(model, pad_id, n=len(chunk))
        logits = batch.feed(chunk)  # prefill
        step_ids, step_logp = [], []
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
def engine_score(model, prompts: Sequence[Sequence[int]], new_ids: torch.Tensor, pad_id: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 batch_size: int | None = None) -> torch.Tensor:  # fmt: skip
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


# -- multi-turn episodes in the gym -------------------------------------------------------------------
@torch.no_grad()
def engine_rollout(
    model,
    tasks: Sequence[Task],
    tok: WordTokenizer,
    generator: torch.Generator,
    version: int = 0,
    max_turns: int = 3,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    reuse_cache: bool = True,
    env_factory: Callable[[], BugFixEnv] | None = None,
) -> list[Episode]:
    """One episode per task, decoded engine-style; the same Episode tags as lrl.rollout.run_episodes."""
    envs = [env_factory() if env_factory else BugFixEnv(tok, max_turns) for _ in tasks]
    episodes = [Episode(task, env.reset(task)) for task, env in zip(tasks, envs)]
    kept: dict[int, RowCache] = {}  # episode -> its cache from the previous turn
    active = list(range(len(episodes)))
    while active:
        check_context(model, max(len(episodes[i].ids) for i in active) + MAX_ACTION_TOKENS, "an episode")
        rows = [kept.pop(i, None) if reuse_cache else None for i in active]
        batch = KVBatch(model, tok.pad_id, rows)
        seen = [r.length if r is not None else 0 for r in rows]
        logits = batch.feed([episodes[i].ids[n:] for i, n in zip(active, seen)])  # prefill what is new
        actions: dict[int, list[int]] = {i: [] for i in active}
        generating = list(active)
        for step in range(MAX_ACTION_TOKENS):
            token, chosen = sample_tokens(truncated_log_probs(logits, temperature, top_p, top_k), generator)
            token, chosen = token.tolist(), chosen.tolist()
            for i, t, lp in zip(generating, token, chosen):
                episodes[i].extend([t], True, [lp], version)
                actions[i].append(t)
            last = step + 1 == MAX_ACTION_TOKENS
            going = [j for j, t in enumerate(token) if t != tok.eos_id and not last]
            if reuse_cache:
                for j in set(range(len(generating))) - set(going):
                    kept[generating[j]] = batch.export(j)
            if not going:
                break
            batch.keep(going)
            generating = [generating[j] for j in going]
            logits = batch.feed(torch.tensor([[token[j]] for j in going]))  # one decode step
        for i in active:
            episodes[i].record(envs[i].step(actions[i]))
        active = [i for i in active if not episodes[i].done]
        kept = {i: kept[i] for i in active if i in kept}
    return episodes


# -- the sampler ------------------------------------------------------------------------------------
class EngineSampler(BehaviorSampler):
    """Behavior sampler on the engine decode path: its own dtype, KV cache, decode steps, top-k/top-p.

    Composes with the other two axes: ``lag`` picks the weights (the oldest of the last lag + 1 versions)
    and ``transform`` (e.g. FP8 rounding) is applied to the engine's copy after it is cast to `dtype`.
    """

    name = "engine"

    def __init__(self, tok: WordTokenizer, lag: int = 0, transform: Transform | None = None,
                 temperature: float = 1.0, max_turns: int = 3, dtype: str | torch.dtype = "float32",
                 top_p: float = 1.0, top_k: int = 0, device: str = "cpu", reuse_cache: bool = True):  # fmt: skip
        super().__init__(tok, lag, transform, temperature, max_turns)
        truncated_log_probs(torch.zeros(1, 2), 1.0, top_p, top_k)  # validates top_p / top_k
        self.dtype = engine_dtype(dtype)
        self.device = check_device(device, self.dtype)
        self.top_p, self.top_k, self.reuse_cache = top_p, top_k, reuse_cache

    def setup(self, policy: torch.nn.Module, version: int = 0) -> None:
        """Attach to the trainer's policy: a copy of it in the engine's dtype and on its device."""
        cache_argument(policy)
        self.policy = policy
        self.behavior = copy.deepcopy(policy).to(device=self.device, dtype=self.dtype).eval()
        check_device_dtype(self.behavior, self.device, self.dtype)
        self.versions.clear()
        self.sync(policy, version)

    def sample(self, tasks: Sequence[Task], generator: torch.Generator) -> list[Episode]:
        """One episode per task, decoded engine-style with the behavior copy."""
        return engine_rollout(self.behavior, tasks, self.tok, generator, self.behavior_version, self.max_turns,
                              self.temperature, self.top_p, self.top_k, self.reuse_cache, self.env_factory)  # fmt: skip

    def decoder(self):
        raise NotImplementedError(
            "the engine sampler decodes with a KV cache; use sample() or engine_generate()"
        )
