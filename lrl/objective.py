"""The update's objective: the three registered parts a run chooses (``--proximal``, ``--loss``, ``--aggregation``),
built once, and the loss of a microbatch's rows from the update's forward.

For the rows of one microbatch, given their log-probs from the update's forward:

1. pi_prox and the behavior weights: from the step's scored pi_old, or, where the update's forward gives them
   (lrl.module's ``fuses_old_logp``), from this forward with the proximal policy (lrl.proximal), the correction
   comparing its trainer side with mu (lrl.weights);
2. each action token's term and the statistics, by the loss (lrl.losses), with the per-token advantage ``w * A``;
3. the terms' numerator over the aggregation's units (lrl.aggregations), and its share of the minibatch's loss:
   units of this microbatch / units of the minibatch on this rank, times this rank's share over all ranks, so that
   any split into microbatches and ranks gives one minibatch's loss. The statistics are token means, shared by tokens.

A step reads the parts' traits, never their names: whether pi_old is scored (``ProximalTraits.scores_pi_old``), and
the rules on their combinations (lrl.config_rules) read what each declares.
"""

from __future__ import annotations

import torch

from lrl.distributed import Ranks
from lrl.losses import LOSS_STATS
from lrl.proximal import forward_correction, proximal_traits
from lrl.registry import AGGREGATIONS, LOSSES, supply
from lrl.update import Minibatch, nonfinite


class Objective:
    """The chosen proximal policy's traits, loss and aggregation of a run (`cfg`), built once."""

    def __init__(self, cfg):
        update = cfg.update
        self.cfg = cfg
        self.proximal = proximal_traits(update.proximal)
        self.loss = supply(LOSSES[update.loss].factory, cfg)
        self.aggregation = supply(AGGREGATIONS[update.aggregation].factory, cfg)

    def units(self, mask: torch.Tensor) -> torch.Tensor:
        """The aggregation's denominator of rows: [b, T] -> []."""
        return self.aggregation.units(mask)

    def rows_loss(self, mb: Minibatch, rows: slice, logp, ent, scored, ranks: Ranks, version: int):
        """The loss of the microbatch ``rows`` of `mb` from its forward's log-probs `logp` and entropies `ent` ->
        (its share of the minibatch's loss, statistics, NaN/inf counts, tokens that carry an advantage). Where
        ``mb.old_logp`` is None, pi_prox and the weights come from this forward, and are written into `scored`."""
        opts, mask = self.cfg.update, mb.action_mask[rows]
        bad = {"logp (log pi)": nonfinite(logp[mask.bool()])}
        if mb.old_logp is None:  # pi_prox and the weights from this forward (pi_old's, with recompute)
            old_logp, side, fixed = forward_correction(opts, self.cfg.weighting, mb, rows, logp, version)
            weights, token_adv = fixed.weights, mb.advantage[rows, None] * fixed.weights
            scored.fill(mb.rows[rows], side, weights, fixed.dropped, exact=mb.index == 0)
            bad = {"old_logp (log pi_old)": nonfinite(old_logp[mask.bool()]), "weights": nonfinite(weights[mask.bool()])}
        else:
            old_logp, token_adv = mb.old_logp[rows], mb.token_adv[rows]
        terms, st = self.loss(logp, old_logp, token_adv, mask)
        units = self.units(mask)
        loss = self.aggregation.numerator(terms, mask) / units.clamp(min=1.0)
        entropy = (ent * mask).sum() / mask.sum().clamp(min=1.0)
        if opts.entropy_coef:  # a bonus on the entropy of the action positions (docs/stability.md)
            loss = loss - opts.entropy_coef * entropy
        st["entropy"] = entropy.detach()
        bad["loss"] = nonfinite(loss)
        # the statistics are token means: their share of the minibatch's is by tokens; the loss's by its units
        tokens = mb.local_tokens
        scale = ranks.loss_share(tokens, mb.global_tokens) * float(mask.sum() / tokens.clamp(min=1))
        local = mb.local_units if mb.local_units is not None else tokens
        whole = mb.global_units if mb.global_units is not None else mb.global_tokens
        share = 1.0 if self.aggregation.per_rank else ranks.loss_share(local, whole)
        loss_scale = share * float(units / local.clamp(min=1))
        if loss_scale != 1.0:
            loss = loss * loss_scale
        if scale != 1.0:
            st = {k: v * scale for k, v in st.items()}
        st["loss"] = loss.detach()
        return loss, st, bad, float((token_adv * mask).ne(0).sum())

    def no_rows(self, mb: Minibatch, parameters, device):
        """A rank that holds none of the microbatch's rows: a zero loss keeps the gradient all-reduce in step."""
        loss = sum(p.sum() for p in parameters) * 0.0
        st = {k: torch.zeros((), device=device) for k in (*LOSS_STATS, "entropy")}
        bad = {"logp (log pi)": 0, "loss": 0}
        if mb.old_logp is None:
            bad = {"old_logp (log pi_old)": 0, "weights": 0, "loss": 0}
        st["loss"] = loss.detach()
        return loss, st, bad, 0.0
