"""The policy losses (pg, CISPO), the proximal policy's interpolation, the length trap of every sequence-level rule,
and the split of the mismatch by weight versions, each against a reference written here by hand."""

import math

import pytest
import torch

import lrl
from lrl.config import Config
from lrl.losses import cispo_policy_loss, clipped_policy_loss, pg_policy_loss, policy_loss
from lrl.masks import divergence, kl_keep, opsm_keep
from lrl.proximal import (
    correction_side,
    interpolated_logp,
    interpolation_weight,
    proximal_logp,
    proximal_traits,
)
from lrl.stats import multi_version_episodes, version_split
from lrl.weights import correct, normalize_weights

LOGP = [[-0.5, -1.0, -2.0, -0.1], [-3.0, -0.2, -0.7, -1.1]]
OLD = [[-0.6, -0.9, -2.5, -0.1], [-1.0, -0.2, -0.8, -5.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
ADV = [[0.5, 0.5, 0.5, 0.5], [-1.0, -1.0, -1.0, -1.0]]  # w * A per token


def leaf():
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    args = [torch.tensor(x, dtype=torch.float64) for x in (OLD, ADV, MASK)]
    return logp, *args


def test_pg_gradient_is_w_times_a_per_token_over_the_action_count():
    logp, old, adv, mask = leaf()
    loss, stats = pg_policy_loss(logp, old, adv, mask)
    loss.backward()
    n = 7  # action tokens
    for b in range(2):
        for t in range(4):
            want = -ADV[b][t] / n if MASK[b][t] else 0.0
            assert logp.grad[b, t].item() == pytest.approx(want, abs=1e-15)
    value = -sum(ADV[b][t] * LOGP[b][t] for b in range(2) for t in range(4) if MASK[b][t]) / n
    assert loss.item() == pytest.approx(value)
    assert stats["clip_frac"].item() == 0.0


def test_cispo_truncates_the_ratio_and_keeps_every_tokens_gradient():
    logp, old, adv, mask = leaf()
    eps_high = 0.28
    loss, stats = cispo_policy_loss(logp, old, adv, mask, eps_high)
    loss.backward()
    n, truncated = 7, 0
    for b in range(2):
        for t in range(4):
            if not MASK[b][t]:
                assert logp.grad[b, t].item() == 0.0
                continue
            ratio = math.exp(LOGP[b][t] - OLD[b][t])
            coef = min(ratio, 1 + eps_high)
            truncated += ratio > 1 + eps_high
            assert logp.grad[b, t].item() == pytest.approx(-coef * ADV[b][t] / n, rel=1e-12)
            assert logp.grad[b, t].item() != 0.0  # clipped's min would zero some of these; CISPO zeroes none
    assert stats["clip_frac"].item() == pytest.approx(truncated / n)
    # the same tokens under the clipped loss: some lose their gradient (past the clip, on the side the min picks)
    logp2, old2, adv2, mask2 = leaf()
    clipped, _ = clipped_policy_loss(logp2, old2, adv2, mask2, 0.2, eps_high)
    clipped.backward()
    assert (logp2.grad[mask2.bool()] == 0).any()


def test_cispo_is_finite_at_any_log_ratio():
    logp = torch.tensor([[400.0, -400.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    loss, stats = cispo_policy_loss(logp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), 0.28)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0].item() == pytest.approx(-1.28 / 2)


@pytest.mark.parametrize("dual_clip", [0.0, 3.0])
def test_the_clipped_loss_is_finite_at_any_log_ratio(dual_clip):
    """Log-ratios of +-400 nats on both signs of the advantage (past what float32 exponentiates): the loss and every
    gradient are finite. Past the bound no token has a gradient: the A > 0 token at +400 and the A < 0 one at -400
    are clipped, the A > 0 one at -400 costs -e^-20 A, the A < 0 one at +400 costs e^20 |A| (C |A| under the dual
    clip); the token at ratio 1 keeps its gradient -A / n."""
    logp = torch.tensor([[400.0, -400.0, 400.0, -400.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    loss, stats = clipped_policy_loss(logp, torch.zeros(1, 5), adv, torch.ones(1, 5), 0.2, 0.28, dual_clip)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    top = dual_clip or math.exp(20.0)
    assert loss.item() == pytest.approx((-1.28 - math.exp(-20.0) + top + 0.8 - 1.0) / 5, rel=1e-6)
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, 0.0, 0.0, -1 / 5], rel=1e-6)
    assert all(torch.isfinite(v) for v in stats.values())


def test_at_a_ratio_of_one_the_three_losses_take_the_same_gradient():
    """One minibatch under recompute scores pi_prox with the update's own forward (rho = 1 on every token): there
    the clipped, pg and CISPO losses differ in value but not in gradient, w A / n each, so a run that changes only
    --loss takes the same update (up to rounding)."""
    grads = {}
    for kind in ("clipped", "pg", "cispo"):
        logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
        adv, mask = (torch.tensor(x, dtype=torch.float64) for x in (ADV, MASK))
        loss, _ = policy_loss(Config(loss=kind).update, logp, logp.detach(), adv, mask)
        loss.backward()
        grads[kind] = logp.grad
    want = torch.tensor([[-ADV[b][t] * MASK[b][t] / 7 for t in range(4)] for b in range(2)], dtype=torch.float64)
    for kind, grad in grads.items():
        assert torch.allclose(grad, want, rtol=0, atol=1e-15), kind
    # off rho = 1 they part: the reference tensors' ratios (up to e^4) put tokens past the clip and the truncation
    apart = {}
    for kind in ("clipped", "cispo"):
        logp, old, adv, mask = leaf()
        policy_loss(Config(loss=kind).update, logp, old, adv, mask)[0].backward()
        apart[kind] = logp.grad
    assert not torch.allclose(apart["clipped"], apart["cispo"])


def test_the_clip_by_sign_of_the_advantage_by_hand():
    """The reference tensors' ratios: row 0 (A = +0.5) e^0.1, e^-0.1 and e^0.5, which is past 1 + eps_high, so the
    clipped loss removes its gradient; row 1 (A = -1) e^-2, under 1 - eps_low (removed), then 1, e^0.1 and e^3.9,
    which keeps its gradient at 49 times A: the asymmetry of the clip for a negative advantage."""
    logp, old, adv, mask = leaf()
    _, stats = clipped_policy_loss(logp, old, adv, mask, 0.2, 0.28)
    n = 7
    assert stats["clip_pos"].item() == pytest.approx(1 / n)
    assert stats["clip_neg"].item() == pytest.approx(1 / n)
    assert stats["push_pos"].item() == pytest.approx(0.5 * (math.exp(0.1) + math.exp(-0.1)) / n)
    assert stats["push_neg"].item() == pytest.approx((1 + math.exp(0.1) + math.exp(3.9)) / n)
    assert stats["adv_pos"].item() == pytest.approx(3 * 0.5 / n)  # what a ratio of 1 would push
    assert stats["adv_neg"].item() == pytest.approx(4 * 1.0 / n)


@pytest.mark.parametrize("kind", ["clipped", "pg", "cispo", "dual clip"])
def test_the_push_of_each_sign_is_the_gradient_the_loss_takes(kind):
    """push_pos and push_neg are the summed |d loss / d log pi| on the tokens of that sign, as autograd computes it;
    clip_pos and clip_neg count the tokens of that sign whose gradient is 0."""
    logp, old, adv, mask = leaf()
    opts = Config(dual_clip=3.0).update if kind == "dual clip" else Config(loss=kind).update
    loss, stats = policy_loss(opts, logp, old, adv, mask)
    loss.backward()
    on = mask.bool()
    for sign, pick in (("pos", on & (adv > 0)), ("neg", on & (adv < 0))):
        grad = logp.grad[pick]
        assert stats[f"push_{sign}"].item() == pytest.approx(grad.abs().sum().item(), rel=1e-12)
        assert stats[f"clip_{sign}"].item() == pytest.approx((grad == 0).sum().item() / 7)
        assert stats[f"adv_{sign}"].item() == pytest.approx(adv[pick].abs().sum().item() / 7)


def test_policy_loss_dispatches_and_refuses_unknown_names():
    logp, old, adv, mask = leaf()
    opts = Config(eps_low=0.1, eps_high=0.3, dual_clip=2.0).update
    a, _ = policy_loss(opts, logp, old, adv, mask)
    b, _ = clipped_policy_loss(logp, old, adv, mask, 0.1, 0.3, 2.0)
    assert a.item() == b.item()
    assert a.item() != clipped_policy_loss(logp, old, adv, mask, 0.1, 0.3)[0].item()  # the dual clip reached it
    opts.loss = "ppo"
    with pytest.raises(ValueError, match="loss 'ppo' is not registered"):
        policy_loss(opts, logp, old, adv, mask)


def test_the_dual_clip_by_hand():
    """Row 1 of the reference tensors (A = -1) holds ratios e^-2, 1, e^0.1 and e^3.9 (49.4): a dual clip at 3 caps
    the last one's loss at 3 |A| and takes its gradient away; the other tokens, and row 0 (A > 0), keep the
    clipped loss's values and gradients. Off (0), it is the clipped loss exactly."""
    grads = {}
    for c in (0.0, 3.0):
        logp, old, adv, mask = leaf()
        loss, stats = clipped_policy_loss(logp, old, adv, mask, 0.2, 0.28, c)
        loss.backward()
        grads[c] = (loss.item(), logp.grad.clone(), stats)
    (plain, g0, s0), (dual, g3, s3) = grads[0.0], grads[3.0]
    assert dual == pytest.approx(plain - (math.exp(3.9) - 3.0) / 7)
    assert g3[1, 3].item() == 0.0 and g0[1, 3].item() == pytest.approx(math.exp(3.9) / 7)
    keep = torch.ones_like(g0, dtype=torch.bool)
    keep[1, 3] = False
    assert torch.equal(g3[keep], g0[keep])
    assert s3["clip_neg"].item() == pytest.approx(2 / 7) and s0["clip_neg"].item() == pytest.approx(1 / 7)
    assert s3["push_neg"].item() == pytest.approx((1 + math.exp(0.1)) / 7)
    assert s3["clip_frac"].item() == pytest.approx(3 / 7) and s0["clip_frac"].item() == pytest.approx(2 / 7)


def test_interpolation_weight_by_hand():
    versions = torch.tensor([[5, 4, 2], [5, 5, 1]])
    assert (
        interpolation_weight(versions, 5, 0.0).tolist() == [[1.0] * 3] * 2
    )  # first minibatch: pi_old itself
    alpha = interpolation_weight(versions, 5, 0.5)  # d / (d + 0.5) with d = 0, 1, 3 | 0, 0, 4
    assert alpha.flatten().tolist() == pytest.approx([0.0, 1 / 1.5, 3 / 3.5, 0.0, 0.0, 4 / 4.5])
    with pytest.raises(ValueError, match="progress"):
        interpolation_weight(versions, 5, 1.0)


def test_interpolated_logp_is_log_linear_between_mu_and_the_current_policy():
    current = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mu = torch.tensor([[-1.5, -1.0, -0.5]])
    versions = torch.tensor([[3, 1, 4]])
    prox = interpolated_logp(current, mu, versions, 4, 0.25)  # d = 1, 3, 0
    want = [-1.5 + (1 / 1.25) * 0.5, -1.0 + (3 / 3.25) * (-1.0), -0.5]
    assert prox.flatten().tolist() == pytest.approx(want)
    assert not prox.requires_grad
    exact = interpolated_logp(current, mu, versions, 4, 0.0)
    assert torch.equal(exact, current.detach())


def test_proximal_choices_and_the_side_corrections_act_on():
    scored, current, mu = torch.full((1, 2), -1.0), torch.full((1, 2), -2.0), torch.full((1, 2), -3.0)
    versions = torch.zeros(1, 2, dtype=torch.long)
    assert proximal_logp("recompute", scored, current, mu, versions, 0, 0.0) is scored
    assert proximal_logp("rollout", scored, current, mu, versions, 0, 0.0) is mu
    assert torch.equal(proximal_logp("interpolate", None, current, mu, versions, 0, 0.0), current)
    assert torch.equal(correction_side(proximal_traits("rollout"), mu, current), current)  # mu against mu: nothing
    assert correction_side(proximal_traits("recompute"), scored, current) is scored
    with pytest.raises(ValueError, match="proximal 'guess' is not registered"):
        proximal_logp("guess", scored, current, mu, versions, 0, 0.0)


# -- the length trap: a long episode's weight is what its level defines --------------------------------------
LONG = 5000


def long_episode(gap: float, length: int = LONG):
    mu = torch.full((1, length), -2.0)
    return mu + gap, mu, torch.ones(1, length)


def test_sequence_weights_of_a_long_episode_are_their_level_not_a_vanished_product():
    lt, ls, mask = long_episode(-0.01)  # sum of log ratios -50: the product e^-50 = 1.9e-22
    seq = lrl.tis_weights(lt, ls, mask, cap=2.0, level="sequence")
    assert seq[0, 0].item() == pytest.approx(math.exp(-0.01 * LONG), rel=1e-3)
    assert seq[0, -1].item() == seq[0, 0].item()
    geo = lrl.tis_weights(lt, ls, mask, cap=2.0, level="geometric")
    assert geo[0, 0].item() == pytest.approx(math.exp(-0.01), rel=1e-5)
    # a product grown past any float (e^+50 x 40): capped at C by TIS, outside the band for MIS; both finite
    up = long_episode(+0.05, 20_000)
    assert lrl.tis_weights(*up, cap=2.0, level="sequence")[0, 0].item() == pytest.approx(2.0)
    assert lrl.mis_weights(*up, level="sequence")[0, 0].item() == 0.0
    assert lrl.mis_weights(*up, level="geometric")[0, 0].item() == pytest.approx(math.exp(0.05), rel=1e-5)
    norm = normalize_weights(lrl.tis_weights(*up, cap=2.0, level="sequence"), up[2], "sequence")
    assert torch.isfinite(norm).all() and norm[0, 0].item() == pytest.approx(1.0)


def test_episode_divergences_of_a_long_episode_are_exact_and_finite():
    lt, ls, mask = long_episode(0.5, 20_000)  # k3 of one token e^0.5 - 1.5 = 0.1487; 20,000 of them
    per_token = math.exp(0.5) - 1.5
    assert divergence(lt, ls, mask, "k3", "seq_sum")[0, 0].item() == pytest.approx(
        per_token * 20_000, rel=1e-6
    )
    assert divergence(lt, ls, mask, "k3", "seq_mean")[0, 0].item() == pytest.approx(per_token, rel=1e-6)
    assert divergence(lt, ls, mask, "k2", "seq_max")[0, 0].item() == pytest.approx(0.125, rel=1e-6)
    huge = long_episode(500.0)  # a log ratio no float exponentiates: clamped at 80 nats, so still finite
    for level in ("token", "seq_sum", "seq_mean", "seq_max"):
        assert torch.isfinite(divergence(*huge, "k3", level)).all()
        assert not kl_keep(*huge, "k3", level, 1e9).any()  # and past any threshold
    opsm = opsm_keep(*long_episode(-0.6, 20_000), torch.tensor([-1.0]), 0.5)  # mean log(mu/pi) 0.6 > 0.5
    assert not opsm.any()


def test_every_sequence_level_correction_of_a_long_mixed_batch_is_finite():
    g = torch.Generator().manual_seed(0)
    lt = torch.randn(3, 8000, generator=g) * 0.3 - 2
    ls = lt + torch.randn(3, 8000, generator=g) * 0.3
    ls[1] = lt[1] + 0.2  # a ratio e^-0.2 on every token: e^-1600 as a product
    mask = torch.ones(3, 8000)
    for correction in ("tis", "mis"):
        for level in ("sequence", "geometric"):
            cfg = Config(
                correction=correction, level=level, normalize=True, masks=["kl", "opsm", "m2po"], veto=1e-4
            )
            result = correct(lt, ls, mask, torch.tensor([-1.0, 1.0, -1.0]), cfg.weighting)
            assert torch.isfinite(result.weights).all() and (result.weights >= 0).all()


# -- episodes that span a weight update -----------------------------------------------------------------------
def test_an_episode_spanning_two_versions_is_counted_and_its_mismatch_reported_apart():
    # episode 0: tokens from versions 3, 3, 4 (a partial rollout across one update); episodes 1 and 2: version 4 only
    version = torch.tensor([[3, 3, 4, 0], [4, 4, 4, 4], [4, 4, 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    mu = torch.full((3, 4), -1.0)
    gaps = torch.tensor([[0.2, -0.4, 0.3, 9.0], [0.01, -0.02, 0.0, 0.01], [0.03, -0.01, 9.0, 9.0]])
    assert multi_version_episodes(version, mask).tolist() == [True, False, False]
    out = version_split(mu + gaps, mu, version, mask)
    assert out["staleness/multi_version_episodes"] == pytest.approx((1 / 3, 3.0))
    assert out["staleness/multi_version_tokens"] == pytest.approx((3 / 9, 9.0))
    assert out["mismatch/multi_version_abs_mean"] == pytest.approx(((0.2 + 0.4 + 0.3) / 3, 3.0))
    assert out["mismatch/single_version_abs_mean"] == pytest.approx(
        ((0.01 + 0.02 + 0.0 + 0.01 + 0.03 + 0.01) / 6, 6.0)
    )
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    assert out["mismatch/multi_version_kl_k3"][0] == pytest.approx(
        (k3(0.2) + k3(-0.4) + k3(0.3)) / 3, rel=1e-5
    )
    single = [0.01, -0.02, 0.0, 0.01, 0.03, -0.01]
    assert out["mismatch/single_version_kl_k3"][0] == pytest.approx(sum(map(k3, single)) / 6, rel=1e-3)


def test_a_batch_from_one_version_has_no_spanning_group():
    version = torch.full((2, 3), 7)
    mask = torch.ones(2, 3)
    out = version_split(torch.zeros(2, 3), torch.zeros(2, 3), version, mask)
    assert out["staleness/multi_version_episodes"][0] == 0.0
    assert out["mismatch/multi_version_abs_mean"][1] == 0.0  # weight 0: left out of the logged metrics
