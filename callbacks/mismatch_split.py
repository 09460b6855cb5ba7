"""MismatchSplit: the mismatch of a live run, split into its causes.

Every ``every`` steps, a sample of the trained episodes' action tokens is scored again under controlled changes,
one cause at a time, and the total ``log pi_old - log mu`` of each token is written as a sum of four parts:

- ``staleness``: the trainer's weights of this step against the weights of the version that sampled the token
  (``version`` tag), both scored as the trainer scores (its forward, its arithmetic);
- ``quantization``: that version's weights against the same weights after the sampler's transform (FP8
  rounding), both scored as the trainer scores;
- ``engine``: the trainer's way of scoring against the sampler's decode path (a KV cache, one position per
  step, observations prefilled, in the sampler's dtype or arithmetic, its top-k/top-p), on the transformed
  weights of that version;
- ``rest``: what the decode path's rescoring still leaves of the sampler's own log-probs (another batch
  composition, a real engine's kernels, nondeterminism).

The chain telescopes, so the four parts add up to the total of every token by construction; a cause that is
absent gives a part of zero (on-policy in fp32: staleness and quantization exactly 0). What is measured is how
the total divides: ``mismatch/part/<name>`` is the mean over the sampled tokens of the part (signed) and
``mismatch/part/<name>_abs`` its mean absolute value, beside ``mismatch/part/total`` and ``total_abs``;
``mismatch/part/explained`` is the share of the total's mean absolute value that the three causes carry
(1 - |rest| / |total|, token-weighted means). ``mismatch/part/seconds`` is what the split cost this step.

The weights of the versions a later split will need are kept as CPU copies, only from ``window`` steps before
each split step (``window``: how stale a token can be, the sampler's declared staleness or the pipeline's bound).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import TYPE_CHECKING

import lightning as L
import torch

from lrl.callbacks._common import log_scalars, published

if TYPE_CHECKING:
    from lrl.samplers.base import Traits

PARTS = ("staleness", "quantization", "engine", "rest")


def resolved(traits: Traits, policy: torch.nn.Module) -> Traits:
    """A sampler's traits with its decode path and arithmetic fixed for `policy` (their
    'auto' depends on the model's size)."""
    from lrl.precision import resolve_decode, resolve_precision

    decode, precision = resolve_decode(traits.decode, policy), resolve_precision(traits.precision, policy)
    return dataclasses.replace(traits, decode=decode, precision=precision)


class MismatchSplit(L.Callback):
    """Splits the batch's mismatch into staleness, quantization, engine and rest every ``every`` steps.

    Args:
        every: split every this many steps (step 0 included).
        rows: episodes sampled from the batch for the split (the ones with action tokens first).
        window: the most versions a token can lag the trainer (None: the sampler's staleness, or the asynchronous
            pipeline's bound).
        traits: the sampler's transforms (None: the run's sampler's, asked through its source at the start of the
            fit).
    """

    def __init__(
        self, every: int = 10, rows: int = 8, window: int | None = None, traits: Traits | None = None
    ):
        super().__init__()
        if every < 1 or rows < 1:
            raise ValueError(f"every and rows must be >= 1; got {every}, {rows}")
        self.every, self.rows, self.window, self.traits = every, rows, window, traits
        self.kept: dict[int, dict[str, torch.Tensor]] = {}  # version -> CPU copy of its weights
        self.last: dict[str, float] = {}

    # -- what the split needs ----------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        rollout = pl_module.cfg.rollout
        traits = self.traits or pl_module.source.sampler_traits()
        if self.window is None:
            self.window = (rollout.max_staleness if rollout.pipeline == "async" else traits.staleness) + 1
        self.traits = resolved(traits, pl_module.policy)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        version = pl_module.version
        upcoming = -(-version // self.every) * self.every  # the next split step, this one included
        if upcoming - version <= self.window:
            self.kept[version] = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.policy.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = published(pl_module, "MismatchSplit")
        if record is None or record.version % self.every:
            return
        start = time.perf_counter()
        metrics = self.split(pl_module, record)
        for version in [v for v in self.kept if v < record.version + self.every - self.window]:
            del self.kept[version]  # no later split can meet a token this old
        if metrics:
            metrics["mismatch/part/seconds"] = time.perf_counter() - start
            self.last = metrics
            log_scalars(trainer, pl_module, metrics)
            pl_module.history[-1].update(metrics)  # the history file and the run's summary carry them too

    # -- the split --------------------------------------------------------------------------------------
    @torch.no_grad()
    def split(self, pl_module, record) -> dict[str, float]:
        from lrl.logprobs import token_log_probs
        from lrl.precision import autocast

        batch = record.batch
        mask = record.monitored_mask().bool()  # the rows whose old_logp is the trainer's own
        rows = [i for i in range(len(mask)) if mask[i].any()][: self.rows]
        if not rows:
            return {}
        ids, attention = batch["ids"][rows].cpu(), batch["attention_mask"][rows].cpu()
        mask, versions = mask[rows].cpu(), batch["version"][rows].cpu()
        total = (record.old_logp[rows].cpu() - batch["sample_logp"][rows].cpu()).float()
        chain = [record.old_logp[rows].cpu().float()]  # trainer weights, trainer numerics
        scratch = copy.deepcopy(pl_module.policy).cpu().eval()
        stale, transformed, engine = (torch.zeros_like(total) for _ in range(3))
        n = self.traits
        for version in versions[mask].unique().tolist():
            if version not in self.kept:
                return {}  # the weights of that version were not kept (a resumed run's first split)
            here = mask & (versions == version)
            scratch.load_state_dict(self.kept[version])
            with autocast(pl_module.precision):
                stale[here] = token_log_probs(scratch, ids, attention, pl_module.cfg.sampling.temperature, mask)[here]
            if n.transform is not None:
                n.transform(scratch)
            with autocast(pl_module.precision):
                transformed[here] = token_log_probs(scratch, ids, attention, pl_module.cfg.sampling.temperature, mask)[here]
            engine[here] = self.decode_path(scratch, ids, attention, mask)[here]
        chain += [stale, transformed, engine, batch["sample_logp"][rows].cpu().float()]
        parts = {name: (chain[i] - chain[i + 1]) for i, name in enumerate(PARTS)}
        count = mask.sum().clamp(min=1)
        out = {"mismatch/part/total": float((total * mask).sum() / count)}
        out["mismatch/part/total_abs"] = float((total.abs() * mask).sum() / count)
        for name, part in parts.items():
            out[f"mismatch/part/{name}"] = float((part * mask).sum() / count)
            out[f"mismatch/part/{name}_abs"] = float((part.abs() * mask).sum() / count)
        rest, whole = out["mismatch/part/rest_abs"], out["mismatch/part/total_abs"]
        out["mismatch/part/explained"] = 1.0 - rest / whole if whole > 0 else 1.0
        out["mismatch/part/tokens"] = float(count)
        return out

    def decode_path(self, model, ids, attention, mask) -> torch.Tensor:
        """The sampler's log-probs of the action tokens as its decode path computes them: trainer-style full
        forwards, or a KV cache fed an action a token at a time and each observation in one prefill."""
        from lrl.kvcache import KVBatch
        from lrl.logprobs import token_log_probs
        from lrl.precision import autocast

        n = self.traits
        net = model if n.dtype == torch.float32 else copy.deepcopy(model).to(n.dtype)
        out = torch.zeros(mask.shape, dtype=torch.float32)
        if n.decode == "trainer":
            with autocast(n.precision):
                logits_free = token_log_probs(net, ids, attention, n.sampling.temperature, mask)
            return logits_free  # the trainer-style decode's own log-probs (top-k/top-p aside)
        pad = 0
        with autocast(n.precision):
            for r in range(len(ids)):
                real = ids[r][attention[r].bool()].tolist()
                start = int(attention[r].argmax())  # right-padded rows start at 0; left-padded ones later
                made = mask[r, start : start + len(real) - 1].tolist()  # made[t - 1]: token t was generated
                first = next(t for t in range(1, len(real)) if made[t - 1])
                batch = KVBatch(net, pad, n=1)
                logits = batch.feed([real[:first]])
                t = first
                while t < len(real):
                    if made[t - 1]:
                        logp = n.sampling.log_probs(logits)[0, real[t]]
                        out[r, start + t - 1] = logp.float()
                    nxt = next((u for u in range(t + 1, len(real)) if made[u - 1]), len(real))
                    if nxt >= len(real):
                        break
                    logits = batch.feed([real[t:nxt]])
                    t = nxt
        return out
