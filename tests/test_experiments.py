"""The staleness experiment's table arithmetic (the runs themselves are measured, not tested here)."""

import math

import pytest

from lrl.experiments.staleness import METRICS, main, markdown, summarize


def fake(lag, corr, seed, heldout):
    return {
        "sampler": "lagged",
        "lag": lag,
        "correction": corr,
        "lr": 5e-4,
        "seed": seed,
        **{m: 0.5 for m in METRICS},
        "heldout": heldout,
    }


def test_summary_is_mean_and_standard_error_over_seeds():
    results = [fake(8, "none", s, h) for s, h in enumerate([0.8, 0.9, 1.0])]
    mean, se = summarize(results, ("lagged", 8, "none", 5e-4))["heldout"]
    assert mean == pytest.approx(0.9)
    assert se == pytest.approx(math.sqrt(0.01) / math.sqrt(3))  # sample std 0.1 over 3 seeds


def test_markdown_has_one_line_per_row_and_lr():
    results = [fake(lag, "none", s, 0.5) for lag in (0, 8) for s in range(2)]
    table = markdown(results, [("lagged", 0, "none"), ("lagged", 8, "none")], [5e-4], 2, 40)
    lines = [line for line in table.splitlines() if line.startswith("| 0.0005")]
    assert len(lines) == 2 and "0.500 ± 0.000" in lines[0]


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--steps", "2"], ["--lr", "0"], ["--level", "episode"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
