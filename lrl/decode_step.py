"""What one decode step of the KV-cache engine runs beside the model's own code: its attention and its cache.

A decode step is a forward of one token a row. Two pieces of transformers' default path cost it more than its
matrix products on a CPU, so the engine (:mod:`lrl.kvcache`) swaps them for the step:

- **attention of one query a row** (:func:`one_query_attention`): the CPU's fused attention kernel is built for
  long queries and spends most of its time on its own set-up at one (1.7 ms a layer at 32 rows of SmolLM2, where
  the arithmetic is microseconds). Here each group of query heads meets its shared key/value head in two batched
  products, scores and softmax in fp32, so the numbers are the fused kernel's to rounding (its inputs are the same
  bf16 or fp32 keys and values; it too accumulates in fp32). Prefill (several queries a row), dropout, sliding
  windows and soft caps go to the model's own attention unchanged.
- **a cache that grows in place** (:class:`GrowingLayer`): transformers' dynamic cache appends every step's keys
  and values by concatenation, copying the whole cache of every layer at every step; this one keeps spare room
  and writes the new position into it (the room doubles when it runs out, and a layer whose rows were selected
  starts a new buffer).

- **the product turned round at few rows** (:func:`few_rows_linears`): a linear layer computes ``x @ W^T`` from
  ``W`` stored ``[out, in]``; at the 8-48 rows of a decode step the CPU's BLAS runs that product 2-3x slower than
  the same numbers computed as ``(W @ x^T)^T`` (measured on a 2-core Ice Lake Xeon, fp32, SmolLM2's shapes: 0.71
  ms against 0.27 ms for 32 rows of its 576 x 1536 MLP, 26 against 14 ms for its LM head; at 1-4 rows and from 64
  up the layer's own product is as fast or faster, and is kept). No weight is copied.

All three are exact in what they compute: the same keys, values, weights and mask in, the same numbers out to
the rounding of a different summation order; no weight or token is treated differently.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "lrl_decode"  # the attention implementation a decode step runs under (registered on first use)


def one_query_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention for a step of one query a row: query [B, H, 1, D], key/value [B, KV, L, D] (H a multiple of KV),
    attention_mask a bool [B, 1, 1, L] (True: attend), an additive float mask, or None -> ([B, 1, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    special = any(kwargs.get(k) is not None for k in ("sliding_window", "softcap", "s_aux", "position_bias"))
    if query.shape[2] != 1 or dropout or special or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    with torch.autocast(query.device.type, enabled=False):
        q = query.float().reshape(rows, kv_heads, heads // kv_heads, dim)  # [B, KV, G, D]
        scores = torch.matmul(q, key.float().transpose(-1, -2)) * scale  # [B, KV, G, L]
        if attention_mask is not None:
            mask = attention_mask.reshape(rows, 1, 1, -1)[..., -scores.shape[-1] :]
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out = torch.matmul(scores.softmax(-1), value.float())  # [B, KV, G, D]
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).to(query.dtype), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, one_query_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the same mask as the fused kernel's


@contextlib.contextmanager
def decode_attention(model):
    """Within this context, a model that attends with ``sdpa`` attends by :func:`one_query_attention` (which
    hands every call of more than one query back to ``sdpa``); any other implementation is left as it is."""
    model_config = getattr(model, "config", None)
    if model_config is None or getattr(model_config, "_attn_implementation", None) != "sdpa":
        yield
        return
    _register()
    model_config._attn_implementation = NAME
    try:
        yield
    finally:
        model_config._attn_implementation = "sdpa"


def growing_cache(model_config, data=None):
    """A transformers DynamicCache whose full-attention layers grow in place (:class:`GrowingLayer`), optionally
    filled with per-layer (keys, values) of [B, KV, L, D]."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model_config)
    cache.layers = [GrowingLayer() if type(layer) is _dynamic_layer() else layer for layer in cache.layers]
    for layer, (keys, values) in zip(cache.layers, data or []):
        layer.update(keys, values)
    return cache


def _dynamic_layer():
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


class GrowingLayer(_dynamic_layer()):
    """A dynamic cache layer with spare room: ``keys`` / ``values`` are views of the first positions of buffers
    that new positions are written into (no copy of the cache at every step)."""

    SPARE = 64  # positions of room made at the least when a buffer is (re)made
    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._buffers = None
        n = self.keys.shape[-2] if self.keys.numel() else 0
        width = key_states.shape[-2]
        if not self._fits(key_states, n + width):
            room = max(2 * (n + width), n + width + self.SPARE)
            shape = (*key_states.shape[:2], room, key_states.shape[-1])
            keys = key_states.new_empty(shape)
            values = value_states.new_empty((*shape[:3], value_states.shape[-1]))
            if n:
                keys[:, :, :n] = self.keys
                values[:, :, :n] = self.values
            self._buffers = (keys, values)
        keys, values = self._buffers
        keys[:, :, n : n + width] = key_states
        values[:, :, n : n + width] = value_states
        self.keys, self.values = keys[:, :, : n + width], values[:, :, : n + width]
        return self.keys, self.values

    def _fits(self, key_states: torch.Tensor, length: int) -> bool:
        """The buffers exist, still hold ``keys`` (no row selection since) and have room for `length` positions."""
        if self._buffers is None:
            return False
        keys = self._buffers[0]
        return (
            keys.shape[0] == key_states.shape[0]
            and keys.shape[2] >= length
            and (not self.keys.numel() or self.keys.data_ptr() == keys.data_ptr())
            and keys.dtype == key_states.dtype
        )


# -- linear layers at a decode step's few rows ----------------------------------------------------------
FEW_ROWS = (8, 48)  # the rows a forward holds where (W x^T)^T beats x W^T (fp32, CPU; measured, module docstring)


def few_rows_forward(layer: torch.nn.Linear):
    """`layer`'s forward as ``(W @ x^T)^T (+ b)`` where its input holds FEW_ROWS rows, else its own product."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if not FEW_ROWS[0] <= rows <= FEW_ROWS[1]:
            return torch.nn.functional.linear(x, layer.weight, layer.bias)
        out = torch.mm(layer.weight, x.reshape(rows, x.shape[-1]).t()).t()
        out = out.reshape(*x.shape[:-1], layer.out_features)
        return out if layer.bias is None else out + layer.bias

    return forward


def few_rows_applies(layer: torch.nn.Module) -> bool:
    """A plain linear layer with fp32 weights on a CPU (where the order of the product matters: measured there)."""
    if type(layer) is not torch.nn.Linear or "forward" in vars(layer):  # a forward of its own stays
        return False
    weight = layer.weight
    return weight.device.type == "cpu" and weight.dtype == torch.float32


@contextlib.contextmanager
def few_rows_linears(model: torch.nn.Module):
    """Within this context and without gradients, the plain fp32 CPU linear layers of `model` (the LM head too)
    compute a forward of FEW_ROWS rows as ``(W @ x^T)^T``; with gradients enabled, at other row counts, or on any
    other layer, nothing changes. The layers' own forwards come back when the context ends, whatever happens."""
    if torch.is_grad_enabled():
        yield
        return
    layers = [m for m in model.modules() if few_rows_applies(m)]
    for layer in layers:
        layer.forward = few_rows_forward(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
