"""The experiments' table arithmetic (the runs themselves are measured, not tested here)."""

import math

import pytest

from lrl_lab.experiments import seeds as seeds_experiment
from lrl_lab.experiments.staleness import METRICS, grid_rows, main, markdown, summarize, time_to


def fake(lag, corr, seed, heldout, level="token"):
    return {
        "sampler": "lagged",
        "lag": lag,
        "correction": corr,
        "level": level,
        "lr": 5e-4,
        "seed": seed,
        **{m: 0.5 for m in METRICS},
        "heldout": heldout,
    }


def test_summary_is_mean_and_standard_error_over_seeds():
    results = [fake(8, "none", s, h) for s, h in enumerate([0.8, 0.9, 1.0])]
    mean, se = summarize(results, ("lagged", 8, "none", "token", 5e-4))["heldout"]
    assert mean == pytest.approx(0.9)
    assert se == pytest.approx(math.sqrt(0.01) / math.sqrt(3))  # sample std 0.1 over 3 seeds


def test_markdown_has_one_line_per_row_and_lr():
    results = [fake(lag, "none", s, 0.5) for lag in (0, 8) for s in range(2)]
    rows = [("lagged", 0, "none", "token"), ("lagged", 8, "none", "token")]
    table = markdown(results, rows, [5e-4], 2, 40, [])
    lines = [line for line in table.splitlines() if line.startswith("| 0.0005")]
    assert len(lines) == 2 and "0.500 ± 0.000" in lines[0]


def test_grid_rows_correct_only_stale_data():
    rows = grid_rows("engine", [0, 4], ["none", "tis", "mis"], ["token", "sequence"])
    assert rows[:2] == [("engine", 0, "none", "token"), ("engine", 4, "none", "token")]
    assert len(rows) == 2 + 2 * 2 and all(lag == 4 for _, lag, c, _ in rows if c != "none")


def test_time_to_target_counts_training_seconds_until_the_running_mean_reaches_it():
    history = [
        {"train/reward": r, "time/sample": 1.0, "time/update": 0.5} for r in (0.5, 0.9, 0.95, 0.95, 1.0)
    ]
    assert time_to(history, 0.9) == pytest.approx(6.0)  # the mean of steps 2-4 is 0.933 at the 4th step
    assert math.isnan(time_to(history, 0.99))


def test_seed_table_has_mean_se_and_minimum():
    results = [
        {"seed": s, "pass_rate": p, "reads": 1.0, "invalid": 0.0, "max_late_train_invalid": 0.05}
        for s, p in enumerate([0.9, 0.8, 1.0])
    ]
    table = seeds_experiment.markdown(results, [], ["reads"], "a test machine")
    assert "| mean ± SE | 0.900 ± 0.058 |" in table and "| minimum | 0.800 |" in table


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--steps", "2"], ["--lr", "0"], ["--level", "episode"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2


def test_an_emulated_machine_perturbs_every_weight_by_one_part_in_ten_million(tiny_policy):
    import copy

    import torch

    a = seeds_experiment.perturbed(copy.deepcopy(tiny_policy), 1)
    b = seeds_experiment.perturbed(copy.deepcopy(tiny_policy), 1)
    c = seeds_experiment.perturbed(copy.deepcopy(tiny_policy), 2)
    for p, pa, pb, pc in zip(tiny_policy.parameters(), a.parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb)  # the same noise seed is the same machine
        nonzero = p != 0
        rel = ((pa - p).abs() / p.abs())[nonzero]
        assert rel.max() < 1e-6 and rel.median() > 1e-9  # every weight moved, by about 1e-7 of itself
        assert not torch.equal(pa, pc) or not nonzero.any()


def test_the_machine_summary_names_the_failing_seeds():
    results = [
        {"seed": s, "machine": m, "pass_rate": p, "warnings": 0}
        for m, rates in (("here", [0.9, 0.95]), ("perturb1", [0.9, 0.6]))
        for s, p in enumerate(rates)
    ]
    table = seeds_experiment.summary(results, ["here", "perturb1"])
    assert "| here |" in table and "| none |" in table
    assert "| perturb1 |" in table and "| 0.600 | 1 |" in table


def test_an_unknown_machine_is_refused():
    with pytest.raises(SystemExit) as exit_:
        seeds_experiment.main(["--machines", "here,moon", "--seeds", "1"])
    assert exit_.value.code == 2
