"""How a decode step draws its tokens: torch.multinomial where the log-probs share the generator's device, and the
inverse of the cumulative distribution, from one seeded uniform a row, where they live on an accelerator."""

import math

import pytest
import torch

from lrl.decoding import MULTINOMIAL_VOCAB, inverse_cdf_tokens, sample_tokens, truncated_log_probs


def test_inverse_cdf_draws_follow_the_distribution_and_never_a_dropped_token():
    probs = torch.tensor([0.0, 0.1, 0.25, 0.0, 0.05, 0.6, 0.0])
    logp = probs.log().expand(40_000, -1)  # -inf where the mass is zero
    uniform = torch.rand(40_000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    token = inverse_cdf_tokens(logp, uniform).squeeze(1)
    counts = torch.bincount(token, minlength=len(probs)).double() / len(token)
    assert counts[probs == 0].sum() == 0
    # 40,000 draws: the standard error of a frequency is at most 0.0025; 0.01 is four of them
    assert torch.allclose(counts, probs.double(), atol=0.01), counts


def test_inverse_cdf_at_the_ends_of_the_unit_interval_picks_tokens_with_mass():
    probs = torch.tensor([[0.0, 0.0, 0.3, 0.7, 0.0, 0.0]])
    logp = probs.log()
    first = inverse_cdf_tokens(logp, torch.zeros(1, 1, dtype=torch.float64))
    last = inverse_cdf_tokens(logp, torch.full((1, 1), 1 - 2**-53, dtype=torch.float64))
    assert first.item() == 2
    assert last.item() == 3


def test_inverse_cdf_on_a_greedy_and_a_top_k_distribution():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))
    uniform = torch.rand(64, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    greedy = inverse_cdf_tokens(truncated_log_probs(logits, temperature=0), uniform).squeeze(1)
    assert torch.equal(greedy, logits.argmax(-1))
    top5 = truncated_log_probs(logits, top_k=5)
    token = inverse_cdf_tokens(top5, uniform)
    kept = logits.topk(5, dim=-1).indices
    assert (kept == token).any(-1).all()


def test_at_a_real_vocabulary_the_cpu_draws_by_the_inverse_cdf_of_one_uniform_a_row():
    """Above MULTINOMIAL_VOCAB words the CPU draw takes one uniform a row from the generator (not multinomial's
    stream), finds the token by the inverse CDF, and repeats with the seed."""
    vocab = MULTINOMIAL_VOCAB + 1
    logp = torch.log_softmax(3 * torch.randn(16, vocab, generator=torch.Generator().manual_seed(0)), -1)
    token, chosen = sample_tokens(logp, torch.Generator().manual_seed(7))
    uniform = torch.rand(16, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    assert torch.equal(token, inverse_cdf_tokens(logp, uniform).squeeze(1))
    assert torch.equal(chosen, logp.gather(1, token[:, None]).squeeze(1))
    again, _ = sample_tokens(logp, torch.Generator().manual_seed(7))
    assert torch.equal(token, again)


@pytest.mark.early
def test_the_inverse_cdf_draw_over_a_real_vocabulary_follows_the_distribution():
    """49,152 words: a few likely tokens and a long tail; the share drawn of each likely token and of the tail as
    a whole is within binomial error of its probability (the mass far down the vocabulary is not lost)."""
    vocab, n = 49_152, 8_000
    logits = torch.full((vocab,), -9.0)
    logits[[3, 20_000, 49_151]] = torch.tensor([2.0, 1.0, 0.5])
    logp = torch.log_softmax(logits, -1)
    uniform = torch.rand(n, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    token = torch.cat([inverse_cdf_tokens(logp.expand(len(u), vocab), u) for u in uniform.split(500)]).squeeze(1)
    p = logp.exp().double()
    for chosen in ([3], [20_000], [49_151]):
        share = torch.isin(token, torch.tensor(chosen)).double().mean()
        expected = p[chosen].sum()
        assert abs(share - expected) < 5 * (expected * (1 - expected) / n).sqrt(), (chosen, share, expected)
    tail = (~torch.isin(token, torch.tensor([3, 20_000, 49_151]))).double().mean()
    expected = 1 - p[[3, 20_000, 49_151]].sum()
    assert abs(tail - expected) < 5 * (expected * (1 - expected) / n).sqrt()


def test_on_one_device_the_draw_is_torch_multinomial_so_seeded_runs_repeat_their_earlier_tokens():
    logp = torch.log_softmax(torch.randn(8, 50, generator=torch.Generator().manual_seed(0)), -1)
    token, chosen = sample_tokens(logp, torch.Generator().manual_seed(7))
    expected = torch.multinomial(logp.exp(), 1, generator=torch.Generator().manual_seed(7)).squeeze(1)
    assert torch.equal(token, expected)
    assert torch.equal(chosen, logp.gather(1, expected[:, None]).squeeze(1))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU: log-probs on another device than the CPU"
)
def test_log_probs_on_a_gpu_draw_there_from_the_cpu_generator_and_repeat_with_the_seed():
    logp = torch.log_softmax(torch.randn(30, 151_936, generator=torch.Generator().manual_seed(0)), -1).cuda()
    a_token, a_logp = sample_tokens(logp, torch.Generator().manual_seed(5))
    b_token, _ = sample_tokens(logp, torch.Generator().manual_seed(5))
    assert a_token.device.type == "cpu" and a_logp.device.type == "cpu"
    assert torch.equal(a_token, b_token)
    assert torch.allclose(a_logp, logp.cpu().gather(1, a_token[:, None]).squeeze(1))
    assert math.isfinite(a_logp.sum().item())
