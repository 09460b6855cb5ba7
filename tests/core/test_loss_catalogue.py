"""The update's parts as registries: the loss catalogue (GSPO, SAPO, GMPO) and the aggregations against values
worked out by hand, the losses that were there before bit for bit as they were, a split into microbatches that
changes no aggregation's loss, and a user's loss, aggregation and proximal policy from a file outside the repo."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lrl.aggregations import Aggregation
from lrl.distributed import Ranks
from lrl.losses import (
    LOG_RATIO_BOUND,
    gmpo_terms,
    gspo_terms,
    loss_traits,
    sapo_terms,
)
from lrl.objective import Objective
from lrl.registry import AGGREGATIONS, supply
from lrl.update import Minibatch

ROOT = Path(__file__).resolve().parents[2]


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def near(tensor, nested, rel=1e-9):
    """The tensor's values, row by row, against `nested` (lists of rows)."""
    want = [x for row in nested for x in row]
    return tensor.flatten().tolist() == pytest.approx(want, rel=rel, abs=1e-12)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_gspo_clips_each_episodes_geometric_mean_ratio_and_its_tokens_share_its_gradient():
    # three episodes of two tokens: mean log-ratio 0 (no clip), +0.1 with A > 0 (clipped: no gradient), +0.1 with
    # A < 0 (the min keeps the unclipped term: gradient -A s on each token)
    old = torch.log(torch.tensor([[0.4, 0.5], [0.3, 0.3], [0.3, 0.3]], dtype=torch.float64))
    shift = torch.tensor([[math.log(1.25), math.log(0.8)], [0.1, 0.1], [0.1, 0.1]], dtype=torch.float64)
    logp = leaf((old + shift).tolist())
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(3, 2, dtype=torch.float64)
    terms, stats = gspo_terms(logp, old, adv, mask)  # the paper's clip: 3e-4 below, 4e-4 above
    s = math.exp(0.1)
    want = [[-1.0, -1.0], [-(1 + 4e-4)] * 2, [s, s]]
    assert near(terms, want)
    terms.sum().backward()
    assert near(logp.grad, [[-1.0, -1.0], [0.0, 0.0], [s, s]])
    assert float(stats["clip_frac"]) == pytest.approx(2 / 6)  # the second episode's two tokens
    assert loss_traits("gspo").ratio == "sequence"


def test_sapo_gates_the_ratio_softly_by_the_sign_of_the_advantage():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = leaf([[0.5, -0.3]])
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    terms, stats = sapo_terms(logp, old, adv, torch.ones(1, 2, dtype=torch.float64), tau_pos=1.0, tau_neg=1.05)
    r1, r2 = math.exp(0.5), math.exp(-0.3)
    g1, g2 = sigmoid(1.0 * (r1 - 1)), sigmoid(1.05 * (r2 - 1))
    assert near(terms, [[-4 * g1, (4 / 1.05) * g2]])
    terms.sum().backward()
    # d/dlog pi of (4/tau) sigmoid(tau (r - 1)) A = 4 s (1 - s) r A: the policy gradient's at r = 1
    assert near(logp.grad, [[-4 * g1 * (1 - g1) * r1, 4 * g2 * (1 - g2) * r2]])
    faded = [4 * g * (1 - g) < 0.5 for g in (g1, g2)]
    assert float(stats["clip_frac"]) == pytest.approx(sum(faded) / 2)


def test_gmpo_takes_the_geometric_mean_of_each_episodes_clipped_ratios_in_log_space():
    old = torch.zeros(2, 2, dtype=torch.float64)
    logp = leaf([[0.1, 0.6], [-0.1, -0.6]])  # the clip is +-0.4 in log space
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    terms, _ = gmpo_terms(logp, old, adv, torch.ones(2, 2, dtype=torch.float64))
    # A > 0: min(log r, clip) = 0.1, 0.4, mean 0.25, L = -e^0.25; A < 0: max(log r, clip) = -0.1, -0.4, L = e^-0.25
    up, down = -math.exp(0.25), math.exp(-0.25)
    assert near(terms, [[up, up], [down, down]])
    (terms.sum(-1) / 2).sum().backward()  # each episode's loss once (seq-mean-token-mean's numerator)
    # only the unclipped token moves: d L / d log pi_1 = -A e^mean / |y|
    assert near(logp.grad, [[-math.exp(0.25) / 2, 0.0], [math.exp(-0.25) / 2, 0.0]])
    assert loss_traits("gmpo").episode_advantage


@pytest.mark.parametrize(
    "name, want",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4) / 2),
        ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),
        ("seq-mean-token-sum-norm", (1 + 2 + 3 + 4) / (2 * 10)),
        ("bnpo", (1 + 2 + 3 + 4) / 4),
    ],
)
def test_each_aggregation_against_its_hand_value(name, want):
    terms = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # a row of no action
    agg = supply(AGGREGATIONS[name].factory, type("Options", (), {"norm_tokens": 10})())
    assert isinstance(agg, Aggregation)
    assert float(agg.numerator(terms, mask) / agg.units(mask)) == pytest.approx(want)


def reference_clipped(logp, old, adv, mask, eps_low, eps_high, dual):
    """The clipped loss as lrl computed it before it was a registry entry, operation for operation."""
    log_ratio = torch.where(mask.bool(), logp - old, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    if dual:
        per_token = torch.where((ratio > dual) & (adv < 0), -dual * adv, per_token)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def reference_cispo(logp, old, adv, mask, eps_high):
    on = mask.bool()
    coef = torch.where(on, logp - old, 0.0).detach().clamp(max=math.log1p(eps_high)).exp()
    return torch.where(on, -(coef * adv) * logp, 0.0).sum() / mask.sum().clamp(min=1.0)


def reference_pg(logp, old, adv, mask):
    return torch.where(mask.bool(), -adv * logp, 0.0).sum() / mask.sum().clamp(min=1.0)


def batch(seed=0, rows=6, width=9):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) > 0.3).float()
    mask[0] = 1.0
    old = torch.randn(rows, width, generator=g) - 2
    adv = torch.randn(rows, 1, generator=g) * torch.rand(rows, width, generator=g)
    logp = old + 1.5 * torch.randn(rows, width, generator=g)  # ratios far enough out to clip and dual-clip
    return logp, old, adv, mask


def objective(**update):
    from lrl.config import Config

    return Objective(Config(**update))


def minibatch(logp, old, adv, mask, obj, rows=slice(None)):
    n = len(mask)
    units = obj.units(mask).double()
    return Minibatch(0, True, torch.arange(n), torch.arange(0), None, None, mask, old, adv, adv[:, 0], old,
                     mask.sum().double(), mask.sum().double(), "test", None, 1, units, units)  # fmt: skip


@pytest.mark.parametrize(
    "update, reference",
    [
        ({"loss": "clipped"}, lambda lp, o, a, m: reference_clipped(lp, o, a, m, 0.2, 0.28, 0.0)),
        ({"loss": "clipped", "dual_clip": 3.0}, lambda lp, o, a, m: reference_clipped(lp, o, a, m, 0.2, 0.28, 3.0)),
        ({"loss": "pg"}, reference_pg),
        ({"loss": "cispo"}, lambda lp, o, a, m: reference_cispo(lp, o, a, m, 0.28)),
    ],
)
def test_the_losses_that_were_there_are_bit_for_bit_what_they_were(update, reference):
    """The step's loss of one forward through the registry, the default aggregation and the objective: the same
    bits, loss and gradient, as the formula each loss was computed by before."""
    logp, old, adv, mask = batch()
    obj = objective(**update)
    mine = logp.clone().requires_grad_(True)
    loss, *_ = obj.rows_loss(minibatch(logp, old, adv, mask, obj), slice(None), mine, torch.zeros_like(old), None,
                             Ranks(), 0)  # fmt: skip
    theirs = logp.clone().requires_grad_(True)
    expected = reference(theirs, old, adv, mask)
    loss.backward()
    expected.backward()
    assert torch.equal(loss.detach(), expected.detach()) and torch.equal(mine.grad, theirs.grad)
    assert "dual" not in update or bool(((logp - old).exp() > 3.0).any())  # the dual clip had tokens to cap


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                         "seq-mean-token-sum-norm", "bnpo"])  # fmt: skip
@pytest.mark.parametrize("loss", ["clipped", "gspo", "sapo", "gmpo"])
def test_a_minibatch_in_microbatches_has_the_loss_and_gradient_of_one_forward(loss, aggregation):
    logp, old, adv, mask = batch(seed=1)
    adv = adv[:, :1].expand_as(old).contiguous() * mask  # one advantage an episode (gmpo reads one)
    obj = objective(loss=loss, aggregation=aggregation)
    mb = minibatch(logp, old, adv, mask, obj)
    whole = logp.clone().requires_grad_(True)
    one, *_ = obj.rows_loss(mb, slice(None), whole, torch.zeros_like(old), None, Ranks(), 0)
    one.backward()
    parts = logp.clone().requires_grad_(True)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 6)):
        piece, *_ = obj.rows_loss(mb, rows, parts[rows], torch.zeros_like(old[rows]), None, Ranks(), 0)
        total = total + piece
    total.backward()
    assert float(total.detach()) == pytest.approx(float(one.detach()), rel=1e-5, abs=1e-7)
    assert torch.allclose(parts.grad, whole.grad, rtol=1e-5, atol=1e-7)
    assert float(one.detach()) != 0.0


def test_a_users_loss_aggregation_and_proximal_policy_train_from_a_file_outside_the_repository(tmp_path):
    plugin = tmp_path / "my_update.py"
    shutil.copy(ROOT / "tests" / "plugins" / "update_parts.py", plugin)
    argv = [sys.executable, str(ROOT / "train.py"), "--plugins", str(plugin)]
    listed = subprocess.run([*argv, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert listed.returncode == 0
    helped = " ".join(listed.stdout.split())
    assert "half_pg (default: clipped)" in helped and "half-token-mean (default: token-mean)" in helped
    assert "interpolate, mu (default: recompute)" in helped
    run = subprocess.run([*argv, "--loss", "half_pg", "--aggregation", "half-token-mean", "--proximal", "mu",
                          "--max-steps", "2", "--tasks-per-step", "2", "--episodes-per-task", "4", "--eval-episodes",
                          "1", "--eval-at-start", "false", "--progress", "false", "--log-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "2 steps" in run.stdout
