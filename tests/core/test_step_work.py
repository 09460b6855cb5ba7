"""A step does each piece of work once, and the gradient is the one it always was.

pi_old taken from the update's own forward (one minibatch on the trainer's current weights) and rows whose
advantage is 0 left out of the forward and backward must give the gradient that scoring the batch apart and
running every row gives: checked against a reference written out here, on a fixed batch, in fp32.
"""

import copy

import pytest
import torch
from conftest import quick_cfg

from lrl.logprobs import token_log_probs
from lrl.losses import clipped_policy_loss
from lrl.registry import CORRECTIONS
from lrl.run import build_run, fit
from lrl.weights import register_correction, tis_weights


@register_correction("tis_whole_batch", uses=("cap",))
def _tis_whole_batch(logp_trainer, logp_sampler, mask, options):
    """token TIS, registered without per_row: the step scores the whole batch before its update"""
    return tis_weights(logp_trainer, logp_sampler, mask, options.cap)


def fixed_batch(run, zero_rows):
    """One sampled batch with advantages set by hand: 0 on `zero_rows`, mixed signs elsewhere."""
    run.source.setup(run.policy, 0)
    batch = run.source.next_batch(0)
    gen = torch.Generator().manual_seed(3)
    adv = torch.randn(len(batch["ids"]), generator=gen)
    adv[zero_rows] = 0.0
    batch["advantage"] = adv
    return batch


def reference_gradient(policy, batch, cfg):
    """The gradient of the decoupled clipped loss over every row, pi_old scored apart, TIS at the cap."""
    model = copy.deepcopy(policy).eval()
    mask = batch["action_mask"]
    with torch.no_grad():
        old = token_log_probs(model, batch["ids"], batch["attention_mask"], 1.0, positions=mask.bool())
    weights = tis_weights(old, batch["sample_logp"], mask, cfg.cap)
    logp = token_log_probs(model, batch["ids"], batch["attention_mask"], 1.0, positions=mask.bool())
    loss, _ = clipped_policy_loss(
        logp, old, batch["advantage"][:, None] * weights, mask, cfg.eps_low, cfg.eps_high
    )
    loss.backward()
    return [p.grad.clone() for p in model.parameters()], old, weights


def step_gradient(run, batch, monkeypatch):
    """The gradient the module's step hands to Adam on `batch` (its one minibatch), and the step's record."""
    seen = []
    original = torch.optim.Adam.step

    def record(self, *args, **kwargs):
        if not seen and any(p.grad is not None for g in self.param_groups for p in g["params"]):
            seen.append([p.grad.clone() for g in self.param_groups for p in g["params"]])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", record)
    monkeypatch.setattr(run.source, "next_batch", lambda version=0: batch)
    monkeypatch.setattr(run.module, "heldout_evaluation", lambda: {"pass_rate": 0.0})  # the step alone
    fit(run)
    return seen[0], run.module.last_step


def step_with_forwards(run, batch, monkeypatch):
    """step_gradient, and the rows of every forward of the policy during the step."""
    forwards = []
    hook = run.policy.register_forward_hook(
        lambda m, args, kwargs, out: forwards.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        got, record = step_gradient(run, batch, monkeypatch)
    finally:
        hook.remove()
    return got, record, forwards


@pytest.mark.parametrize("correction", ["tis", "tis_whole_batch"])
def test_the_step_gradient_equals_scoring_apart_and_every_row(format_policy, monkeypatch, correction):
    """tis fuses pi_old into the update's forward; tis_whole_batch (not per_row) scores apart: both leave the
    zero-advantage rows out, and both must give the reference gradient of all rows."""
    cfg = quick_cfg(max_steps=1, minibatches=1, correction=correction, max_grad_norm=1e9, max_step_kl=None,
                    step_kl=False, eval_at_start=False)  # fmt: skip
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy))
    run.module.skip_rows = True  # as for a model planned in microbatches (the built-in policy runs every row)
    assert run.module.fuses_old_logp() == (correction == "tis")
    batch = fixed_batch(run, zero_rows=[0, 3, 5, 6, 9])
    want, old, weights = reference_gradient(format_policy, batch, cfg)
    got, record, forwards = step_with_forwards(run, batch, monkeypatch)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    on = batch["action_mask"].bool()
    torch.testing.assert_close(record.old_logp[on], old[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(record.weights[on], weights[on], rtol=0, atol=1e-5)
    # the zero-advantage rows never went through a forward with gradients: no forward saw every row twice
    rows = len(batch["ids"])
    assert sum(n == rows for n in forwards) == (0 if correction == "tis" else 1), forwards
    assert sum(forwards) == rows + (0 if correction == "tis" else 11), forwards  # 11 rows have an advantage


def test_scoring_a_subset_of_the_rows_that_do_not_train_changes_no_gradient(format_policy, monkeypatch):
    """monitor_rows: 4 of the 12 zero-advantage rows are scored for the metrics; the gradient is every row's, pi_old
    of the rows seen is the reference's, and the metrics stand on the rows seen (those that trained, and the 4)."""
    cfg = quick_cfg(max_steps=1, minibatches=1, correction="tis", max_grad_norm=1e9, max_step_kl=None,
                    step_kl=False, eval_at_start=False, monitor_rows=4)  # fmt: skip
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy))
    run.module.skip_rows = True
    zero = [0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 14]
    batch = fixed_batch(run, zero_rows=zero)
    want, old, weights = reference_gradient(format_policy, batch, cfg)
    got, record, forwards = step_with_forwards(run, batch, monkeypatch)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    rows = len(batch["ids"])
    assert sorted(forwards) == sorted([4, rows - len(zero)]), forwards  # 4 rows scored apart, the rest trained
    live = torch.ones(rows, dtype=torch.bool)
    live[zero] = False
    assert bool(record.seen[live].all()) and int(record.seen[~live].sum()) == 4
    on = batch["action_mask"].bool() & record.seen[:, None]
    torch.testing.assert_close(record.old_logp[on], old[on], rtol=0, atol=1e-5)
    torch.testing.assert_close(record.weights[on], weights[on], rtol=0, atol=1e-5)
    assert run.module.history[0]["mismatch/rows_share"] == pytest.approx((rows - len(zero) + 4) / rows)


def test_monitored_rows_draw_the_count_asked_from_the_candidates_alone():
    from lrl.update import entropy_scale, monitored_rows

    candidates = torch.tensor([True, False, True, True, False, True, True])
    assert torch.equal(monitored_rows(candidates, None, 0), candidates)
    assert torch.equal(monitored_rows(candidates, 9, 0), candidates)
    picked = monitored_rows(candidates, 2, 0)
    assert int(picked.sum()) == 2 and not bool((picked & ~candidates).any())
    assert torch.equal(picked, monitored_rows(candidates, 2, 0))  # the seed decides
    assert int(monitored_rows(candidates, 0, 0).sum()) == 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0], [1, 0, 0]])
    seen = torch.tensor([True, False, False, False, False, False, True])
    assert entropy_scale(mask, candidates, seen) == pytest.approx((2 + 3 + 1 + 2 + 1) / (2 + 1))
    assert entropy_scale(mask, candidates, torch.zeros(7, dtype=torch.bool)) == 0.0


@pytest.mark.parametrize("monitor_rows", [None, 5])
def test_a_fused_step_whose_rows_all_have_zero_advantage_is_skipped(format_policy, monkeypatch, monitor_rows):
    cfg = quick_cfg(max_steps=1, minibatches=1, correction="tis", max_step_kl=None, step_kl=False,
                    eval_at_start=False, monitor_rows=monitor_rows)  # fmt: skip
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy))
    run.module.skip_rows = True
    batch = fixed_batch(run, zero_rows=list(range(16)))
    before = [p.detach().clone() for p in run.policy.parameters()]
    monkeypatch.setattr(run.source, "next_batch", lambda version=0: batch)
    fit(run)
    assert run.module.skipped == 1
    assert run.module.history[0]["train/skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))
    on = batch["action_mask"].bool()
    record = run.module.last_step
    rows = on.any(-1)
    if monitor_rows is None:
        assert record.seen is None and record.old_logp[on].ne(0).all()  # every row was scored for the metrics
        assert run.module.history[0]["mismatch/rows_share"] == 1.0
    else:  # 5 rows drawn from those with action tokens were scored, the metrics stand on them alone
        assert int(record.seen.sum()) == 5 and bool(rows[record.seen].all())
        assert record.old_logp[on & record.seen[:, None]].ne(0).all()
        assert record.old_logp[~record.seen].eq(0).all()
        assert run.module.history[0]["mismatch/rows_share"] == pytest.approx(5 / int(rows.sum()))


def test_registered_builtin_corrections_say_they_are_per_row():
    assert all(CORRECTIONS.get(name).per_row for name in ("none", "tis", "mis"))
    assert not CORRECTIONS.get("tis_whole_batch").per_row
