"""The trainer: a LightningModule that takes the decoupled clipped update on batches from a behavior sampler.

Per training step: pull the next batch (sampled now, with the sampler's current weights), recompute
``old_logp`` with the trainer's policy, turn pi_old/mu into behavior weights (none, TIS or MIS), take
``minibatches`` clipped updates with per-token advantages ``w * A``, then sync the new weights to the
sampler. ``global_step`` counts sampled batches, which is also the policy version.
"""

from __future__ import annotations

import time

import lightning as L
import torch

from lrl.losses import clipped_policy_loss
from lrl.policy import selected_log_probs, sequence_log_probs
from lrl.rollout import evaluate
from lrl.weights import behavior_weights, offpolicy_stats


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the mask: [B, T], [B, T] -> []."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


class OffPolicyModule(L.LightningModule):
    """Owns the policy and its optimizer; the sampler is handed new weights after every update."""

    def __init__(self, cfg, policy: torch.nn.Module, sampler, tok, heldout_tasks):
        super().__init__()
        self.cfg, self.policy, self.sampler, self.tok = cfg, policy, sampler, tok
        self.heldout_tasks = heldout_tasks
        self.automatic_optimization = False
        self.version = 0
        self.shuffle = torch.Generator().manual_seed(cfg.seed + 1)
        self.history: list[dict[str, float]] = []
        self.last_batch: dict | None = None
        self.last_old_logp: torch.Tensor | None = None

    def on_fit_start(self) -> None:
        self.policy.train()
        self.sampler.setup(self.policy, self.version)

    def configure_optimizers(self):
        return torch.optim.Adam(self.policy.parameters(), lr=self.cfg.lr)

    # -- the update ----------------------------------------------------------------------------------
    def behavior_weights(self, old_logp, batch) -> torch.Tensor:
        c = self.cfg
        return behavior_weights(old_logp, batch["sample_logp"], batch["action_mask"], c.correction, c.level,
                                c.cap, c.low, c.high, c.veto or None)  # fmt: skip

    def training_step(self, dataloader_iter):
        cfg = self.cfg
        batch, _, _ = next(dataloader_iter)  # sampled here, after the previous sync
        step_version = self.version
        ids, attn, mask = batch["ids"], batch["attention_mask"], batch["action_mask"]  # [B, T], [B, T], [B, T-1]
        t0 = time.perf_counter()
        with torch.no_grad():
            old_logp = sequence_log_probs(self.policy, ids, attn, cfg.temperature)  # pi_old, [B, T-1]
        t1 = time.perf_counter()
        weights = self.behavior_weights(old_logp, batch)  # [B, T-1]
        token_adv = batch["advantage"][:, None] * weights
        optimizer = self.optimizers()
        stats: list[dict[str, torch.Tensor]] = []
        chunks = torch.randperm(len(ids), generator=self.shuffle).chunk(cfg.minibatches)
        for i, rows in enumerate(chunks):
            logits = self.policy(input_ids=ids[rows], attention_mask=attn[rows]).logits[:, :-1]  # [b, T-1, V]
            logp = selected_log_probs(logits, ids[rows, 1:], cfg.temperature)
            loss, st = clipped_policy_loss(logp, old_logp[rows], token_adv[rows], mask[rows], cfg.eps_low, cfg.eps_high)
            with torch.no_grad():
                logp_all = torch.log_softmax(logits.float() / cfg.temperature, -1)
                st["entropy"] = masked_mean(-(logp_all.exp() * logp_all).sum(-1), mask[rows])
            st["loss"] = loss.detach()
            optimizer.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(optimizer, gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm")
            # only the last minibatch steps through Lightning, so global_step counts sampled batches
            (optimizer.step if i == len(chunks) - 1 else optimizer.optimizer.step)()
            stats.append(st)
        t2 = time.perf_counter()
        self.version += 1
        self.sampler.sync(self.policy, self.version)
        t3 = time.perf_counter()

        on_action = mask.bool()
        raw = offpolicy_stats(old_logp, batch["sample_logp"], mask, weights, cfg.cap)
        record = {
            "train/reward": batch["reward"].mean().item(),
            "train/reads": batch["reads"].mean().item(),
            "train/invalid": batch["invalid"].mean().item(),
            **{f"train/{k}": torch.stack([s[k] for s in stats]).mean().item() for k in stats[0]},
            **{f"offpolicy/{k}": v for k, v in raw.items()},
            "offpolicy/staleness": (step_version - batch["version"][on_action]).float().mean().item(),
            "offpolicy/staleness_max": float((step_version - batch["version"][on_action]).max().item()),
            "time/sample": float(batch["sample_time"]),
            "time/old_logp": t1 - t0,
            "time/update": t2 - t1,
            "time/sync": t3 - t2,
        }
        self.last_batch, self.last_old_logp, self.last_weights = batch, old_logp, weights
        self.last_step_version = step_version
        self.history.append({"step": step_version, **record})
        self.log_dict(record, on_step=True, on_epoch=False, batch_size=len(ids))
        self.log("reward", record["train/reward"], prog_bar=True, logger=False, on_step=True, batch_size=len(ids))
        return None

    # -- held-out evaluation -------------------------------------------------------------------------
    def validation_step(self, batch, batch_idx):
        stats = evaluate(self.policy, self.heldout_tasks, self.cfg.eval_episodes, seed=self.cfg.seed + 10_000,
                         tok=self.tok, temperature=self.cfg.temperature, max_turns=self.cfg.max_turns)  # fmt: skip
        self.last_eval = {"step": self.version, **stats}
        metrics = {f"val/{k}": float(stats[k]) for k in ("pass_rate", "reads", "invalid")}
        self.log("val/pass_rate", stats["pass_rate"], prog_bar=True, logger=False, batch_size=1)
        if self.logger is not None and self.trainer.is_global_zero:
            # stepped by the policy version, so the held-out point sits at the update count it measures
            self.logger.log_metrics(metrics, step=self.version)
