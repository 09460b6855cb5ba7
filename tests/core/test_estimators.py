"""Tests of the one-step bias/variance study (docs/offpolicy.md): the reference chapter's printed table, digit for digit, with the
package's own TIS and MIS weights, and the command line."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lrl.weights import mis_weights, tis_weights
from lrl_lab.experiments.estimators import (
    bias_variance,
    gradient_estimates,
    main,
    make_problem,
    sampler_logp,
    study,
    table_lines,
    weight_rules,
)

NUMBER = re.compile(r"\d+(?:\.\d+)?")

# From the table the reference chapter prints (not from this code): per sigma, KL(mu || pi), then
# (bias^2, variance) for none, full IS, TIS C=2, MIS [0.5, 5]. Every line is 84 characters, the header 105.
SPEC_ROWS = {
    "0.1": ["0.008", "0.012", "0.166", "0.000", "0.133", "0.000", "0.131", "0.000", "0.132"],
    "0.5": ["0.033", "0.046", "0.166", "0.000", "0.152", "0.001", "0.138", "0.002", "0.150"],
    "1.0": ["0.161", "0.291", "0.117", "0.000", "1.300", "0.265", "0.163", "0.368", "0.190"],
    "2.0": ["0.425", "0.737", "0.043", "0.005", "10.202", "0.741", "0.074", "0.819", "0.127"],
}


@pytest.fixture(scope="module")
def spec_table() -> list[str]:
    """The study at the reference settings (V=100, 64 samples, 4,000 repetitions, seed 0) -> printed lines."""
    return table_lines(study([0.1, 0.5, 1.0, 2.0]))


def test_table_matches_spec_digit_for_digit(spec_table):
    head, *rows = spec_table
    assert len(head) == 105 and NUMBER.findall(head) == ["2", "0.5", "5", "2"]
    assert [name in head for name in ("none", "full IS", "TIS C=2", "MIS [0.5, 5]")] == [True] * 4
    assert {len(row) for row in rows} == {84}
    assert {NUMBER.findall(row)[0]: NUMBER.findall(row)[1:] for row in rows} == SPEC_ROWS


def test_package_weights_are_the_spec_rules():
    """Token-level TIS is min(pi/mu, C); MIS keeps pi/mu inside [low, high] and zeroes it outside."""
    gen = torch.Generator().manual_seed(3)
    lp, lm = torch.randn(6, 50, generator=gen), torch.randn(6, 50, generator=gen)
    mask = (torch.rand(6, 50, generator=gen) < 0.8).float()
    ratio = (lp - lm).exp()
    assert torch.allclose(tis_weights(lp, lm, mask), ratio.clamp(max=2.0) * mask, rtol=1e-6)
    inside = (ratio >= 0.5) & (ratio <= 5.0)
    assert torch.allclose(mis_weights(lp, lm, mask), torch.where(inside, ratio, 0.0) * mask, rtol=1e-6)


def test_chunking_does_not_change_the_gradients():
    gen = torch.Generator().manual_seed(0)
    problem = make_problem(20, gen)
    logp_mu = sampler_logp(problem, 1.0, gen)
    actions = torch.multinomial(logp_mu.exp().expand(300, 20), 16, replacement=True, generator=gen)
    rule = weight_rules()["TIS C=2"]
    whole = gradient_estimates(problem, logp_mu, actions, rule, chunk=300)
    assert torch.equal(whole, gradient_estimates(problem, logp_mu, actions, rule, chunk=7))


def test_on_policy_estimators_are_unbiased():
    """With mu = pi every rule is the plain estimator; its bias shrinks like 1/reps and all rules agree."""
    gen = torch.Generator().manual_seed(1)
    problem = make_problem(30, gen)
    cells = [bias_variance(problem, problem.logp, fn, 32, 3000, gen) for fn in weight_rules().values()]
    for bias2, var in cells:
        assert bias2 < 0.05 and math.isfinite(var)


def test_cli_small_run_and_bad_input(capsys):
    assert main(["--reps", "20", "--sigmas", "0.5", "--cap", "3", "--low", "0.25", "--high", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "TIS C=3" in out[0] and "MIS [0.25, 4]" in out[0] and out[1].startswith("  0.5")
    for argv, text in [
        (["--reps", "1"], "--reps"),
        (["--low", "2", "--high", "1"], "--low"),
        (["--cap", "0"], "--cap"),
    ]:
        with pytest.raises(SystemExit):
            main(argv)
        assert text in capsys.readouterr().err
