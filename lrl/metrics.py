"""The metrics of one training step, assembled as a pure function of what the step computed.

:func:`step_metrics` returns ``(means, maxes)``: ``means`` maps each key to ``(value, weight)`` so that
:meth:`lrl.distributed.Ranks.weighted_means` can reduce it exactly over ranks (the mean over all episodes or
all tokens), ``maxes`` to a value reduced by maximum. One name per quantity, one prefix per area:

- ``train/``: reward, invalid, the environment's per-episode counts (``train/reads``), ``action_tokens``
  (generated tokens per episode), ``skipped``, the update's loss, clip_frac, approx_kl, entropy, grad_norm,
  clip_pos / clip_neg, push_pos / push_neg and adv_pos / adv_neg (per sign of the advantage, the shares of action
  tokens whose gradient the loss removed, the summed |d loss / d log pi| of the rest, and the sum a ratio of 1 would
  give: lrl.losses.LOSS_STATS),
  and ``step_kl`` / ``step_max_log_ratio``: KL(pi_old || pi_new) and the largest |log ratio| on the step's
  own batch after all its minibatches (approx_kl, measured before each minibatch, never sees the last one);
- ``mismatch/abs_mean``, ``mismatch/over_cap``: mean |log pi_old - log mu| over action tokens and the share
  above the TIS cap, from the raw ratios (the monitoring callback adds the rest of the distribution);
- ``offpolicy/``: ``masked`` (share of action tokens with weight 0), ``seq_over_cap`` and
  ``seq_outside_band`` (share of episodes whose sequence-level ratio is above the cap / outside the MIS band);
- ``offpolicy/dropped_tokens/<reason>``, ``offpolicy/dropped_seqs/<reason>``: shares of action tokens, and of
  episodes whole, that each rule of the correction dropped (a mask's name, ``veto``, a correction's own zeros);
- ``staleness/token_mean``, ``staleness/token_max``: trainer version minus each action token's version;
  ``staleness/multi_version_episodes`` and ``_tokens``: shares of episodes (and of action tokens in them) whose
  tokens come from more than one weight version, with ``mismatch/multi_version_abs_mean`` / ``_kl_k3`` and
  ``mismatch/single_version_abs_mean`` / ``_kl_k3`` the mismatch of those episodes' tokens and of the others';
- ``time/``: sample, old_logp, update, shift (the step KL), sync (seconds); ``env/``: worker failures (injected,
  and with environment workers ``env/timeouts`` and ``env/errors``: tools past the timeout, tools that raised).
"""

from __future__ import annotations

import torch

from lrl.batch import Batch
from lrl.sections import WeightingOptions
from lrl.stats import batch_stats, dropped_shares, sequence_corrected_share, version_split

UPDATE_KEYS = ("loss", "clip_frac", "approx_kl")  # logged as 0 for a skipped step (nothing moved)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the mask: [B, T], [B, T] -> []."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def step_metrics(
    batch: Batch,
    old_logp,
    weights,
    updates: list[dict] | None,
    version: int,
    weighting: WeightingOptions,
    times: dict[str, float],
    shift: dict[str, float] | None = None,
    control: dict[str, float] | None = None,
    dropped: dict[str, torch.Tensor] | None = None,
    seen: torch.Tensor | None = None,
) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """One step's metrics as (value, weight) means and maxima; `updates` is None for a skipped step, `shift` the
    policy's movement over the whole step (lrl.stats.policy_shift) when it was measured, `dropped` the action
    tokens each rule of the correction dropped (lrl.weights.Correction), `seen` the rows whose `old_logp` is the
    trainer's (None: all): the mismatch and off-policy numbers cover those rows only."""
    mask = batch["action_mask"]
    on = mask.bool()
    mon = (
        mask if seen is None else mask * seen[:, None].to(mask.dtype)
    )  # rows whose old_logp is the trainer's
    valid = 1.0 - batch["env_failure"]  # [B]
    n_valid = valid.sum().item()
    n_tokens = float(on.sum())
    lag = (version - batch["version"][on]).float()  # [N]
    raw = batch_stats(old_logp, batch["sample_logp"], mon, weights, weighting.cap)
    seq = sequence_corrected_share(
        old_logp, batch["sample_logp"], mon, weighting.cap, weighting.low, weighting.high
    )
    n_mon, n_mon_seq = float(mon.sum()), float(mon.bool().any(-1).sum())
    n_acting = float(on.any(-1).sum())  # rows with an action token
    means: dict[str, tuple[float, float]] = {
        "train/reward": (masked_mean(batch["reward"], valid).item(), n_valid),
        **{f"train/{k}": (masked_mean(v, valid).item(), n_valid) for k, v in batch["env_metrics"].items()},
        "train/invalid": (masked_mean(batch["invalid"], valid).item(), n_valid),
        "train/action_tokens": (masked_mean(mask.sum(-1), valid).item(), n_valid),
        "train/skipped": (float(updates is None), 1.0),
        "mismatch/abs_mean": (raw["abs_mean"], n_mon),
        "mismatch/over_cap": (raw["over_cap"], n_mon),
        # the share of the batch's rows (with an action token) the mismatch and off-policy metrics stand on
        "mismatch/rows_share": (n_mon_seq / max(n_acting, 1.0), n_acting),
        "offpolicy/masked": (raw["masked"], n_mon),
        "offpolicy/seq_over_cap": (seq["seq_over_cap"], n_mon_seq),
        "offpolicy/seq_outside_band": (seq["seq_outside_band"], n_mon_seq),
        "staleness/token_mean": (lag.mean().item() if len(lag) else 0.0, n_tokens),
        **version_split(old_logp, batch["sample_logp"], batch["version"], mon),
        "time/sample": (float(batch["sample_time"]), 1.0),
        **({"train/redrawn": (float(batch["redrawn"]), 1.0)} if "redrawn" in batch else {}),
        **{f"time/{k}": (v, 1.0) for k, v in times.items()},
    }
    if updates:  # per-rank shares of the global minibatch means (lrl.distributed): their rank mean is exact
        # a minibatch whose weights all turned out 0 took no optimizer step and has no grad_norm
        keys = dict.fromkeys(k for u in updates for k in u)
        means.update(
            {f"train/{k}": (torch.stack([u[k] for u in updates if k in u]).mean().item(), 1.0) for k in keys}
        )
    else:  # a skipped batch: the objective is exactly 0 and nothing moved
        means.update({f"train/{k}": (0.0, 1.0) for k in UPDATE_KEYS})
    for reason, (tokens, episodes) in dropped_shares(dropped or {}, mon).items():
        means[f"offpolicy/dropped_tokens/{reason}"] = (tokens, n_mon)
        means[f"offpolicy/dropped_seqs/{reason}"] = (episodes, n_mon_seq)
    means.update(_env_failure_metrics(batch, valid))
    maxes = {"staleness/token_max": float(lag.max().item()) if len(lag) else 0.0}
    means.update({k: (float(v), 1.0) for k, v in (control or {}).items()})
    means.update({k: (float(v), 1.0) for k, v in batch.get("pipeline", {}).items()})
    if shift is not None:
        means["train/step_kl"] = (shift["step_kl"], n_mon)
        maxes["train/step_max_log_ratio"] = shift["step_max_log_ratio"]
    return means, maxes


def _env_failure_metrics(batch: Batch, valid: torch.Tensor) -> dict[str, tuple[float, float]]:
    """env/failures (share of episodes), per-turn failure rate, lengths of failed and healthy episodes."""
    failed = batch["env_failure"]
    n_failed = failed.sum().item()
    n_episodes = float(len(failed))
    out = {"env/failures": (n_failed / n_episodes, n_episodes)}
    if "env_turns" in batch:
        turns = batch["env_turns"].sum().item()
        out["env/turns"] = (turns / n_episodes, n_episodes)
        out["env/turn_failures"] = (n_failed / max(turns, 1.0), turns)
    for key, name in (("env_timeout", "env/timeouts"), ("env_error", "env/errors")):  # environment workers
        if key in batch:  # why they failed: a tool past --tool-timeout, a tool that raised
            out[name] = (batch[key].sum().item() / n_episodes, n_episodes)
    for name, values in batch.get("env_counts", {}).items():  # the step's totals (each rank's own)
        out[f"env/{name}"] = (values.sum().item(), 1.0)
    out["env/length"] = (masked_mean(batch["length"], valid).item(), valid.sum().item())
    out["env/failed_length"] = (masked_mean(batch["length"], failed).item(), n_failed)
    return out
