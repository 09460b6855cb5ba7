"""Rejection masks (kl, opsm, m2po), batch normalisation and the dropped counts, each against a reference written
here in plain Python (loops over lists, the math module), never with the functions under test."""

import math

import pytest
import torch

from lrl.config import Config, ConfigError
from lrl.masks import divergence, kl_keep, m2_keep, opsm_keep
from lrl.stats import dropped_shares
from lrl.weights import correct, needs_batch, normalize_weights

# log r = log pi_old - log mu per token; None is a position off the action mask
GAPS = [
    [0.1, -0.3, 0.0, None],
    [1.0, 0.2, -1.0, 0.05],
    [None, None, None, None],  # an episode without action tokens
    [-0.6, -0.7, None, None],
]


def tensors(gaps=GAPS, mu=-1.5):
    """(logp_trainer, logp_sampler, mask) whose log ratio is `gaps` on the action tokens (off them: 9 nats)."""
    d = torch.tensor([[9.0 if g is None else g for g in row] for row in gaps], dtype=torch.float64)
    mask = torch.tensor([[0.0 if g is None else 1.0 for g in row] for row in gaps], dtype=torch.float64)
    sampler = torch.full_like(d, mu)
    return sampler + d, sampler, mask


def ref_token(g: float, estimator: str) -> float:
    return {"k1": -g, "k2": g * g / 2, "k3": math.exp(g) - 1 - g}[estimator]


def ref_level(row, estimator: str, level: str) -> float | None:
    """One episode's estimate at `level` (None: no action tokens)."""
    values = [ref_token(g, estimator) for g in row if g is not None]
    if not values:
        return None
    return {"seq_sum": sum(values), "seq_mean": sum(values) / len(values), "seq_max": max(values)}[level]


def ref_kl_keep(gaps, estimator, level, threshold):
    out = []
    for row in gaps:
        if level == "token":
            vals = [None if g is None else ref_token(g, estimator) for g in row]
        else:
            v = ref_level(row, estimator, level)
            vals = [None if g is None else v for g in row]
        size = (lambda x: abs(x)) if estimator == "k1" else (lambda x: x)
        out.append([False if v is None else size(v) <= threshold for v in vals])
    return out


def test_the_k3_estimates_of_a_few_tokens_by_hand():
    lt, ls, mask = tensors()
    d = divergence(lt, ls, mask, "k3", "token")
    assert d[1, 0].item() == pytest.approx(math.e - 2, rel=1e-12)  # r = e: e - 1 - 1
    assert d[1, 2].item() == pytest.approx(1 / math.e, rel=1e-12)  # r = 1/e: 1/e - 1 + 1
    assert d[0, 2].item() == 0.0 and d[0, 3].item() == 0.0  # r = 1; off the mask
    row1 = divergence(lt, ls, mask, "k3", "seq_mean")[1, 0].item()
    assert row1 == pytest.approx((math.e - 2 + 1 / math.e + math.exp(0.2) - 1.2 + math.exp(0.05) - 1.05) / 4)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("level", ["token", "seq_sum", "seq_mean", "seq_max"])
def test_kl_mask_matches_the_hand_reference_at_every_level(estimator, level):
    if estimator == "k1" and level == "seq_max":
        with pytest.raises(ValueError, match="signed"):
            divergence(*tensors(), estimator, level)
        return
    lt, ls, mask = tensors()
    for threshold in (0.01, 0.06, 0.27, 0.75):  # none on an estimate: an edge is a rounding away
        keep = kl_keep(lt, ls, mask, estimator, level, threshold)
        assert keep.tolist() == ref_kl_keep(GAPS, estimator, level, threshold), threshold
        values = divergence(lt, ls, mask, estimator, level)
        for b, row in enumerate(GAPS):
            for t, g in enumerate(row):
                if g is None:
                    continue
                want = ref_token(g, estimator) if level == "token" else ref_level(row, estimator, level)
                assert values[b, t].item() == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_k1_bounds_the_ratio_on_both_sides():
    # token k1 with threshold log 2 keeps exactly the tokens whose ratio lies in [1/2, 2]
    lt, ls, mask = tensors([[math.log(2.01), math.log(1.99), -math.log(1.99), -math.log(2.01)]])
    assert kl_keep(lt, ls, mask, "k1", "token", math.log(2)).tolist() == [[False, True, True, False]]


def test_opsm_drops_only_negative_advantage_episodes_past_the_threshold():
    lt, ls, mask = tensors()
    advantage = torch.tensor([-1.0, -1.0, -1.0, 0.5], dtype=torch.float64)
    # mean log(mu / pi_old): row 0 (0.2/3 = 0.067), row 1 (-0.25/4 < 0), row 3 (0.65, but a positive advantage)
    keep = opsm_keep(lt, ls, mask, advantage, threshold=0.05)
    assert keep.tolist() == [[False] * 4, [True] * 4, [False] * 4, [True, True, False, False]]
    keep = opsm_keep(lt, ls, mask, advantage, threshold=0.07)  # 0.0667 is not past 0.07
    assert keep[0].tolist() == [True, True, True, False]
    negative = torch.tensor([-1.0, -1.0, -1.0, -0.5], dtype=torch.float64)
    assert not opsm_keep(lt, ls, mask, negative, threshold=0.5)[3].any()  # 0.65 > 0.5, advantage < 0
    with pytest.raises(ValueError, match="advantage"):
        opsm_keep(lt, ls, mask, None, 0.5)


def ref_m2(gaps, threshold):
    """M2PO by hand: drop the largest squares one at a time (first in row-major order on ties) until the mean of
    the rest is at most the threshold."""
    flat = [(g * g, (b, t)) for b, row in enumerate(gaps) for t, g in enumerate(row) if g is not None]
    order = sorted(range(len(flat)), key=lambda i: (-flat[i][0], i))
    kept = set(range(len(flat)))
    for i in order:
        if sum(flat[j][0] for j in kept) / max(len(kept), 1) <= threshold:
            break
        kept.discard(i)
    where = {flat[i][1] for i in kept}
    return [[(b, t) in where for t in range(len(row))] for b, row in enumerate(gaps)]


@pytest.mark.parametrize("threshold", [0.001, 0.04, 0.1, 0.3, 10.0])
def test_m2po_drops_the_fewest_largest_squares_that_meet_the_bound(threshold):
    gaps = [[0.1, 0.3, 0.0, None], [1.0, 0.2, -1.0, 0.05], [-0.6, -0.7, 0.2, None]]
    lt, ls, mask = tensors(gaps)
    assert m2_keep(lt, ls, mask, threshold).tolist() == ref_m2(gaps, threshold)


def test_m2po_by_hand_on_one_batch():
    # squares 0.01 0.09 0 | 1 0.04 1 0.0025: mean 0.306; without one 1: 0.19; without both: 0.0285 <= 0.04
    gaps = [[0.1, 0.3, 0.0], [1.0, 0.2, -1.0], [0.05, None, None]]
    lt, ls, mask = tensors(gaps)
    keep = m2_keep(lt, ls, mask, 0.04)
    assert keep.tolist() == [[True, True, True], [False, True, False], [True, False, False]]


def test_normalised_weights_average_one_over_tokens_or_episodes():
    w = torch.tensor([[0.5, 1.0, 2.0, 9.0], [1.5, 1.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    token = normalize_weights(w, mask, "token")  # mean over the 5 action tokens: 6.5 / 5 = 1.3
    want = [0.5 / 1.3, 1 / 1.3, 2 / 1.3, 0, 1.5 / 1.3, 1.5 / 1.3, 0, 0]
    assert (token * mask).flatten().tolist() == pytest.approx(want)
    seq_w = torch.tensor([[0.5, 0.5, 0.5, 0.0], [2.0, 2.0, 0.0, 0.0]], dtype=torch.float64)
    seq = normalize_weights(seq_w, mask, "sequence")  # one weight per episode: (0.5 + 2) / 2 = 1.25
    assert (seq * mask).flatten().tolist() == pytest.approx([0.4, 0.4, 0.4, 0, 1.6, 1.6, 0, 0])
    zero = torch.zeros_like(w)
    assert torch.equal(normalize_weights(zero, mask, "token"), zero)  # nothing to scale: left as it is


def test_correct_composes_weights_masks_and_veto_and_names_what_each_dropped():
    gaps = [[0.1, -0.3, 0.0, None], [1.0, 0.2, -1.0, 0.05], [-0.6, -0.7, None, None], [-12.0, 0.0, 0.0, 0.0]]
    lt, ls, mask = tensors(gaps)
    advantage = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    cfg = Config(
        correction="mis", low=0.5, high=2.0, masks=["kl", "opsm"], kl_level="token", kl_threshold=0.1,
        opsm_threshold=0.5, veto=1e-4,
    )  # fmt: skip
    result = correct(lt, ls, mask, advantage, cfg.weighting)
    # by hand: MIS keeps ratios in [0.5, 2] (e^1 = 2.72, e^-1 = 0.37, e^-0.7 = 0.497, e^-12 out); token k3 <= 0.1 keeps
    # |log r| up to about 0.4 (e^-0.6 - 1 + 0.6 = 0.149 out); opsm drops row 2 (A < 0, mean log(mu/pi) 0.65);
    # the veto drops row 3 (ratio e^-12 < 1e-4)
    assert result.dropped["mis"].tolist() == [
        [False] * 4,
        [True, False, True, False],
        [False, True, False, False],
        [True, False, False, False],
    ]
    assert result.dropped["kl"].tolist() == [
        [False] * 4,
        [True, False, True, False],
        [True, True, False, False],
        [True, False, False, False],
    ]
    assert result.dropped["opsm"].tolist() == [
        [False] * 4,
        [False] * 4,
        [True, True, False, False],
        [False] * 4,
    ]
    assert result.dropped["veto"].tolist() == [[False] * 4, [False] * 4, [False] * 4, [True] * 4]
    expected = [
        [math.exp(0.1), math.exp(-0.3), 1.0, 0.0],
        [0.0, math.exp(0.2), 0.0, math.exp(0.05)],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
    assert result.weights.flatten().tolist() == pytest.approx(sum(expected, []))
    shares = dropped_shares(result.dropped, mask)  # 13 action tokens, 4 episodes
    assert shares["kl"] == pytest.approx((5 / 13, 1 / 4))  # row 2 whole
    assert shares["opsm"] == pytest.approx((2 / 13, 1 / 4))
    assert shares["veto"] == pytest.approx((4 / 13, 1 / 4))
    assert shares["mis"] == pytest.approx((4 / 13, 0.0))


def test_which_choices_need_the_whole_batch_first():
    assert not needs_batch(Config().weighting)
    assert not needs_batch(Config(correction="tis", masks=["kl", "opsm"]).weighting)
    assert needs_batch(Config(masks=["m2po"]).weighting)
    assert needs_batch(Config(correction="tis", normalize=True).weighting)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(loss="pg", proximal="interpolate"), "has none"),
        (dict(proximal="rollout", correction="tis"), "count it twice"),
        (dict(proximal="rollout", loss="cispo", correction="mis"), "count it twice"),
        (dict(proximal="interpolate", masks=["m2po"]), "m2po: reads the whole batch"),
        (dict(proximal="rollout", loss="pg", normalize=True), "normalize: reads the whole batch"),
        (dict(masks=["kl"], kl_estimator="k1", kl_level="seq_max"), "k1 is signed"),
        (dict(kl_threshold=0.2), r"kl_threshold: 0.2 is not used by masks \[\]"),
        (dict(opsm_threshold=0.2, masks=["kl"]), "opsm_threshold: 0.2 is not used"),
        (dict(dual_clip=1.2), r"dual_clip: 1.2 must be above the upper clip 1 \+ eps_high = 1.28"),
        (dict(dual_clip=3.0, loss="cispo"), "dual_clip: 3.0 is not used by loss 'cispo'; it applies to: clipped"),
        (dict(tau_pos=2.0), "tau_pos: 2.0 is not used by loss 'clipped'; it applies to: sapo"),
        (dict(norm_tokens=5), "norm_tokens: 5 is not used by aggregation 'token-mean'; it applies to: seq-mean-token-sum-norm"),
        (dict(loss="gspo", masks=["kl"], kl_level="token"), "masks: kl drops single tokens, which changes the gspo"),
        (dict(loss="gmpo", masks=["m2po"]), "masks: m2po drops single tokens, which changes the gmpo"),
        (dict(loss="gmpo", correction="tis"), "level: token gives each token a weight of its own, and loss gmpo"),
        (dict(loss="gspo", proximal="rollout", correction="tis"), "the gspo loss's own ratio pi / mu carries"),
        (dict(eps_low=0.1, loss="pg"), r"eps_low: 0.1 is not used (with|by) loss:? '?pg\b.* clipped"),
        (dict(eps_low=0.1, loss="cispo"), r"eps_low: 0.1 is not used (with|by) loss:? '?cispo\b"),
        (dict(eps_high=0.4, loss="pg"), r"eps_high: 0.4 is not used (with|by) loss:? '?pg\b.*clipped.*cispo"),
        (dict(level="sequence"), r"level: 'sequence' is not used by correction 'none'; it applies to: tis"),
        (dict(normalize=True), "normalize: true is not used by correction 'none'"),
        (dict(masks=["kl", "opsm", "kl"]), "masks: 'kl' is given twice"),
    ],
)
def test_choices_that_do_not_fit_together_are_config_errors(kw, words):
    with pytest.raises(ConfigError, match=words):
        Config(**kw)


def test_choices_that_fit_together():
    Config(proximal="rollout", loss="pg", correction="tis", level="sequence", masks=["kl", "opsm"])
    Config(proximal="rollout", masks=["kl", "opsm"], veto=1e-4)  # masks compare the forward's own pi with mu
    Config(proximal="interpolate", loss="cispo", correction="tis", masks=["kl"])
    Config(masks=["m2po", "kl"], normalize=True, correction="tis", m2_threshold=0.1, kl_threshold=0.2)
    Config(loss="cispo", eps_high=0.4)  # CISPO's truncation is 1 + eps_high
    Config(correction="tis", normalize=True, level="sequence", masks=["kl"])
    Config(loss="clipped", eps_low=0.1, eps_high=0.4, dual_clip=3.0)
    Config(loss="gspo", correction="tis", masks=["opsm", "kl"], kl_level="seq_mean")  # TIS scales a token's term
    Config(loss="gmpo", correction="mis", level="geometric", aggregation="token-mean")
    Config(loss="sapo", tau_pos=0.5, tau_neg=2.0, proximal="interpolate", aggregation="bnpo")
    Config(aggregation="seq-mean-token-sum-norm", norm_tokens=64, drop_truncated=True)


def test_a_plugin_correction_that_reads_the_level_takes_it(monkeypatch):
    from lrl.registry import CORRECTIONS, Entry

    def level_reader(logp_trainer, logp_sampler, mask, options):
        return mask.to(logp_trainer.dtype)

    # the entry register_correction("level_reader", uses=("level",), per_row=True) makes
    entry = Entry("level_reader", level_reader, uses=("level",), per_row=True)
    monkeypatch.setitem(CORRECTIONS.entries, "level_reader", entry)
    assert Config(correction="level_reader", level="geometric").level == "geometric"
