"""The trainer: a LightningModule that takes the decoupled update on batches from a behavior sampler.

One training step, read top to bottom in :meth:`OffPolicyModule.training_step`: pull the batch (sampled now, with
the sampler's current weights), score pi_old where the proximal policy needs it and turn pi_old/mu into behavior
weights (:meth:`OffPolicyModule.prepare`), take ``minibatches`` updates of the objective the run chose (proximal
policy, loss and aggregation: lrl.objective), publish the new weights to the rollout source, and publish the step's
record (:class:`StepRecord`, read by the callbacks) and metrics. ``global_step`` counts sampled batches, which is
also the policy version. The path of a batch is drawn in docs/architecture.md.

Each piece of work is done once: with one minibatch the update's forward is pi_old's (no separate pass,
:meth:`OffPolicyModule.fuses_old_logp`); on a model planned in microbatches rows of advantage 0 skip the update
(their tokens stay in the denominator) and a task's rows run their common prompt once (lrl.logprobs).
"""
from __future__ import annotations

import time

import lightning as L
import torch

from lrl.batch import to_device
from lrl.distributed import Ranks
from lrl.evaluation import heldout
from lrl.logprobs import prompt_lengths, scored_in_rows, token_log_probs
from lrl.metrics import step_metrics
from lrl.module_state import module_state, restore_module_state
from lrl.objective import Objective
from lrl.precision import LossScale, accelerator_device, autocast, resolve_precision
from lrl.stats import policy_shift
from lrl.step_data import RETAKE, Scored, StepRecord, Stopwatch, merged_ledger
from lrl.streams import EVALUATION, MONITORED, SHUFFLE, keyed, stream_seed
from lrl.update import (
    Minibatch,
    NumericalError,
    UpdateGuard,
    UpdatePlan,
    check_scored,
    entropy_scale,
    learning_rate,
    live_rows,
    microbatches,
    monitored_rows,
    not_applied,
    plan_update,
    raise_if_nonfinite,
)
from lrl.weights import correct, needs_batch

__all__ = ["OffPolicyModule", "StepRecord", "NumericalError"]


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
        # rows of advantage 0 skip the update, and a task's rows share one prompt forward, where a forward is what a
        # step costs (a model planned in microbatches); the built-in policies keep every row, so their published
        # seeded runs repeat bit for bit (a different batch shape rounds differently)
        self.skip_rows = memory is not None and memory.chunked
        self.precision = resolve_precision(cfg.policy.precision, policy, accelerator_device(cfg.run.accelerator))
        self.loss_scale = LossScale(self.precision == "fp16")  # fp16's small gradients would flush to zero
        self.objective = Objective(cfg)  # the chosen proximal policy, loss and aggregation, built once
        self.automatic_optimization = False  # several optimizer steps per sampled batch
        self.version = 0
        self.shuffle = torch.Generator().manual_seed(stream_seed(cfg.run.seed, SHUFFLE))
        self.history: list[dict[str, float]] = []
        self.skipped = 0  # batches without any advantage signal, skipped without an update
        self.last_step: StepRecord | None = None
        self.last_eval: dict | None = None
        self.evals: list[dict] = []  # every held-out evaluation of this process, with its policy version
        self.run_dir: str | None = None  # the run folder (lrl.runs), recorded in checkpoints

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
        # a model planned in microbatches steps Adam in one fused pass over its weights (on a CPU, the loop over
        # tensors took seconds a step for 135M parameters); the same update to fp32 rounding. The built-in policies
        # keep the loop, so that their published seeded runs repeat bit for bit
        fused = True if self.memory is not None and self.memory.chunked else None
        return torch.optim.Adam(
            self.policy.parameters(), lr=update.lr, betas=betas, eps=update.adam_eps, fused=fused
        )

    # -- one step ------------------------------------------------------------------------------------
    def training_step(self, deferred, batch_idx):
        opts, ranks, version = self.cfg.update, Ranks.of(self), self.version
        batch = to_device(deferred.get(self.version), self.device)  # sampled here, after the previous weight sync
        if opts.drop_truncated:  # DAPO's filter: an episode cut by its budget leaves the loss, denominators too
            batch = dict(batch, action_mask=batch["action_mask"] * (batch["truncated"] == 0)[:, None])
        clock = Stopwatch()
        plan, scored = self.prepare(batch, ranks, f"step {version} (batch {int(batch['index'])})")
        clock.lap("old_logp")
        guard = UpdateGuard(self.policy, self.optimizers().optimizer) if opts.max_step_kl else None
        # frozen: Adam with lr 0 moves nothing
        lr = 0.0 if opts.freeze_policy else learning_rate(opts, version, self.cfg.run.max_steps)
        updates = self.update(plan, ranks, lr, scored)
        clock.lap("update")
        shift = self.measure_shift(batch, scored.old_logp, scored.seen) if opts.step_kl else None
        clock.lap("shift")  # the step's KL, measured with one more forward pass
        control = {"train/lr": lr, "train/minibatches_done": len(updates or [])}
        if guard is not None:  # the whole step moved the policy too far on its own batch: take it back
            control["train/reverted"] = float(guard.check(shift["step_kl"], opts.max_step_kl))
        self.version += 1
        self.source.publish(self.policy, self.version)  # the weight sync
        clock.lap("sync")
        old_logp, weights, seen = scored.old_logp, scored.weights, scored.seen
        means, maxes = step_metrics(batch, old_logp, weights, updates, version, self.cfg.weighting, clock.laps,
                                    shift, control, scored.dropped, seen)  # fmt: skip
        self.publish(StepRecord(version, batch, old_logp, weights, ranks.weighted_means(means, maxes), seen))

    def prepare(self, batch, ranks: Ranks, where: str) -> tuple[UpdatePlan, Scored]:
        """The step's minibatches and what the update needs before its forwards: pi_old scored and the behavior
        weights made of it, for the rows the update's forward does not score itself (all of them, unless
        :meth:`fuses_old_logp`); without a pi_old of its own (the proximal policy scores none), nothing."""
        opts, weighting = self.cfg.update, self.cfg.weighting
        keep_all = not self.skip_rows or bool(opts.entropy_coef) or opts.target_kl is not None
        live = live_rows(batch, keep_all)
        mu, advantage, units = batch["sample_logp"], batch["advantage"], self.objective.units
        if not self.fuses_old_logp():
            scored = self.score(batch, None, entropy=bool(live.any()))
            fixed = correct(scored.old_logp, mu, batch["action_mask"], advantage, weighting)
            scored.weights, scored.dropped = fixed.weights, fixed.dropped
            plan = plan_update(batch, scored.old_logp, scored.weights, ranks, opts.minibatches, self.shuffle, where,
                               live, units=units)  # fmt: skip
            return plan, scored
        plan = plan_update(batch, None, None, ranks, opts.minibatches, self.shuffle, where, live, self.skip_rows, units)
        if not self.objective.proximal.scores_pi_old:  # rows no update forward runs stay out of the metrics
            return plan, Scored.unscored(mu)
        # the update's forward is pi_old's: score only rows it skips (a step without signal runs none), for the
        # metrics alone, and of those only the monitored subset
        skipped = ~live if plan.signal else torch.ones_like(live)
        seed = keyed(stream_seed(self.cfg.run.seed, MONITORED), self.version, ranks.rank)
        # step_kl measures the step's move on every row, against pi_old: then each is scored
        monitored = monitored_rows(skipped, None if opts.step_kl else opts.monitor_rows, seed)
        scored = self.score(batch, monitored, entropy=plan.signal)
        others = batch["action_mask"] * monitored[:, None]
        fixed = correct(scored.old_logp, mu, others, advantage, weighting)
        scored.weights, scored.dropped = fixed.weights, fixed.dropped
        if not bool((monitored == skipped).all()):  # some rows that do not train stay unscored: not seen
            scored.seen = monitored.clone()
            scored.entropy_scale = entropy_scale(batch["action_mask"], skipped, monitored)
        check_scored(scored.old_logp, scored.weights, others.bool(), ranks, where)
        return plan, scored

    def fuses_old_logp(self) -> bool:
        """Whether pi_prox and the weights come from the update's own forward: always without a pi_old pass
        (proximal rollout, interpolate); with recompute where one minibatch on the current weights is pi_old's
        forward and each row's weights read that row alone (one reading the whole batch needs pi_old first)."""
        one = self.cfg.update.minibatches == 1 and not needs_batch(self.cfg.weighting)
        return not self.objective.proximal.scores_pi_old or one

    def update(self, plan: UpdatePlan, ranks: Ranks, lr: float, scored: Scored) -> list[dict] | None:
        """The step's minibatch updates (None: no advantage signal, nothing to learn), stopped early once the
        policy has moved past ``target_kl`` on the minibatch about to be used."""
        optimizer = self.optimizers()
        for group in optimizer.param_groups:
            group["lr"] = lr
        updates = None
        if plan.signal:
            updates = []
            for mb in plan.minibatches:
                stats = self.minibatch_update(mb, ranks, scored)
                while stats is RETAKE:  # fp16: a gradient overflowed at the loss scale, now halved
                    stats = self.minibatch_update(mb, ranks, scored)
                if stats is None:
                    break
                updates.append(stats)
        moved = [u.pop("moved") for u in updates or []]
        if not any(m > 0 for m in moved):  # no token carried an advantage
            updates = None
            self.skipped += 1
        # one step through Lightning's optimizer wrapper per sampled batch, so that global_step counts batches
        # (the minibatches step the torch optimizer directly); with no gradient left, Adam changes nothing
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()
        return updates

    def minibatch_update(self, mb: Minibatch, ranks: Ranks, scored: Scored) -> dict[str, torch.Tensor] | None:
        """One clipped update on this rank's rows of a minibatch -> its statistics (shares of the global mean),
        or None when the policy already moved past ``target_kl`` (the update is not taken).

        The rows go through the model in microbatches that fit the memory plan (one, for the built-in
        policies), each backward adding its share of the minibatch's per-token mean to the gradient. NaN/inf
        stops the step before the microbatch's backward; the KL target is checked on the whole minibatch before
        the optimizer steps, so a stopped minibatch changes no weight. Where pi_old is made by this forward
        (``mb.old_logp`` None) a minibatch in which no token carries an advantage takes no optimizer step."""
        optimizer = self.optimizers()
        optimizer.zero_grad()
        parts = microbatches(mb, self.memory.train_tokens if self.memory is not None else None, ranks)
        local_tokens = mb.local_tokens
        share = ranks.loss_share(local_tokens, mb.global_tokens)
        st: dict[str, torch.Tensor] = {}
        kl = 0.0
        moved = 0.0
        for rows in parts:
            loss, part_st, bad, carried = self.microbatch_loss(mb, rows, scored)
            checked = [*(float(v) for v in bad.values()), float(part_st["approx_kl"]), carried]
            totals = ranks.all_reduce(torch.tensor(checked, dtype=torch.float64)).tolist()
            raise_if_nonfinite(bad, totals[: len(bad)], mb.where, applied=mb.index)
            kl += totals[-2]
            moved += totals[-1]
            if len(parts) == 1 and self.past_target(mb, kl):
                return None  # KL(pi_old || pi) on this minibatch, before its update, is past the target
            for key, value in part_st.items():
                st[key] = st[key] + value if key in st else value
            self.manual_backward(self.loss_scale(loss))
        if len(parts) > 1 and self.past_target(mb, kl):
            optimizer.zero_grad()
            return None
        if scored.entropy is not None and "entropy" in st:  # the rows that stayed out, at pi_old (their monitored
            # subset's entropy scaled up to all of their tokens where only a subset was scored)
            others = scored.entropy[mb.others].sum() * scored.entropy_scale / local_tokens.clamp(min=1) * share
            st["entropy"] = st["entropy"] + others.to(st["entropy"])
        st["moved"] = torch.tensor(moved)
        if mb.old_logp is None and moved == 0:  # every weight of the minibatch turned out 0: nothing to step
            optimizer.zero_grad()
            return {k: v.detach() for k, v in st.items()}
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

    def microbatch_loss(self, mb: Minibatch, rows: slice | None, scored: Scored):
        """Loss of one microbatch (``rows`` of the minibatch; None: this rank holds none of it), from the update's
        forward, as :class:`lrl.objective.Objective` makes it -> the loss and its statistics, scaled to their shares
        of the minibatch's, the NaN/inf counts, and the count of its tokens that carry an advantage."""
        if rows is None:
            return self.objective.no_rows(mb, self.policy.parameters(), self.device)
        mask = mb.action_mask[rows]
        with autocast(self.precision, self.device):
            logp, ent = token_log_probs(
                self.policy,
                mb.ids[rows],
                mb.attention_mask[rows],
                self.cfg.sampling.temperature,
                positions=mask.bool(),
                entropy=True,
                checkpoint_head=self.checkpoint_head(mask),
                prefix=prompt_lengths(mask) if self.skip_rows else None,
                entropy_grad=bool(self.cfg.update.entropy_coef),  # else the entropy is the metric alone
            )
        return self.objective.rows_loss(mb, rows, logp, ent, scored, Ranks.of(self), self.version)

    def checkpoint_head(self, mask: torch.Tensor) -> bool:
        """Whether the LM head recomputes its chunks in the backward pass: only where the memory plan says the
        logits of a forward's action tokens do not fit (without a plan: never)."""
        if self.memory is None:
            return False
        return not self.memory.logits_fit(int(mask.sum()))

    @torch.no_grad()
    def score(self, batch, rows: torch.Tensor | None = None, entropy: bool = False) -> Scored:
        """log pi_old of the batch's tokens (of ``rows`` only, a [B] bool; 0 elsewhere, for the update to fill):
        the trainer's weights and arithmetic, in forwards that fit (the action positions are the ones that
        count) -> :class:`Scored` (and the entropies of the same positions, with ``entropy``)."""
        positions = batch["action_mask"].bool()
        out = Scored(positions.new_zeros(positions.shape, dtype=torch.float32))
        if entropy:
            out.entropy = torch.zeros_like(out.old_logp)
        index = torch.arange(len(positions), device=positions.device)
        index = index if rows is None else index[rows.to(positions.device)]
        if not len(index):
            return out
        width = int(batch["attention_mask"][index].sum(-1).max())  # right padding no row of them uses is cut
        with autocast(self.precision, self.device):
            scores = scored_in_rows(
                self.policy,
                batch["ids"][index, :width],
                batch["attention_mask"][index, :width],
                self.cfg.sampling.temperature,
                positions=positions[index, : width - 1],
                max_tokens=self.memory.score_tokens if self.memory is not None else None,
                entropy=entropy,
                prefix=prompt_lengths(positions[index, : width - 1]) if self.skip_rows else None,
            )
        logp, ent = scores if entropy else (scores, None)
        on = positions[index, : width - 1]
        out.old_logp[index, : width - 1] = torch.where(on, logp, 0.0)
        if entropy:
            out.entropy[index, : width - 1] = torch.where(on, ent, 0.0)
        return out

    @torch.no_grad()
    def measure_shift(self, batch, old_logp, seen=None) -> dict[str, float]:
        """How far the whole step moved the policy on its own batch, last minibatch included (lrl.stats), over the
        rows whose old_logp is pi_old (`seen`, None: all)."""
        mask = batch["action_mask"] if seen is None else batch["action_mask"] * seen[:, None]
        return policy_shift(old_logp, self.score(batch).old_logp, mask)

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
        """Add what Lightning does not save (lrl.module_state)."""
        checkpoint["lrl"] = module_state(self)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        restore_module_state(self, checkpoint)

    # -- held-out evaluation -------------------------------------------------------------------------
    def validation_step(self, batch, batch_idx):
        stats = self.heldout_evaluation()
        self.log("val/pass_rate", stats["pass_rate"], prog_bar=True, logger=False, batch_size=1)

    def heldout_evaluation(self) -> dict:
        """Evaluate the current policy on the held-out tasks; keep and log it at the policy version it measures."""
        cfg = self.cfg
        seed = stream_seed(cfg.run.seed, EVALUATION)
        with autocast(self.precision, self.device):  # the arithmetic the policy is trained and sampled in
            stats = heldout(self.policy, self.spec, cfg.evaluation, seed, cfg.sampling.temperature)
        self.last_eval = {"step": self.version, **stats}
        self.evals.append(self.last_eval)
        keys = ("pass_rate", *self.spec.metrics, "invalid")
        if self.logger is not None and self.trainer.is_global_zero:
            # stepped by the policy version, so the held-out point sits at the update count it measures
            self.logger.log_metrics({f"val/{k}": float(stats[k]) for k in keys}, step=self.version)
        return stats
