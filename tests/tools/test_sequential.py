"""decide --budget's sequential design (lrl_lab.experiments.sequential): looks, Holm at alpha / K, replay."""

import math

import pytest

from lrl_lab.experiments import sequential


def run(row, seed, greedy, k, looks=3):
    return {"row": row, "seed": seed, "greedy": greedy, "round": k, "looks": looks}


def rows_of(results):
    from lrl_lab.experiments.decide_tables import by_row

    return by_row(results)


def test_k_is_the_rounds_the_seeds_allow():
    assert sequential.planned_looks(8, 2) == 4 and sequential.planned_looks(7, 2) == 4
    assert sequential.planned_looks(3, 5) == 1


def test_a_large_difference_is_decided_at_an_early_look_and_a_null_one_goes_on():
    # 'big' is 0.5 above 'base' on every seed (with a little noise); 'same' straddles 0
    noise = [0.01, -0.02, 0.015, -0.01, 0.02, -0.015]
    straddle = [0.05, -0.05, 0.03, -0.04, 0.02, -0.03]
    results = []
    for s, (e, d) in enumerate(zip(noise, straddle)):
        k = s // 2 + 1  # two seeds a round, three rounds
        results += [run("base", s, 0.2, k), run("big", s, 0.7 + e, k), run("same", s, 0.2 + d, k)]
    comparisons = sequential.family(["base", "big", "same"], "base")
    assert [c.label for c in comparisons] == ["big - base", "same - base"]
    for k in (1, 2, 3):
        sequential.look(comparisons, rows_of([r for r in results if r["round"] <= k]), "greedy", k, looks=3)
    big, same = comparisons
    # two seeds (p 0.019 on one degree of freedom) do not pass Holm's 0.05 / 3 / 2 for the smaller p of two; four
    # do: decided at look 2, and it takes no more seeds
    assert big.decided == "a above b" and big.look == 2 and big.seeds == 4
    assert same.decided is None and same.seeds == 6
    assert sequential.open_rows(comparisons) == ["same", "base"]
    lines = "\n".join(sequential.summary(comparisons, 3, 3))
    assert "| big - base | 4 | 2 |" in lines and "| same - base | 6 | - |" in lines
    assert "not decided within the budget" in lines


def test_the_chapters_claims_are_the_family_where_their_rows_were_run():
    comparisons = sequential.family(["on-policy", "lag 8", "lag 8, TIS", "other"], "on-policy")
    assert [(c.a, c.b, c.sign) for c in comparisons] == [("lag 8", "on-policy", -1), ("lag 8, TIS", "lag 8", 1)]


def test_replay_from_the_records_reaches_the_verdicts_the_looks_reached():
    noise = [0.01, -0.02, 0.015, -0.01]
    results = []
    for s, e in enumerate(noise):
        k = s // 2 + 1
        results += [run("base", s, 0.2, k, looks=2), run("big", s, 0.7 + e, k, looks=2)]
    comparisons, looks, rounds = sequential.replay(results, ["base", "big"], "base", "greedy")
    assert (looks, rounds) == (2, 2)
    # one comparison, K = 2: its two seeds' p 0.019 is within 0.05 / 2 already at the first look
    assert comparisons[0].decided == "a above b" and comparisons[0].look == 1 and comparisons[0].seeds == 2
    assert sequential.replay([{"row": "a", "seed": 0, "greedy": 0.1}], ["a"], "a", "greedy")[0] == []


def test_a_round_is_priced_at_the_median_run():
    assert sequential.round_seconds([60.0, 100.0, 80.0], 4, 2) == pytest.approx(160.0)
    assert math.isnan(sequential.round_seconds([], 4, 2))


@pytest.mark.slow  # four tiny training runs in processes of their own: 42 s on 2 cores, out of the default run
def test_a_budgeted_command_runs_rounds_keeps_them_in_its_records_and_tables_them_again(tmp_path, capsys):
    import json

    from lrl_lab.experiments.decide import main

    out = tmp_path / "out"
    argv = ["--rows", "a=", "b=--lr 1e-3", "--seeds", "2", "--round-seeds", "1", "--budget", "1", "--samples", "0",
            "--threads", "1", "--metric", "greedy", "--out", str(out), "--", "--env", "tinyagent", "--max-steps", "1",
            "--eval-at-start", "false"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "at most 2 round(s) of 1 paired seed(s)" in printed and "round 1 of at most 2" in printed
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(r["row"], r["seed"], r["round"], r["looks"]) for r in runs} <= {
        (row, seed, seed + 1, 2) for row in "ab" for seed in (0, 1)
    }  # fmt: skip
    table = (out / "table.md").read_text()
    assert "Sequential verdicts (--budget)" in table and "| b - a |" in table
    command = table.splitlines()[1].removeprefix("Tabled again by: ")
    from lrl_lab.experiments import render

    assert render.render(command, tmp_path) == table.split("\n\n", 1)[1].rstrip() + "\n"  # the records replay it


def test_budget_and_its_rounds_are_checked_before_any_run(capsys):
    from lrl_lab.experiments.decide import main

    for argv, says in ((["--budget", "0"], "--budget 0: hours of runs"), (["--round-seeds", "0"], "--round-seeds 0"),
                       (["--budget", "1", "--from-results", "x.jsonl"], "--budget runs seeds")):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            main(["--rows", "a=", *argv])
        assert stop.value.code == 2 and says in capsys.readouterr().err
