"""Log-probs of chosen tokens without the ``[B, T, V]`` logits of a whole batch.

A real vocabulary makes the logits the largest tensor of a step: 128 episodes of 238 tokens over SmolLM2's
49,152 words are 6 GB in fp32, three times that with their log-softmax and gradient. Only one number per
position is needed (the chosen token's log-prob, and for the loss its entropy), so the model's body runs
once and its LM head runs over chunks of positions:

- without gradients, a chunk's logits live only while its log-softmax is read;
- with gradients, each chunk's head, log-softmax and gather run under activation checkpointing: the backward
  pass recomputes a chunk's logits from its hidden states instead of keeping them, so the peak holds one
  chunk's logits, never the batch's;
- ``positions`` limits the head to the positions that count (the action tokens): the others are 0.

The split into body and head is checked on each model once (the head applied to the body's last hidden state
must give the model's own logits; a model that scales or caps its logits on the way does not pass) and a model
that does not split is scored through its full forward, as before.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

CHUNK_TOKENS = 512  # positions per head chunk: 512 x 49,152 fp32 logits are 96 MiB
# batches whose full logits hold at most this many values are scored in one full forward, as they always were
# (the built-in policies' vocabularies of a hundred words never reach it: their numbers do not change)
FULL_LOGITS_LIMIT = 1 << 24  # 64 MiB of fp32 logits
_SPLIT_ATTR = "_lrl_head_split"


def _body(model):
    """The model's decoder stack (without its LM head), or None where transformers names none."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, torch.nn.Module) and base is not model else None


@torch.no_grad()
def head_splits(model) -> bool:
    """True when ``head(body(x).last_hidden_state)`` is the model's own logits (checked once per model)."""
    known = getattr(model, _SPLIT_ATTR, None)
    if known is not None:
        return known
    ok = False
    body, head = (
        _body(model),
        model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None,
    )
    if body is not None and head is not None:
        device = next(model.parameters()).device
        vocab = head.weight.shape[0]
        ids = torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(0)).to(device)
        mask = torch.ones_like(ids)
        mask[1, :2] = 0  # left padding in one row: the split must agree there too
        try:
            full = model(input_ids=ids, attention_mask=mask).logits.float()
            split = head(body(input_ids=ids, attention_mask=mask).last_hidden_state).float()
            scale = full.abs().max().clamp(min=1.0)
            ok = split.shape == full.shape and bool(((split - full).abs().max() / scale) < 1e-3)
        except (TypeError, AttributeError, RuntimeError):
            ok = False
    try:
        object.__setattr__(model, _SPLIT_ATTR, ok)
    except AttributeError:  # pragma: no cover - a module that refuses attributes is checked every time
        pass
    return ok


def _chunk_scores(head, hidden, targets, temperature: float, want_entropy: bool, entropy_grad: bool = True):
    """One chunk: hidden [n, H], targets [n] -> (log-probs [n], entropies [n] or an empty tensor), in fp32.

    The temperature divides the hidden state before the head rather than the [n, V] logits after it (the same
    logits to rounding: the head is linear, without bias), one pass over the logits fewer each way. Without
    ``entropy_grad`` the entropies are a metric: computed without a graph, so the backward pass never sees them."""
    if getattr(head, "bias", None) is None and temperature != 1.0:
        logits = head(hidden / temperature).float()  # [n, V]
    else:
        logits = head(hidden).float() / temperature
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not want_entropy:
        return logp, logp.new_zeros(0)
    with torch.enable_grad() if entropy_grad else torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def token_log_probs(
    model,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    positions: torch.Tensor | None = None,
    entropy: bool = False,
    chunk: int = CHUNK_TOKENS,
    checkpoint_head: bool = True,
    prefix: torch.Tensor | None = None,
    entropy_grad: bool = True,
):
    """Trainer-style log-prob of every next token: ids [B, T] -> log-probs [B, T-1] (and entropies [B, T-1]
    when ``entropy``), fp32, differentiable when gradients are enabled (the entropies only with ``entropy_grad``:
    without it they are a metric, computed outside the graph).

    ``positions`` ([B, T-1] bool): only these positions need to be scored; the others may be 0 (they are
    when the head runs in chunks). ``checkpoint_head`` False: with gradients, the head's chunks keep their
    tensors for the backward pass instead of recomputing them there (where memory allows; the same numbers).
    ``prefix`` ([B] long, with ``positions`` and right-padded rows): each row's prompt length, every position
    scored at or after its last token; rows whose prompts are the same tokens (the samples of one task) run the
    prompt once, as one sequence whose keys and values they all attend to (:func:`_shared_prompt_hidden`).
    """
    targets = ids[:, 1:]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = head.weight.shape[0] if head is not None else 0
    if ids.numel() * vocab <= FULL_LOGITS_LIMIT or not head_splits(model):
        logits = model(input_ids=ids, attention_mask=attention_mask).logits[:, :-1]  # [B, T-1, V]
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if not entropy:
            return logp
        with torch.enable_grad() if entropy_grad else torch.no_grad():
            return logp, -(logp_all.exp() * logp_all).sum(-1)
    where = positions.bool() if positions is not None else torch.ones_like(targets, dtype=torch.bool)
    if prefix is not None and positions is not None:
        flat_hidden = _shared_prompt_hidden(model, ids, attention_mask, prefix, where)  # [N, H]
    else:
        hidden = _body(model)(input_ids=ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
        flat_hidden = hidden[where]  # [N, H]
    flat_targets = targets[where]  # [N]
    grad = torch.is_grad_enabled() and flat_hidden.requires_grad
    logps, ents = [], []
    for start in range(0, len(flat_targets), chunk):
        h, t = flat_hidden[start : start + chunk], flat_targets[start : start + chunk]
        if grad and checkpoint_head:
            lp, en = checkpoint(_chunk_scores, head, h, t, temperature, entropy, entropy_grad, use_reentrant=False)
        else:
            lp, en = _chunk_scores(head, h, t, temperature, entropy, entropy_grad)
        logps.append(lp)
        ents.append(en)
    out = flat_hidden.new_zeros(targets.shape, dtype=torch.float32)
    out = out.masked_scatter(where, torch.cat(logps)) if logps else out
    if not entropy:
        return out
    ent = flat_hidden.new_zeros(targets.shape, dtype=torch.float32)
    ent = ent.masked_scatter(where, torch.cat(ents)) if ents else ent
    return out, ent


def distinct_sequences(seqs) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct token sequences of `seqs`, in the order they first appear, and the index of each sequence's
    among them (the samples of one task share their prompt: it is run once)."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(seq), len(first)) for seq in seqs]
    return list(first), index


def _shared_prompt_hidden(model, ids, attention_mask, prefix, where) -> torch.Tensor:
    """The body's hidden state at the positions `where` ([B, T-1] bool; row-major order) -> [N, H], each distinct
    prompt ``ids[r, :prefix[r]]`` run once.

    The distinct prompts run left-padded in one forward whose keys and values (and last hidden state, which
    predicts each row's first generated token) are then indexed out to their rows; the rows' own tokens after
    their prompts run in a second forward that attends to them at the same positions the whole row would have.
    The numbers are the ones one forward of every whole row gives, to rounding; a gradient reaches the shared
    prompt from every row that attends to it."""
    from transformers import DynamicCache

    body = _body(model)
    rows = len(ids)
    device = ids.device
    prompts, index = distinct_sequences(ids[r, : int(prefix[r])].tolist() for r in range(rows))
    group = torch.tensor(index, device=device)
    width = max(map(len, prompts))
    pad = int(ids[0, -1]) if ids.shape[1] else 0  # any id: padded positions are masked
    prompt_ids = torch.full((len(prompts), width), pad, dtype=ids.dtype, device=device)
    prompt_mask = torch.zeros((len(prompts), width), dtype=attention_mask.dtype, device=device)
    for g, prompt in enumerate(prompts):
        prompt_ids[g, width - len(prompt) :] = torch.tensor(prompt, dtype=ids.dtype, device=device)
        prompt_mask[g, width - len(prompt) :] = 1
    out = body(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=DynamicCache(config=model.config),
        use_cache=True,
    )
    shared = [(layer.keys[group], layer.values[group]) for layer in out.past_key_values.layers]
    lengths = attention_mask.sum(-1)  # right padding: the real tokens of each row
    rest = int((lengths - prefix).max())
    offsets = torch.arange(rest, device=device)
    take = (prefix[:, None] + offsets).clamp(max=ids.shape[1] - 1)  # [B, rest]
    rest_mask = (offsets < (lengths - prefix)[:, None]).to(attention_mask.dtype)
    after = body(
        input_ids=ids.gather(1, take),
        attention_mask=torch.cat([prompt_mask[group], rest_mask], -1),
        position_ids=prefix[:, None] + offsets,
        past_key_values=DynamicCache(shared, config=model.config),
        use_cache=True,
    ).last_hidden_state  # [B, rest, H]
    # position p of row r is prefix[r] - 1 + k in [its prompt's last hidden state, the rest's]
    seq = torch.cat([out.last_hidden_state[group, -1:], after], 1)  # [B, 1 + rest, H]
    r, t = where.nonzero(as_tuple=True)
    return seq[r, t - prefix[r] + 1]


@torch.no_grad()
def scored_in_rows(
    model,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    positions: torch.Tensor | None = None,
    max_tokens: int | None = None,
    entropy: bool = False,
    prefix: torch.Tensor | None = None,
):
    """:func:`token_log_probs` without gradients, in forwards of at most `max_tokens` padded tokens (rows of
    the batch taken in order; None: one forward) -> [B, T-1] (and the entropies, [B, T-1], with ``entropy``)."""
    rows = len(ids) if not max_tokens else max(1, max_tokens // max(ids.shape[1], 1))
    if rows >= len(ids):
        return token_log_probs(model, ids, attention_mask, temperature, positions, entropy, prefix=prefix)
    parts = []
    for start in range(0, len(ids), rows):
        sl = slice(start, start + rows)
        pos = positions[sl] if positions is not None else None
        pre = prefix[sl] if prefix is not None else None
        parts.append(token_log_probs(model, ids[sl], attention_mask[sl], temperature, pos, entropy, prefix=pre))
    if entropy:
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return torch.cat(parts)


def prompt_lengths(action_mask: torch.Tensor) -> torch.Tensor:
    """Each row's prompt length: the tokens before its first action token ([B, T-1] -> [B]; 1 for a row with
    none, so that it shares nothing)."""
    on = action_mask.bool()
    return torch.where(on.any(-1), on.float().argmax(-1) + 1, 1)
