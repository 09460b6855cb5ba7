"""The trainer: a LightningModule that takes the decoupled clipped update on batches from a behavior sampler.

One training step, read top to bottom in :meth:`OffPolicyModule.training_step`: pull the batch (sampled
now, with the sampler's current weights), recompute ``old_logp`` with the trainer's policy, turn
pi_old/mu into behavior weights (the configured correction), take ``minibatches`` clipped updates with
per-token advantages ``w * A``, publish the new weights to the rollout source, and publish the step's record
(:class:`StepRecord`, read by the callbacks) and metrics. ``global_step`` counts sampled batches, which is
also the policy version. The path of a batch is drawn in docs/architecture.md.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import lightning as L
import torch

from lrl.batch import Batch, to_device
from lrl.distributed import Ranks
from lrl.evaluation import heldout
from lrl.logprobs import scored_in_rows, token_log_probs
from lrl.losses import policy_loss
from lrl.metrics import step_metrics
from lrl.precision import LossScale, accelerator_device, autocast, resolve_precision
from lrl.proximal import correction_side, proximal_logp
from lrl.stats import policy_shift
from lrl.streams import EVALUATION, SHUFFLE, stream_seed
from lrl.update import (
    ForwardLog,
    Minibatch,
    NumericalError,
    UpdateGuard,
    UpdatePlan,
    learning_rate,
    nonfinite,
    not_applied,
    plan_update,
    raise_if_nonfinite,
)
from lrl.weights import correct

__all__ = ["OffPolicyModule", "StepRecord", "NumericalError"]


@dataclass
class StepRecord:
    """What one training step publishes for the callbacks (``module.last_step``)."""

    version: int  # the trainer's policy version at the start of the step: it scored and trained the batch
    batch: Batch
    old_logp: torch.Tensor  # [B, T-1] log pi_old, computed before the update
    weights: torch.Tensor  # [B, T-1] the correction weights that multiplied the advantages
    metrics: dict[str, float]  # the step's logged metrics, reduced over ranks
    seen: torch.Tensor | None = None  # [B] rows whose old_logp is the trainer's (None: all; see ForwardLog)

    def monitored_mask(self) -> torch.Tensor:
        """The action tokens whose old_logp is the trainer's own: [B, T-1] (rows no forward saw left out)."""
        mask = self.batch["action_mask"]
        return mask if self.seen is None else mask * self.seen[:, None].to(mask.dtype)


class OffPolicyModule(L.LightningModule):
    """Owns the policy and its optimizer; the rollout source is handed new weights after every update.

    Of the source it knows only the weight side (``setup``, ``publish``, the weights' checkpoint state): where
    batches come from, and how, is the source's business (``lrl.sources``).
    """

    def __init__(self, cfg, policy: torch.nn.Module, source, spec, memory=None):
        super().__init__()
        self.cfg = cfg
        self.policy = policy
        self.source = source
        self.spec = spec
        self.memory = memory  # lrl.budget.MemoryPlan: how many tokens one forward may hold (None: a batch)
        self.precision = resolve_precision(cfg.precision, policy, accelerator_device(cfg.accelerator))
        self.loss_scale = LossScale(self.precision == "fp16")  # fp16's gradients would flush to zero without it
        self.automatic_optimization = False  # several optimizer steps per sampled batch
        self.version = 0
        self.shuffle = torch.Generator().manual_seed(stream_seed(cfg.seed, SHUFFLE))
        self.history: list[dict[str, float]] = []
        self.skipped = 0  # batches without any advantage signal, skipped without an update
        self.last_step: StepRecord | None = None
        self.last_eval: dict | None = None
        self.evals: list[dict] = []  # every held-out evaluation of this process, with its policy version
        self.run_dir: str | None = None  # the run folder (lrl.runs), recorded in checkpoints
        self.forward_log: ForwardLog | None = (
            None  # the step's per-forward corrections (proximal not recompute)
        )

    # -- Lightning hooks and workarounds, each with its reason ----------------------------------------
    def on_fit_start(self) -> None:
        self.policy.train()  # Lightning warns, just before on_train_start, about modules left in eval mode
        # after a checkpoint's state is loaded: the source attaches to the weights (and starts its workers)
        self.source.setup(self.policy, self.version)

    def on_train_start(self) -> None:
        """The RL step runs without dropout: ``old_logp``, the sampler's log-probs and the loss must be one
        function of the weights. Lightning's evaluation loop restores each module's mode, so eval mode stays."""
        self.policy.eval()
        if (
            self.cfg.evaluation.eval_at_start and self.version == 0
        ):  # the starting policy's held-out score, at step 0
            self.heldout_evaluation()

    def configure_optimizers(self):
        update = self.cfg.update
        betas = (update.adam_beta1, 0.999)
        return torch.optim.Adam(self.policy.parameters(), lr=update.lr, betas=betas, eps=update.adam_eps)

    # -- one step ------------------------------------------------------------------------------------
    def training_step(self, deferred, batch_idx):
        opts = self.cfg.update
        version = self.version
        ranks = Ranks.of(self)
        batch = to_device(
            deferred.get(self.version), self.device
        )  # sampled here, after the previous weight sync
        where = f"step {version} (batch {int(batch['index'])})"
        clock = Stopwatch()
        weighting, mu, mask = self.cfg.weighting, batch["sample_logp"], batch["action_mask"]
        if opts.proximal == "recompute":  # pi_old scored first; the correction of the whole batch, once
            old_logp = self.score(batch)
            fixed = correct(old_logp, mu, mask, batch["advantage"], weighting)
            weights, dropped, self.forward_log = fixed.weights, fixed.dropped, None  # [B, T-1]
        else:  # no pi_old forward: each update forward corrects its own rows (lrl.proximal)
            old_logp, weights, dropped, self.forward_log = mu, mask, None, ForwardLog.start(batch)
        clock.lap("old_logp")
        plan = plan_update(batch, old_logp, weights, ranks, opts.minibatches, self.shuffle, where)
        guard = UpdateGuard(self.policy, self.optimizers().optimizer) if opts.max_step_kl else None
        # frozen: Adam with lr 0 moves nothing
        lr = 0.0 if opts.freeze_policy else learning_rate(opts, version, self.cfg.max_steps)
        updates = self.update(plan, ranks, lr)
        clock.lap("update")
        seen = None
        if self.forward_log is not None:  # the trainer's side of the mismatch, from the update's own forwards
            log = self.forward_log
            old_logp, weights, seen, dropped = log.logp, log.weights, log.seen, log.dropped
        shift = None
        if opts.step_kl:  # over the rows whose old_logp is the trainer's own
            shift = self.measure_shift(batch, old_logp, seen)
        clock.lap("shift")  # the step's KL, measured with one more forward pass
        control = {"train/lr": lr, "train/minibatches_done": len(updates or [])}
        if guard is not None:  # the whole step moved the policy too far on its own batch: take it back
            control["train/reverted"] = float(guard.check(shift["step_kl"], opts.max_step_kl))
        self.version += 1
        self.source.publish(self.policy, self.version)  # the weight sync
        clock.lap("sync")
        means, maxes = step_metrics(
            batch, old_logp, weights, updates, version, weighting, clock.laps, shift, control, dropped, seen
        )
        metrics = ranks.weighted_means(means, maxes)
        self.publish(StepRecord(version, batch, old_logp, weights, metrics, seen))

    def update(self, plan: UpdatePlan, ranks: Ranks, lr: float) -> list[dict] | None:
        """The step's minibatch updates (None: no advantage signal, nothing to learn), stopped early once the
        policy has moved past ``target_kl`` on the minibatch about to be used."""
        optimizer = self.optimizers()
        for group in optimizer.param_groups:
            group["lr"] = lr
        updates = None
        if plan.signal:
            updates = []
            for mb in plan.minibatches:
                stats = self.minibatch_update(mb, ranks)
                while stats is RETAKE:  # fp16: a gradient overflowed at the loss scale, now halved
                    stats = self.minibatch_update(mb, ranks)
                if stats is None:
                    break
                updates.append(stats)
        else:
            self.skipped += 1
        # one step through Lightning's optimizer wrapper per sampled batch, so that global_step counts batches
        # (the minibatches step the torch optimizer directly); with no gradient left, Adam changes nothing
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        return updates

    def minibatch_update(self, mb: Minibatch, ranks: Ranks) -> dict[str, torch.Tensor] | None:
        """One clipped update on this rank's rows of a minibatch -> its statistics (shares of the global mean),
        or None when the policy already moved past ``target_kl`` (the update is not taken).

        The rows go through the model in microbatches that fit the memory plan (one, for the built-in
        policies), each backward adding its share of the minibatch's per-token mean to the gradient. NaN/inf
        stops the step before the microbatch's backward; the KL target is checked on the whole minibatch before
        the optimizer steps, so a stopped minibatch changes no weight."""
        optimizer = self.optimizers()
        optimizer.zero_grad()
        parts = self.microbatches(mb, ranks)
        local_tokens = mb.action_mask.sum()
        share = ranks.loss_share(local_tokens, mb.global_tokens)
        st: dict[str, torch.Tensor] = {}
        kl = 0.0
        for rows in parts:
            loss, part_st, bad = self.microbatch_loss(mb, rows, local_tokens, share)
            checked = [*(float(v) for v in bad.values()), float(part_st["approx_kl"])]
            totals = ranks.all_reduce(torch.tensor(checked, dtype=torch.float64)).tolist()
            raise_if_nonfinite(bad, totals[: len(bad)], mb.where, applied=mb.index)
            kl += totals[-1]
            if len(parts) == 1 and self.past_target(mb, kl):
                return None  # KL(pi_old || pi) on this minibatch, before its update, is past the target
            for key, value in part_st.items():
                st[key] = st[key] + value if key in st else value
            self.manual_backward(self.loss_scale(loss))
        if len(parts) > 1 and self.past_target(mb, kl):
            optimizer.zero_grad()
            return None
        if not self.loss_scale.unscale(self.policy.parameters()):
            optimizer.zero_grad()
            return RETAKE
        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        grad_norm = torch.stack([g.detach().norm() for g in grads]).norm() if grads else torch.zeros(())
        if not torch.isfinite(grad_norm):  # the same on every rank: gradients are all-reduced
            raise NumericalError(
                f"non-finite gradient at {mb.where} (norm {grad_norm.item()}); " + not_applied(mb.index)
            )
        st["grad_norm"] = grad_norm.detach()
        clip = self.cfg.update.max_grad_norm
        self.clip_gradients(optimizer, gradient_clip_val=clip, gradient_clip_algorithm="norm")
        optimizer.optimizer.step()  # the torch optimizer itself; Lightning's counter is stepped once per batch
        return {k: v.detach() for k, v in st.items()}

    def past_target(self, mb: Minibatch, kl: float) -> bool:
        target = self.cfg.update.target_kl
        return target is not None and mb.index > 0 and kl > target

    def microbatch_loss(self, mb: Minibatch, rows: slice | None, local_tokens, share: float):
        """Loss of one microbatch (``rows`` of the minibatch; None: this rank holds none of it) -> the loss,
        its statistics and NaN/inf counts, scaled to their shares of the minibatch's global per-token mean."""
        opts = self.cfg.update
        if rows is not None:
            mask = mb.action_mask[rows]
            with autocast(self.precision, self.device):
                logp, ent = token_log_probs(
                    self.policy,
                    mb.ids[rows],
                    mb.attention_mask[rows],
                    self.cfg.sampling.temperature,
                    positions=mask.bool(),
                    entropy=True,
                )
            old, token_adv = self.proximal_and_advantage(mb, rows, logp, mask)
            loss, st = policy_loss(opts.loss, logp, old, token_adv, mask, opts.eps_low, opts.eps_high)
            entropy = (ent * mask).sum() / mask.sum().clamp(min=1.0)
            if opts.entropy_coef:  # a bonus on the entropy of the action positions (docs/stability.md)
                loss = loss - opts.entropy_coef * entropy
            st["entropy"] = entropy.detach()
            on = mask.bool()
            bad = {
                "logp (log pi)": nonfinite(logp[on]),
                "weights": nonfinite(token_adv[on]),
                "loss": nonfinite(loss),
            }
            part = 1.0 if rows == slice(None) else float(mask.sum() / local_tokens.clamp(min=1))
        else:  # this rank has no rows in the minibatch: a zero loss keeps the gradient all-reduce in step
            loss = sum(p.sum() for p in self.policy.parameters()) * 0.0
            st = {k: torch.zeros((), device=self.device) for k in ("clip_frac", "approx_kl", "entropy")}
            bad = {"logp (log pi)": 0, "weights": 0, "loss": 0}
            part = 1.0
        scale = share * part
        if scale != 1.0:  # this rank's (and microbatch's) share of the global per-token mean
            loss = loss * scale
            st = {k: v * scale for k, v in st.items()}
        st["loss"] = loss.detach()
        return loss, st, bad

    def proximal_and_advantage(self, mb: Minibatch, rows: slice, logp, mask):
        """log pi_prox and the per-token advantage w * A of a microbatch's rows: the step's own where pi_old was
        scored before the update; else from this forward (lrl.proximal), its correction kept for the metrics."""
        opts = self.cfg.update
        if self.forward_log is None:
            return mb.old_logp[rows], mb.token_adv[rows]
        mu = mb.sample_logp[rows]
        progress = (
            mb.index / mb.count
        )  # the share of the step's updates the weights took before this minibatch
        prox = proximal_logp(opts.proximal, None, logp, mu, mb.version[rows], self.version, progress)
        side = correction_side(opts.proximal, prox, logp)  # rollout: this forward's own log-probs against mu
        fixed = correct(side, mu, mask, mb.advantage[rows], self.cfg.weighting)
        self.forward_log.record(mb.rows[rows], side, fixed.weights, fixed.dropped, exact=mb.index == 0)
        return prox, mb.advantage[rows][:, None] * fixed.weights

    def microbatches(self, mb: Minibatch, ranks: Ranks) -> list[slice | None]:
        """The minibatch's rows in forwards that fit the memory plan: one slice of all rows without a plan or
        where they fit; every rank gets the same count (None where it has no rows), so DDP's backward calls stay
        in step."""
        tokens = self.memory.train_tokens if self.memory is not None else None
        n, width = mb.ids.shape[0], max(mb.ids.shape[1], 1)
        per = n if not tokens or n * width <= tokens else max(1, tokens // width)
        count = -(-n // per) if n else 1
        if ranks.world > 1:
            count = int(ranks.all_reduce(torch.tensor([float(count)], dtype=torch.float64), "max").item())
        if count == 1:
            return [slice(None)] if n else [None]
        size = -(-n // count)
        parts: list[slice | None] = [slice(i, min(i + size, n)) for i in range(0, n, size)]
        return parts + [None] * (count - len(parts))

    @torch.no_grad()
    def score(self, batch) -> torch.Tensor:
        """log pi_old of the batch's tokens: the trainer's weights and arithmetic, in forwards that fit
        (the action positions are the ones that count) -> [B, T-1]."""
        with autocast(self.precision, self.device):
            return scored_in_rows(
                self.policy,
                batch["ids"],
                batch["attention_mask"],
                self.cfg.sampling.temperature,
                positions=batch["action_mask"].bool(),
                max_tokens=self.memory.score_tokens if self.memory is not None else None,
            )

    @torch.no_grad()
    def measure_shift(self, batch, old_logp, seen=None) -> dict[str, float]:
        """How far the whole step moved the policy on its own batch, last minibatch included (lrl.stats)."""
        mask = batch["action_mask"] if seen is None else batch["action_mask"] * seen[:, None]
        return policy_shift(old_logp, self.score(batch), mask)

    def publish(self, record: StepRecord) -> None:
        """Keep the step's record for the callbacks, append it to the history, log its metrics."""
        self.last_step = record
        ledger = merged_ledger(Ranks.of(self), record.batch.get("ledger", {}))  # async: the episodes' ids
        index = int(record.batch["index"])
        if "tool_times" in record.batch:  # this rank's tool calls, each its own seconds (real tools)
            ledger = {**ledger, "env/tool_times": [round(t, 5) for t in record.batch["tool_times"]]}
        # time/end: wall clock at the step's end, from which a run's steps per second are measured
        self.history.append(
            {"step": record.version, "batch": index, **record.metrics, **ledger, "time/end": time.time()}
        )
        # straight to the loggers: Lightning's self.log would log a key again, with its old value, at every
        # later step that does not log it (a skipped step has no entropy or grad_norm), and a resumed run would
        # not; the step is the one Lightning gives the batch (callbacks log at it too)
        if self._trainer is not None:
            for logger in self.loggers:
                logger.log_metrics(
                    record.metrics, step=self.trainer.fit_loop.epoch_loop._batches_that_stepped
                )
        if (
            "train/reward" in record.metrics
        ):  # absent when every episode of the step failed in its environment
            self.log("reward", record.metrics["train/reward"], prog_bar=True, logger=False, batch_size=1)

    # -- checkpoints ---------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add what Lightning does not save: version, shuffle generator, history, sampler versions, RNGs."""
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        checkpoint["lrl"] = {
            "version": self.version,
            "skipped": self.skipped,
            "shuffle": self.shuffle.get_state(),
            "history": list(self.history),
            "weights": self.source.weights_state(),
            "rng": Ranks.of(self).gather_objects(rng),
            "config": self.cfg.to_dict(),
            "run_dir": self.run_dir,
            "loss_scale": self.loss_scale.scale,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["lrl"]
        self.version = state["version"]
        self.skipped = state["skipped"]
        self.shuffle.set_state(state["shuffle"])
        self.history = list(state["history"])
        self.loss_scale.scale = state.get("loss_scale", self.loss_scale.scale)  # older checkpoints have none
        self.source.load_weights_state(state["weights"])  # applied in on_fit_start, by the source's setup
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
        if progress.get("is_last_batch") and checkpoint.get("global_step", 0) < self.cfg.max_steps:
            progress["is_last_batch"] = False  # a finished run resumed with a larger --max-steps continues
        rng = state["rng"][self.global_rank if self._trainer is not None else 0]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])

    # -- held-out evaluation -------------------------------------------------------------------------
    def validation_step(self, batch, batch_idx):
        stats = self.heldout_evaluation()
        self.log("val/pass_rate", stats["pass_rate"], prog_bar=True, logger=False, batch_size=1)

    def heldout_evaluation(self) -> dict:
        """Evaluate the current policy on the held-out tasks; keep and log it at the policy version it measures."""
        cfg = self.cfg
        seed = stream_seed(cfg.seed, EVALUATION)
        with autocast(self.precision, self.device):  # the arithmetic the policy is trained and sampled in
            stats = heldout(self.policy, self.spec, cfg.evaluation, seed, cfg.sampling.temperature)
        self.last_eval = {"step": self.version, **stats}
        self.evals.append(self.last_eval)
        keys = ("pass_rate", *self.spec.metrics, "invalid")
        if self.logger is not None and self.trainer.is_global_zero:
            # stepped by the policy version, so the held-out point sits at the update count it measures
            self.logger.log_metrics({f"val/{k}": float(stats[k]) for k in keys}, step=self.version)
        return stats


RETAKE = object()  # minibatch_update's answer when fp16's loss scale overflowed: the minibatch is taken again


class Stopwatch:
    """Seconds between laps: ``laps["old_logp"]`` is the time from the previous lap (or creation) to it."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now


def merged_ledger(ranks: Ranks, own: dict) -> dict:
    """Every rank's ledger of the step as one: ids and per-group seconds concatenated in rank order, token counts
    per staleness summed. Every rank calls it (a collective under DDP), so every rank's history holds it all."""
    if not own or ranks.world == 1:  # sync mode has no ledger on any rank: no collective on the hot path
        return own
    parts = ranks.gather_objects(own)
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if key == "staleness_counts":
                sums = out.setdefault(key, [])
                sums.extend([0] * (len(value) - len(sums)))
                for k, c in enumerate(value):
                    sums[k] += c
            else:
                out.setdefault(key, []).extend(value)
    return out
