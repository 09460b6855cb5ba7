"""Importance weights on hand-made tensors, and the decoupled loss identity."""

import math
from types import SimpleNamespace

import pytest
import torch

import lrl
from lrl.config import Config
from lrl.losses import clipped_policy_loss, group_advantages
from lrl.stats import batch_stats, sequence_corrected_share
from lrl.weights import behavior_weights, veto_mask


def logps(ratios):
    """Trainer/sampler log-probs whose ratio pi/mu is exactly `ratios` (sampler log-prob fixed at log 0.1)."""
    r = torch.tensor(ratios, dtype=torch.float64)
    mu = torch.full_like(r, math.log(0.1))
    return mu + r.log(), mu


def test_token_tis_caps_exactly_at_c_and_zeroes_off_mask():
    lp, lm = logps([[0.5, 2.0, 3.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    w = lrl.tis_weights(lp, lm, mask, cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.5, 2.0, 2.0, 0.0]], dtype=torch.float64))
    assert w.max() == 2.0


def test_token_mis_band_edges_are_inclusive():
    lp, lm = logps([[0.49, 0.5, 1.0, 5.0, 5.01]])
    mask = torch.ones(1, 5, dtype=torch.float64)
    w = lrl.mis_weights(lp, lm, mask, low=0.5, high=5.0)
    assert torch.allclose(w, torch.tensor([[0.0, 0.5, 1.0, 5.0, 0.0]], dtype=torch.float64))


def test_weights_are_detached():
    lp = torch.zeros(2, 3, requires_grad=True)
    w = lrl.tis_weights(lp, torch.full((2, 3), -0.1), torch.ones(2, 3))
    assert not w.requires_grad


def test_all_masked_rows_give_zeros_not_nan():
    lp, lm, mask = torch.randn(3, 5), torch.randn(3, 5), torch.zeros(3, 5)
    mask[1] = 1
    for level in ("token", "sequence", "geometric"):
        for w in (lrl.tis_weights(lp, lm, mask, level=level), lrl.mis_weights(lp, lm, mask, level=level)):
            assert torch.isfinite(w).all()
            assert (w[0] == 0).all() and (w[2] == 0).all()


def test_sequence_and_geometric_levels():
    # one episode of 3 tokens with ratios 2, 2, 0.25: product 1.0, geometric mean 1.0
    lp, lm = logps([[2.0, 2.0, 0.25, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    seq = lrl.tis_weights(lp, lm, mask, cap=2.0, level="sequence")
    assert torch.allclose(seq, torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64))
    lp2, lm2 = logps([[3.0, 3.0, 1.0]])
    m2 = torch.ones(1, 3, dtype=torch.float64)
    assert torch.allclose(
        lrl.tis_weights(lp2, lm2, m2, cap=2.0, level="sequence"), torch.full((1, 3), 2.0, dtype=torch.float64)
    )
    geo = lrl.tis_weights(lp2, lm2, m2, cap=5.0, level="geometric")
    assert torch.allclose(geo, torch.full((1, 3), 9.0 ** (1 / 3), dtype=torch.float64))
    # sequence MIS masks the whole episode when its product leaves the band
    assert (lrl.mis_weights(lp2, lm2, m2, low=0.5, high=5.0, level="sequence") == 0).all()
    assert torch.allclose(lrl.mis_weights(lp2, lm2, m2, level="geometric"), geo)


def test_sequence_variants_stay_finite_on_long_episodes():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(4, 1000, generator=g) * 0.5 - 2
    lm = (
        lp + torch.randn(4, 1000, generator=g) * 0.4
    )  # sum of log ratios ~ +-12, product of 0.7^300-like terms
    lm[0] = lp[0] + 0.36  # ratio 0.7 on every token: 0.7^1000 underflows in linear space
    mask = torch.ones(4, 1000)
    for level in ("sequence", "geometric"):
        for w in (lrl.tis_weights(lp, lm, mask, level=level), lrl.mis_weights(lp, lm, mask, level=level)):
            assert torch.isfinite(w).all()
    assert (lrl.tis_weights(lp, lm, mask, level="sequence")[0] >= 0).all()
    assert lrl.tis_weights(lp, lm, mask, level="sequence")[0, 0] == pytest.approx(
        math.exp(-360), rel=1e-3, abs=0
    )


def test_veto_zeroes_whole_episode():
    lp, lm = logps([[1.0, 1e-5, 1.0], [1.0, 0.5, 1.0]])
    mask = torch.ones(2, 3, dtype=torch.float64)
    assert veto_mask(lp, lm, mask, 1e-4).flatten().tolist() == [0.0, 1.0]
    w = behavior_weights(lp, lm, mask, Config(correction="tis", veto=1e-4))
    assert (w[0] == 0).all() and w[1].tolist() == pytest.approx([1.0, 0.5, 1.0])
    mask[0, 1] = 0  # a vetoing ratio off the mask does not count
    assert veto_mask(lp, lm, mask, 1e-4).flatten().tolist() == [1.0, 1.0]


def test_bad_arguments():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="cap"):
        lrl.tis_weights(x, x, x, cap=0)
    with pytest.raises(ValueError, match="low"):
        lrl.mis_weights(x, x, x, low=2, high=1)
    with pytest.raises(ValueError, match="level"):
        lrl.tis_weights(x, x, x, level="episode")
    with pytest.raises(ValueError, match="correction"):
        behavior_weights(x, x, x, SimpleNamespace(correction="full", veto=0.0))


def test_decoupled_identity_on_random_tensors():
    """w * min(rho A, clip(rho) A) == min(rho w A, clip(rho) w A) for w >= 0."""
    g = torch.Generator().manual_seed(1)
    logp, old, mu = (torch.randn(6, 9, generator=g) * 0.3 - 1 for _ in range(3))
    adv = torch.randn(6, generator=g)
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    w = lrl.tis_weights(old, mu, mask)
    rho = (logp - old).exp()
    clipped = rho.clamp(0.8, 1.28)
    lhs = -(w * torch.minimum(rho * adv[:, None], clipped * adv[:, None]) * mask).sum() / mask.sum()
    rhs, _ = clipped_policy_loss(logp, old, adv[:, None] * w, mask, 0.2, 0.28)
    assert torch.allclose(lhs, rhs, atol=1e-6, rtol=0)


def test_correction_none_is_the_onpolicy_loss_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    logp, old, mu = (torch.randn(5, 7, generator=g) for _ in range(3))
    adv, mask = torch.randn(5, generator=g), (torch.rand(5, 7, generator=g) > 0.3).float()
    onpolicy, _ = clipped_policy_loss(logp, old, adv[:, None] * mask, mask)
    none, _ = clipped_policy_loss(logp, old, adv[:, None] * behavior_weights(old, mu, mask, Config()), mask)
    assert torch.equal(onpolicy, none)


def test_masking_does_not_inflate_the_remaining_gradient():
    logp = torch.zeros(1, 4, requires_grad=True)
    old, mask, adv = torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)
    weights = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    loss, _ = clipped_policy_loss(logp, old, adv * weights, mask)
    loss.backward()
    assert logp.grad.tolist() == [[-0.25, -0.25, 0.0, 0.0]]  # divided by 4 action tokens, not by 2


def test_offpolicy_stats_use_raw_ratios():
    lp, lm = logps([[3.0, 1.0, 0.1, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    w = lrl.tis_weights(lp, lm, mask)
    s = batch_stats(lp, lm, mask, lrl.mis_weights(lp, lm, mask))
    assert s["abs_mean"] == pytest.approx((math.log(3) + 0 + math.log(10)) / 3)
    assert s["over_cap"] == pytest.approx(1 / 3) and s["masked"] == pytest.approx(1 / 3)
    assert w.max() == 2.0  # truncation does not change what the stats report


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    adv = group_advantages(r, g)
    assert adv[:2].tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
    assert adv[2:].abs().sum() == 0  # no variance in groups 1, 2; a group of one has no baseline


def test_group_advantages_without_the_std_keep_the_reward_differences():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    scaled, centred = group_advantages(r, g), group_advantages(r, g, scale=False)
    assert centred.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.0, 0.0])
    assert scaled[0].item() == pytest.approx(0.75 / 0.4330127, rel=1e-4)  # one success in four, scaled up


def test_sequence_level_shares_count_episodes_by_their_product():
    lp, lm = logps([[3.0, 1.0, 1.0], [1.0, 0.1, 1.0], [1.5, 1.2, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    shares = sequence_corrected_share(lp, lm, mask, cap=2.0, low=0.5, high=5.0)
    # sequence ratios 3 (over the cap, inside the band), 0.1 (below the band), 1.8 (neither)
    assert shares["seq_over_cap"] == pytest.approx(1 / 3) and shares["seq_outside_band"] == pytest.approx(
        1 / 3
    )


def test_a_huge_log_ratio_off_the_mask_leaves_the_loss_finite():
    """The PPO ratio is exponentiated after masking: a log-ratio of 200 at a padding position (exp -> inf) must
    not turn the loss or approx_kl into NaN (inf * 0)."""
    logp = torch.tensor([[-1.0, 199.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, -2.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    loss, stats = clipped_policy_loss(logp, old, adv, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(stats["approx_kl"]) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0
    expected, _ = clipped_policy_loss(
        logp.detach()[:, [0, 2]], old[:, [0, 2]], adv[:, [0, 2]], mask[:, [0, 2]]
    )
    assert loss.item() == pytest.approx(expected.item())
