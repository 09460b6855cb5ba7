"""The proximal policy, the loss and the masks in Lightning runs of the small policy: with one minibatch, bypass and
interpolation train exactly as the recomputed pi_old does where they must; every new choice trains, finite, and
logs what it dropped; an asynchronous run with partial rollouts logs the episodes that span a weight update."""

import copy

import pytest
import torch
from conftest import quick_cfg

from lrl.run import build_run, fit

LAGGED = dict(sampler="lagged", lag=1, minibatches=1, max_steps=3, eval_at_start=False)


def trained(policy, **kw):
    run = build_run(quick_cfg(**kw), logger=False, policy=copy.deepcopy(policy))
    before = [p.detach().clone() for p in run.policy.parameters()]
    fit(run)
    after = [p.detach().clone() for p in run.policy.parameters()]
    return run, before, after


def same_weights(a, b, atol=1e-6) -> bool:
    return all(torch.allclose(x, y, atol=atol, rtol=0) for x, y in zip(a, b))


def test_with_one_minibatch_interpolation_is_the_recomputed_pi_old(format_policy):
    """At the first minibatch the update's weights are pi_old's, so the interpolated pi_prox is pi_old itself."""
    _, start, recomputed = trained(format_policy, correction="tis", **LAGGED)
    run, _, interpolated = trained(format_policy, correction="tis", proximal="interpolate", **LAGGED)
    assert not same_weights(start, recomputed)
    assert same_weights(recomputed, interpolated)
    assert run.module.history[-1]["staleness/token_max"] == 1  # mu really was one update old


def test_with_one_minibatch_bypass_pg_weights_what_recompute_pg_weights(format_policy):
    """pg's weights compare the update forward's own log-probs with mu under rollout, pi_old under recompute: the
    same numbers when the forward runs on pi_old's weights."""
    _, _, recomputed = trained(format_policy, loss="pg", correction="tis", **LAGGED)
    _, _, bypass = trained(format_policy, loss="pg", proximal="rollout", correction="tis", **LAGGED)
    assert same_weights(recomputed, bypass)


def test_bypass_clips_against_mu_not_pi_old(format_policy):
    _, _, recomputed = trained(format_policy, **LAGGED)
    run, _, bypass = trained(format_policy, proximal="rollout", **LAGGED)
    assert not same_weights(recomputed, bypass)  # the clipped ratio is pi / mu, and mu is one update old
    history = run.module.history
    assert all(h["mismatch/abs_mean"] > 0 for h in history[1:])  # measured from the update's own forwards


CHOICES = {
    "pg, token TIS": dict(loss="pg", correction="tis"),
    "cispo": dict(loss="cispo", correction="tis"),
    "bypass pg, sequence TIS": dict(loss="pg", proximal="rollout", correction="tis", level="sequence"),
    "bypass cispo, masks": dict(
        loss="cispo", proximal="rollout", masks=["kl", "opsm"], kl_threshold=0.001, opsm_threshold=0.01
    ),
    "interpolate, two minibatches": dict(proximal="interpolate", correction="tis", minibatches=2),
    "kl mask k3 token": dict(masks=["kl"], kl_level="token", kl_threshold=0.001),
    "kl mask k2 seq_max": dict(masks=["kl"], kl_estimator="k2", kl_level="seq_max", kl_threshold=0.01),
    "kl mask k1 seq_sum": dict(masks=["kl"], kl_estimator="k1", kl_level="seq_sum", kl_threshold=0.05),
    "opsm": dict(masks=["opsm"], opsm_threshold=0.01),
    "m2po, normalised TIS": dict(masks=["m2po"], m2_threshold=0.001, correction="tis", normalize=True),
}


@pytest.mark.parametrize("name", list(CHOICES))
def test_every_new_choice_trains_and_logs_what_it_dropped(format_policy, name, monkeypatch):
    from lrl.module import OffPolicyModule

    # no step KL: its forward after the update is the only other caller of score
    kw = {
        **dict(
            sampler="lagged",
            lag=2,
            max_steps=4,
            eval_at_start=False,
            lr=3e-3,
            step_kl=False,
            max_step_kl=None,
        ),
        **CHOICES[name],
    }
    scored = []  # the rows of every pi_old forward of the run (None: the whole batch)
    score = OffPolicyModule.score

    def counted(self, batch, rows=None, entropy=False):
        scored.append(rows)
        return score(self, batch, rows, entropy)

    monkeypatch.setattr(OffPolicyModule, "score", counted)
    run, start, end = trained(format_policy, **kw)
    history = run.module.history
    assert not same_weights(start, end)
    for h in history:
        assert all(torch.isfinite(torch.tensor(v)) for k, v in h.items() if k.startswith("train/"))
    for mask in kw.get("masks", []):
        late = [h for h in history if f"offpolicy/dropped_tokens/{mask}" in h]
        assert late, f"no step logged what {mask} dropped"
        assert all(0 <= h[f"offpolicy/dropped_tokens/{mask}"] <= 1 for h in late)
        assert any(h[f"offpolicy/dropped_tokens/{mask}"] > 0 for h in late), mask  # the thresholds are tight
    if kw.get("proximal", "recompute") != "recompute":
        assert scored == []  # no pi_old forward: nothing is scored
    else:
        assert scored  # the counter sees the pi_old forwards where there are some


@pytest.mark.early
def test_an_async_run_with_partial_rollouts_logs_the_episodes_that_span_a_weight_update(format_policy):
    cfg = quick_cfg(
        pipeline="async",
        max_steps=4,
        tasks_per_step=4,
        episodes_per_task=4,
        eval_at_start=False,
        threads=1,
        max_staleness=2,
        deterministic=True,
        partial_rollouts="interrupt",
        switch_tokens=1,
    )  # fmt: skip  (a batch two versions behind switches to the next version after every decode step)
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    history = run.module.history
    for h in history:
        assert 0 <= h["staleness/multi_version_episodes"] <= 1
        # the trainer's count, from the tokens' version tags, is the pipeline's own count of partial episodes
        assert h["staleness/multi_version_episodes"] == pytest.approx(h["pipeline/partial"])
    spanning = [h for h in history if h["staleness/multi_version_episodes"] > 0]
    assert spanning, "no episode spanned a weight update: the test proves nothing"
    for h in spanning:
        assert h["staleness/multi_version_tokens"] > 0
        assert h["mismatch/multi_version_abs_mean"] >= 0 and "mismatch/multi_version_kl_k3" in h
