"""The trainer: a LightningModule that takes the decoupled clipped update on batches from a behavior sampler.

Per training step: pull the next batch (sampled now, with the sampler's current weights), recompute
``old_logp`` with the trainer's policy, turn pi_old/mu into behavior weights (none, TIS or MIS), take
``minibatches`` clipped updates with per-token advantages ``w * A``, then sync the new weights to the
sampler. ``global_step`` counts sampled batches, which is also the policy version. A batch in which no group
has any advantage variance (nothing to learn) is skipped: no weight or optimizer moment changes (a zero-gradient
Adam step would still move the weights), and it is counted in ``train/skipped``.

Guards: a NaN or inf in ``sample_logp``, ``old_logp``, the weights, the advantages, the minibatch log-probs, the
loss or the gradient raises :class:`NumericalError` naming the tensor and the step before the optimizer step.

Data parallel (Lightning DDP): each rank trains on its own episodes; the minibatches are one shuffle of the
global batch, and each rank's loss is scaled to its share of the global per-token mean, so DDP's gradient
average equals the single-process gradient of the same global batch up to floating-point summation order.
Logged metrics are reduced over ranks in one all-reduce per step (exact means over all episodes/tokens).
"""

from __future__ import annotations

import random
import time

import lightning as L
import torch
import torch.distributed as dist

from lrl.losses import clipped_policy_loss
from lrl.policy import sequence_log_probs
from lrl.rollout import evaluate
from lrl.weights import behavior_weights, offpolicy_stats


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the mask: [B, T], [B, T] -> []."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def nonfinite(x: torch.Tensor) -> int:
    """How many entries of x are NaN or inf: any shape -> int."""
    return int((~torch.isfinite(x)).sum().item())


class NumericalError(RuntimeError):
    """A NaN or inf reached a log-prob, weight, loss or gradient; the step stopped before the weights changed."""


def _not_applied(minibatches_done: int) -> str:
    if minibatches_done == 0:
        return "the update was not applied: the weights are those of the previous step"
    return f"this minibatch was not applied (the {minibatches_done} before it were; all weights are finite)"


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
        self.skipped = 0  # batches without any advantage signal, skipped without an update
        self.last_batch: dict | None = None
        self.last_old_logp: torch.Tensor | None = None
        self._sampler_state: dict | None = None

    def on_fit_start(self) -> None:
        self.policy.train()
        self.sampler.setup(self.policy, self.version)
        if self._sampler_state is not None:  # resuming: the kept versions of the checkpointed run
            self.sampler.load_state_dict(self._sampler_state)
            self._sampler_state = None

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
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        step_version, index = self.version, int(batch["index"]) if "index" in batch else len(self.history)
        where = f"step {step_version} (batch {index})"
        ids, attn = batch["ids"], batch["attention_mask"]  # [B, T], [B, T]; action_mask [B, T-1]
        world = self._world_size()
        t0 = time.perf_counter()
        with torch.no_grad():
            old_logp = sequence_log_probs(self.policy, ids, attn, cfg.temperature)  # pi_old, [B, T-1]
        t1 = time.perf_counter()
        weights = self.behavior_weights(old_logp, batch)  # [B, T-1]
        token_adv = batch["advantage"][:, None] * weights
        chunks = self.minibatch_rows(len(ids), world)
        totals, skip = self.check_batch(batch, old_logp, weights, token_adv, chunks, where)
        stats = [] if skip else [self.minibatch_update(i, rows, len(chunks), batch, old_logp, token_adv, totals[i], where)
                                 for i, rows in enumerate(chunks)]  # fmt: skip
        if skip:  # no parameter holds a gradient, so Adam changes nothing (not even its moments); the step counts
            optimizer = self.optimizers()
            optimizer.zero_grad(set_to_none=True)
            optimizer.step()
            self.skipped += 1
        t2 = time.perf_counter()
        self.version += 1
        self.sampler.sync(self.policy, self.version)
        t3 = time.perf_counter()

        record = self.step_record(batch, old_logp, weights, stats, step_version, skip, (t0, t1, t2, t3))
        self.last_batch, self.last_old_logp, self.last_weights = batch, old_logp, weights
        self.last_step_version = step_version
        self.history.append({"step": step_version, "batch": index, **record})
        self.log_dict(record, on_step=True, on_epoch=False, batch_size=len(ids))
        if "train/reward" in record:
            self.log("reward", record["train/reward"], prog_bar=True, logger=False, on_step=True, batch_size=len(ids))
        return None

    def check_batch(self, batch, old_logp, weights, token_adv, chunks, where) -> tuple[torch.Tensor, bool]:
        """NaN/inf check of the batch's log-probs, weights and advantages, on all ranks at once (one all-reduce
        that also sums the action tokens of every minibatch) -> (global token counts per minibatch, skip)."""
        mask = batch["action_mask"]
        on = mask.bool()
        checked = {"sample_logp (log mu)": batch["sample_logp"][on], "old_logp (log pi_old)": old_logp[on],
                   "weights": weights[on], "advantage": batch["advantage"]}  # fmt: skip
        signal = float((token_adv * mask).ne(0).any())  # some token carries an advantage
        local = torch.tensor([float(nonfinite(x)) for x in checked.values()] + [signal], dtype=torch.float64)
        counts = torch.stack([mask[rows].sum() for rows in chunks]).double().cpu()  # action tokens per local chunk
        summed = self._all_reduce(torch.cat([local, counts]))
        self._raise_if_nonfinite(dict(zip(checked, local)), dict(zip(checked, summed)), where)
        return summed[len(local) :], summed[len(checked)].item() == 0

    def minibatch_update(self, i, rows, n_chunks, batch, old_logp, token_adv, total_tokens, where) -> dict:
        """One clipped update on this rank's rows of minibatch i -> its statistics (shares of the global mean)."""
        cfg, world, optimizer = self.cfg, self._world_size(), self.optimizers()
        ids, attn, mask = batch["ids"][rows], batch["attention_mask"][rows], batch["action_mask"][rows]
        if len(rows):
            logits = self.policy(input_ids=ids, attention_mask=attn).logits[:, :-1]  # [b, T-1, V]
            logp_all = torch.log_softmax(logits.float() / cfg.temperature, -1)  # one softmax for loss and entropy
            logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [b, T-1]
            loss, st = clipped_policy_loss(logp, old_logp[rows], token_adv[rows], mask, cfg.eps_low, cfg.eps_high)
            with torch.no_grad():
                st["entropy"] = masked_mean(-(logp_all.exp() * logp_all).sum(-1), mask)
            bad = {"logp (log pi)": nonfinite(logp[mask.bool()]), "loss": nonfinite(loss)}
        else:  # this rank has no rows in the minibatch: a zero loss keeps the gradient all-reduce in step
            loss = sum(p.sum() for p in self.policy.parameters()) * 0.0
            st = {k: torch.zeros((), device=self.device) for k in ("clip_frac", "approx_kl", "entropy")}
            bad = {"logp (log pi)": 0, "loss": 0}
        if world > 1:  # this rank's share of the global per-token mean, so that DDP's average is that mean
            scale = (mask.sum().double().cpu().clamp(min=1) * world / total_tokens.clamp(min=1)).float().item()
            loss, st = loss * scale, {k: v * scale for k, v in st.items()}
        local_bad = torch.tensor([float(v) for v in bad.values()], dtype=torch.float64)
        self._raise_if_nonfinite(dict(zip(bad, local_bad)), dict(zip(bad, self._all_reduce(local_bad))),
                                 f"{where}, minibatch {i}", applied=i)  # fmt: skip
        st["loss"] = loss.detach()
        optimizer.zero_grad()
        self.manual_backward(loss)
        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.stack([g.detach().norm() for g in grads]).norm() if grads else torch.zeros(())
        if not torch.isfinite(grad_norm):  # the same on every rank: gradients are all-reduced
            raise NumericalError(f"non-finite gradient at {where}, minibatch {i} (norm {grad_norm.item()}); "
                                 + _not_applied(i))  # fmt: skip
        st["grad_norm"] = grad_norm.detach()
        self.clip_gradients(optimizer, gradient_clip_val=cfg.max_grad_norm, gradient_clip_algorithm="norm")
        # only the last minibatch steps through Lightning, so global_step counts sampled batches
        (optimizer.step if i == n_chunks - 1 else optimizer.optimizer.step)()
        return {k: v.detach() for k, v in st.items()}

    def minibatch_rows(self, n_local: int, world: int) -> list[torch.Tensor]:
        """This rank's rows of each shuffled minibatch: one permutation of the global batch (the same draw on
        every rank), chunked, each chunk cut to the rows this rank holds. One process: plain shuffled chunks."""
        perm = torch.randperm(n_local * world, generator=self.shuffle)
        chunks = perm.chunk(self.cfg.minibatches)
        if world == 1:
            return list(chunks)
        lo = self.global_rank * n_local
        return [c[(c >= lo) & (c < lo + n_local)] - lo for c in chunks]

    def step_record(self, batch, old_logp, weights, stats, step_version, skip, times) -> dict[str, float]:
        """The step's logged metrics, reduced over ranks: exact means over all ranks' episodes and tokens."""
        cfg, mask = self.cfg, batch["action_mask"]
        on = mask.bool()
        valid = 1.0 - batch["env_failure"] if "env_failure" in batch else torch.ones_like(batch["reward"])  # [B]
        n_valid, n_episodes, n_tokens = valid.sum().item(), float(len(valid)), float(on.sum())
        lag = (step_version - batch["version"][on]).float()  # [N]
        raw = offpolicy_stats(old_logp, batch["sample_logp"], mask, weights, cfg.cap)
        t0, t1, t2, t3 = times
        # (value, weight): the reduced value is sum(value * weight) / sum(weight) over ranks
        means: dict[str, tuple[float, float]] = {
            "train/reward": (masked_mean(batch["reward"], valid).item(), n_valid),
            "train/reads": (masked_mean(batch["reads"], valid).item(), n_valid),
            "train/invalid": (masked_mean(batch["invalid"], valid).item(), n_valid),
            "train/skipped": (float(skip), 1.0),
            **{f"offpolicy/{k}": (v, n_tokens) for k, v in raw.items()},
            "offpolicy/staleness": (lag.mean().item() if len(lag) else 0.0, n_tokens),
            "time/sample": (float(batch["sample_time"]), 1.0),
            "time/old_logp": (t1 - t0, 1.0),
            "time/update": (t2 - t1, 1.0),
            "time/sync": (t3 - t2, 1.0),
        }
        if stats:  # per-rank shares of the global minibatch means (see training_step): their rank mean is exact
            means.update({f"train/{k}": (torch.stack([s[k] for s in stats]).mean().item(), 1.0) for k in stats[0]})
        else:  # a skipped batch: the objective is exactly 0 and nothing moved
            means.update({f"train/{k}": (0.0, 1.0) for k in ("loss", "clip_frac", "approx_kl")})
        if "env_failure" in batch:
            failed = batch["env_failure"]
            n_failed = failed.sum().item()
            means["env/failures"] = (n_failed / n_episodes, n_episodes)
            if "env_turns" in batch:
                turns = batch["env_turns"].sum().item()
                means["env/turns"] = (turns / n_episodes, n_episodes)
                means["env/turn_failures"] = (n_failed / max(turns, 1.0), turns)
            means["env/length"] = (masked_mean(batch["length"], valid).item(), n_valid)
            means["env/failed_length"] = (masked_mean(batch["length"], failed).item(), n_failed)
        maxes = {"offpolicy/staleness_max": float(lag.max().item()) if len(lag) else 0.0}
        return self._reduce(means, maxes)

    def _world_size(self) -> int:
        return self._trainer.world_size if self._trainer is not None else 1

    def _all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or max) of a tensor over ranks; the tensor itself in a single process."""
        if self._world_size() == 1 or not dist.is_initialized():
            return x
        y = x.to(self.device)
        dist.all_reduce(y, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return y.to(x.device)

    def _reduce(self, means: dict[str, tuple[float, float]], maxes: dict[str, float]) -> dict[str, float]:
        """Weighted means and maxima over ranks; a key whose total weight is 0 is left out (never NaN)."""
        if self._world_size() == 1:
            return {**{k: v for k, (v, w) in means.items() if w > 0}, **maxes}
        keys = list(means)
        sums = self._all_reduce(torch.tensor([[v * w, w] for v, w in (means[k] for k in keys)], dtype=torch.float64))
        top = self._all_reduce(torch.tensor(list(maxes.values()), dtype=torch.float64), "max")
        out = {k: (s / w).item() for k, (s, w) in zip(keys, sums) if w > 0}
        return {**out, **{k: v.item() for k, v in zip(maxes, top)}}

    def _raise_if_nonfinite(self, local: dict, total: dict, where: str, applied: int = 0) -> None:
        """Stop the step, on every rank at once, if any rank found NaN/inf in a checked tensor."""
        for name, n in total.items():
            if n > 0:
                mine = local[name] > 0
                raise NumericalError(f"non-finite {name} at {where}: {int(local[name]) if mine else int(n)} NaN/inf "
                                     f"values{'' if mine else ' on another rank'}; " + _not_applied(applied))  # fmt: skip

    # -- checkpoints ---------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add what Lightning does not save: version, shuffle generator, history, sampler versions, RNGs."""
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self._world_size() > 1 and dist.is_initialized():
            ranks: list = [None] * self._world_size()
            dist.all_gather_object(ranks, rng)
        else:
            ranks = [rng]
        checkpoint["lrl"] = {"version": self.version, "skipped": self.skipped, "shuffle": self.shuffle.get_state(),
                             "history": list(self.history), "sampler": self.sampler.state_dict(), "rng": ranks,
                             "config": self.cfg.to_dict()}  # fmt: skip

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["lrl"]
        self.version, self.skipped = state["version"], state["skipped"]
        self.shuffle.set_state(state["shuffle"])
        self.history = list(state["history"])
        self._sampler_state = state["sampler"]  # loaded in on_fit_start, after the sampler is set up
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
        if progress.get("is_last_batch") and checkpoint.get("global_step", 0) < self.cfg.max_steps:
            progress["is_last_batch"] = False  # a finished run resumed with a larger --max-steps continues
        rng = state["rng"][self.global_rank if self._trainer is not None else 0]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])

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
