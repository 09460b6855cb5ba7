"""The decisive tables' arithmetic: intervals, paired differences, verdicts, and the rows they are read from."""

import json
import math
import os
import shlex

import pytest
import torch
from helpers import without_counts

from lrl_lab.experiments.decide import machine_name, parse_rows
from lrl_lab.experiments.decide_tables import (
    exact_mcnemar,
    holm,
    holm_verdict,
    interval,
    markdown,
    paired,
    paired_p,
    provenance_lines,
    regularized_beta,
    seeds_needed,
    wilson,
)
from lrl_lab.experiments.records import code_fingerprint


def test_the_interval_is_students_t_over_the_seeds():
    mean, half, sd = interval([0.1, 0.3, 0.2, 0.4])
    assert mean == pytest.approx(0.25)
    assert sd == pytest.approx(math.sqrt(((0.15**2) * 2 + (0.05**2) * 2) / 3))
    assert half == pytest.approx(3.182 * sd / 2)  # t(3) at 95%, over sqrt(4)
    assert math.isnan(interval([0.5])[1])


def test_the_paired_t_tests_p_is_students_two_sided_tail():
    # the 97.5% points of Student's t: t(1) = 12.706, t(9) = 2.262, t(30) = 2.042 -> p = 0.05 each
    for t, df in ((12.706, 1), (2.262, 9), (2.042, 30)):
        assert regularized_beta(df / 2, 0.5, df / (df + t * t)) == pytest.approx(0.05, abs=2e-4)
    assert paired_p([0.1, 0.1, 0.1]) < 1e-12 and paired_p([0.0, 0.0]) == 1.0 and math.isnan(paired_p([0.3]))
    assert paired_p([0.2, -0.2, 0.1, -0.1]) == pytest.approx(1.0)
    scipy = pytest.importorskip("scipy.stats")
    xs = [0.12, -0.03, 0.25, 0.08, 0.31, -0.1, 0.05, 0.18]
    assert paired_p(xs) == pytest.approx(scipy.ttest_1samp(xs, 0.0).pvalue, rel=1e-9)


def test_holm_adjusts_a_family_step_down_and_verdicts_follow_it():
    # p = 0.01, 0.04, 0.03 of three: 3 x 0.01 = 0.03; then 2 x 0.03 = 0.06; then max(0.06, 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5] and holm([0.02, 0.9]) == pytest.approx([0.04, 0.9])
    adjusted = holm([0.01, float("nan")])  # a comparison without a p still counts in the family
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1])
    assert holm_verdict(-0.2, 0.03, -1) == "holds"
    assert holm_verdict(0.2, 0.03, -1) == "does not hold"
    assert holm_verdict(-0.2, 0.06, -1) == "not decided at this power"
    assert holm_verdict(0.2, float("nan"), +1) == "not decided at this power"


def test_paired_differences_use_the_seeds_both_rows_have():
    rows = {"a": {0: {"m": 0.5}, 1: {"m": 0.7}, 2: {"m": 0.1}}, "b": {0: {"m": 0.4}, 2: {"m": 0.3}}}
    assert paired(rows, "a", "b", "m") == pytest.approx([0.1, -0.2])


def test_seeds_needed_grow_with_the_spread_and_shrink_with_the_effect():
    assert seeds_needed(0.1, 0.1) == math.ceil((2.8 * 1.0) ** 2)
    assert seeds_needed(0.2, 0.1) > seeds_needed(0.1, 0.1) > seeds_needed(0.1, 0.2)


def test_the_share_that_learned_has_wilsons_interval_and_mcnemars_exact_p():
    assert wilson(8, 8) == pytest.approx((0.6756, 1.0), abs=1e-4)  # the textbook values at n = 8
    assert wilson(0, 8) == pytest.approx((0.0, 0.3244), abs=1e-4)
    assert wilson(5, 8) == pytest.approx((0.3057, 0.8632), abs=1e-4)
    # discordant seeds 3 to 0: each way at even odds gives 0 or 3 of 3 with probability 2 / 8
    assert exact_mcnemar(0, 3) == pytest.approx(0.25) == exact_mcnemar(3, 0)
    assert exact_mcnemar(0, 0) == 1.0 and exact_mcnemar(2, 2) == 1.0
    assert exact_mcnemar(0, 6) == pytest.approx(2 / 64)


def two_rows(a: str, b: str, values: list[tuple[float, float]]) -> list[dict]:
    """Runs of rows a and b, seed by seed, every measure of a run at its value (held-out greedy 0.1 at the start)."""
    return [
        {
            "row": row,
            "seed": seed,
            "sampled": value,
            "greedy": value,
            "reward": value,
            "greedy_first": 0.1,
            "mismatch": 0.0,
            "over_cap": 0.0,
            "wall": 60.0,
        }  # fmt: skip
        for seed, pair in enumerate(values)
        for row, value in zip((a, b), pair)
    ]


def test_the_table_counts_the_runs_that_learned_and_pairs_them():
    results = two_rows("on-policy", "FP8", [(0.5, 0.5), (0.6, 0.1), (0.55, 0.12), (0.5, 0.6)])
    table = markdown(results, ["on-policy", "FP8"], "on-policy", 0.1, "greedy", gain=0.25)
    assert "| 4 of 4 (0.51-1.00) |" in table and "| 2 of 4 (0.15-0.85) |" in table
    # seeds 1 and 2 learned on-policy only: in the paired differences and in the claim "FP8 costs"
    assert table.count("| 0, 2 (0.50) |") == 2
    claim = next(line for line in table.splitlines() if line.startswith("| FP8 costs"))
    # a - b: 0, -0.5, -0.43, +0.1 by seed, mean -0.2075, sd 0.3015: t(3) 3.182 gives a half-width of 0.480; t =
    # -1.376 on 3 degrees of freedom, two-sided p 0.262; the family is this one claim, so Holm's p is the same
    # the count of runs that learned and its exact test lead the claim's line; the mean second
    assert claim.startswith("| FP8 costs (FP8 below on-policy) | 0, 2 (0.50) | -0.208 ± 0.480 |"), claim
    assert claim.endswith("± 0.480 | 4 | 0.262 | 0.262 | not decided at this power |"), claim


def test_the_table_reads_each_kind_of_problem_apart():
    kinds = {"plain": [0, 1], "story": [2, 3, 4, 5]}
    results = [{**run, "kinds": kinds, "evals": [{"solved": []}, {"solved": solved}]}
               for run, solved in zip(two_rows("on-policy", "FP8", [(0.5, 0.4), (0.6, 0.1)]),
                                      [[0, 1, 2], [0], [0, 1], [1, 7]])]  # fmt: skip
    table = markdown(results, ["on-policy", "FP8"], "on-policy", 0.1, "greedy")
    assert "| row | runs | plain (2) | story (4) |" in table
    # on-policy's last evaluations passed 2 of 2 and 2 of 2 plain, 1 of 4 and 0 of 4 stories (a problem outside
    # the held-out set, 7, counts in no kind); FP8's 1 of 2 and 1 of 2 plain, no story
    assert "| on-policy | 2 | 0.00 ± 0.00 -> 1.00 ± 0.00 | 0.00 ± 0.00 -> 0.12 ± 1.59 |" in table
    assert "| FP8 | 2 | 0.00 ± 0.00 -> 0.50 ± 0.00 | 0.00 ± 0.00 -> 0.00 ± 0.00 |" in table
    assert "by kind" not in markdown(two_rows("a", "b", [(0.5, 0.4)]), ["a", "b"], "a", 0.1, "greedy")


def test_calc_problems_are_plain_where_the_question_states_the_expression():
    from lrl.envs.calc.tasks import make_calc_tasks

    held = make_calc_tasks("heldout")
    assert {t.kind for t in held} == {"plain", "story"}
    for t in held:  # the plain questions are those that ask "What is a op b?"
        assert (t.kind == "plain") == (t.prompt == f"What is {t.a} {t.op} {t.b}?"), t


def test_each_run_has_a_process_of_its_own_and_every_run_comes_back():
    from lrl_lab.experiments.decide import each_in_its_own_process

    cells = ["__import__('os').getpid()"] * 3  # eval in the run's process: its pid
    got = [(cell, future.result()) for cell, future in each_in_its_own_process(cells, 2, fn=eval)]
    pids = [pid for _, pid in got]
    assert len(got) == 3 and len(set(pids)) == 3 and os.getpid() not in pids
    assert [cell for cell, _ in got] == cells


def test_rows_come_from_presets_and_labels():
    rows = parse_rows(["fast", "lag 4=--sampler lagged --lag 4"])
    assert rows == {"on-policy": "", "lag 8": "--sampler lagged --lag 8", "lag 4": "--sampler lagged --lag 4"}
    with pytest.raises(ValueError, match="LABEL=FLAGS"):
        parse_rows(["nonsense"])


def test_the_table_names_each_claim_it_can_judge():
    results = two_rows("on-policy", "lag 8", [(0.5, 0.3), (0.6, 0.35), (0.55, 0.3), (0.5, 0.32)])
    table = markdown(results, ["on-policy", "lag 8"], "on-policy", 0.1, "sampled")
    assert "| staleness costs (lag 8 below on-policy) |" in table
    assert "| holds |" in table  # every seed: lag 8 is 0.18 to 0.25 below on-policy
    assert "TIS recovers" not in table  # its row was not run


def test_a_results_file_is_tabled_by_its_own_rows_against_its_first(tmp_path, capsys):
    import json

    from lrl_lab.experiments.decide import main

    keys = ("greedy_first", "greedy", "sampled", "reward", "mismatch", "over_cap", "wall")
    runs = [
        {"row": row, "seed": seed, **dict.fromkeys(keys, value + seed / 10)}
        for row, value in (("mine", 0.2), ("yours", 0.5))
        for seed in (0, 1, 2)
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert main(["--from-results", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Paired differences from **mine**" in out
    assert "| yours | 3 | 0.300" in without_counts(out)  # yours minus mine, 0.3 on every seed
    assert main(["--from-results", str(path), "--rows", "yours="]) == 0  # only the rows named
    out = capsys.readouterr().out
    assert "| yours | 3 |" in out and "| mine |" not in out


def test_a_runs_mismatch_is_the_mean_over_the_steps_that_measured_it():
    from lrl_lab.experiments.decide_tables import markdown, measured_mean

    # under bypass a step with nothing to train logs no mismatch: it is left out, not counted as 0
    assert measured_mean([0.3, None, 0.1, None], float("nan")) == pytest.approx(0.2)
    assert math.isnan(measured_mean([None, None], float("nan")))
    base = {"greedy_first": 0.1, "greedy": 0.2, "sampled": 0.2, "reward": 0.1, "wall": 60.0}
    steps = lambda m: [{"step": 0, "mismatch": m, "over_cap": 0.04}, {"step": 1}]  # noqa: E731
    bypass = [
        {"row": "bypass", "seed": s, **base, "mismatch": m / 2, "over_cap": 0.02, "history": steps(m)}
        for s, m in ((0, 0.2), (1, 0.4))
    ]  # the means as an older record has them: the step without, as 0
    plain = [
        {"row": "plain", "seed": s, **base, "mismatch": 0.5, "over_cap": 0.02} for s in (0, 1)
    ]  # no step records
    table = markdown(plain + bypass, ["plain", "bypass"], "plain", 0.1, "greedy")
    cells = {}  # the first table's row of each label: its mismatch and over-cap cells
    for line in (line for line in table.splitlines() if line.startswith("| ")):
        cells.setdefault(line.split(" | ")[0], line.split(" | ")[7:9])
    assert cells["| bypass"] == ["0.300 ± 1.271", "0.040 ± 0.000"]  # t(1) = 12.706: 12.706 * 0.1414 / sqrt(2)
    assert cells["| plain"] == ["0.500 ± 0.000", "0.020 ± 0.000"]  # the recorded means


def test_rows_that_would_be_refused_are_named_before_anything_runs(tmp_path, capsys):
    from lrl_lab.experiments.decide import main

    out = tmp_path / "out"
    code = main(["--rows", "low=--lr -1", "fine=", "cold=--temperature -1", "--seeds", "1", "--samples", "0",
                 "--out", str(out), "--", "--env", "tinyagent"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "row 'low' (--lr -1): lr:" in err and "row 'cold' (--temperature -1): temperature:" in err
    assert "'fine'" not in err and "nothing was run (2 problem(s) above)" in err
    assert not out.exists()


@pytest.mark.early
def test_jobs_whose_runs_together_exceed_the_memory_are_refused(monkeypatch, smollm2_cut):
    from lrl.arguments import parse_args
    from lrl.budget import SHARE
    from lrl.run import plan_run
    from lrl_lab.experiments import decide

    rows = {"on-policy": "", "lag 8": "--sampler lagged --lag 8"}
    flags = ["--env", "calc", "--model", str(smollm2_cut)]
    monkeypatch.setattr("lrl.budget.available_bytes", lambda: 10**12)
    peaks = {}
    for label, row in rows.items():  # each row's plan on a machine with room for anything
        plan = plan_run(parse_args(decide.run_argv(flags, row, 0, 1)))[2]
        peaks[label] = plan.step_peak
    assert peaks["lag 8"] > peaks["on-policy"]  # the lagged sampler's copies count
    assert decide.check_rows(rows, flags, 0, 2, 1) == []
    room = (peaks["lag 8"] + peaks["on-policy"] / 2) / SHARE  # one lag-8 run fits, it and any other do not
    monkeypatch.setattr("lrl.budget.available_bytes", lambda: int(room))
    assert decide.check_rows(rows, flags, 0, 1, 1) == []
    (problem,) = decide.check_rows(rows, flags, 0, 2, 1)
    assert problem.startswith("--jobs 2: the costliest runs side by side ('lag 8'") and problem.endswith(
        "--jobs 1 fits"
    )
    # two runs of one row are two runs: two lag-8 seeds side by side do not fit, two on-policy ones do
    lag = {"lag 8": rows["lag 8"]}
    assert len(decide.check_rows(lag, flags, 0, 2, 1, {"lag 8": 2})) == 1
    assert decide.check_rows(lag, flags, 0, 2, 1, {"lag 8": 1}) == []
    assert decide.check_rows({"on-policy": ""}, flags, 0, 2, 1, {"on-policy": 2}) == []


@pytest.mark.early
def test_a_run_that_fails_is_named_and_the_others_run_and_keep_their_steps(tmp_path, capsys):
    from lrl_lab.experiments.decide import main

    out = (
        tmp_path / "out"
    )  # an lr this large makes the first gradient non-finite: refused by the update, mid-run
    code = main(["--rows", "on-policy=", "huge=--lr 1e30", "--seeds", "1", "--samples", "0", "--out", str(out),
                 "--metric", "greedy", "--", "--env", "tinyagent", "--max-steps", "3"])  # fmt: skip
    said = capsys.readouterr()
    err = said.err
    assert code == 1
    assert "huge seed 0 failed: non-finite gradient" in err  # in one line
    started = [line for line in said.out.splitlines() if line.startswith("started ")]
    assert [line.rsplit(" at ", 1)[0] for line in started] == [
        "started on-policy seed 0",
        "started huge seed 0",
    ]
    assert "min left" in said.out  # after the first run of two: an estimate of the rest
    assert "1 of 2 runs failed" in err
    (line,) = (out / "results.jsonl").read_text().splitlines()  # the other run, finished and kept
    r = json.loads(line)
    assert (r["row"], r["seed"], r["steps"]) == ("on-policy", 0, 3)
    assert "micro_tokens" in r  # None: the built-in policy has no memory plan to narrow
    assert [h["step"] for h in r["history"]] == [0, 1, 2]
    assert set(r["history"][0]) >= {"reward", "skipped", "loss", "update_s", "action_tokens"}
    assert r["reward"] == sum(h["reward"] for h in r["history"]) / 3
    assert r["skipped"] == sum(h["skipped"] for h in r["history"])
    held = r["kinds"]["all"]  # TinyAgent's tasks name no kind: one kind, every held-out problem
    assert list(r["kinds"]) == ["all"] and len(held) == len(set(held)) > 0
    assert all(set(e["solved"]) <= set(held) for e in r["evals"])
    table = (out / "table.md").read_text()
    assert "on-policy" in table and f"| all ({len(held)}) |" in table
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the figure beside the table
    assert (r["machine"], r["precision"]) == (
        machine_name("cpu"),
        "fp32",
    )  # a 153k-parameter policy: fp32 anywhere
    assert r["torch"] == torch.__version__ and r["commit"]
    # what made it, whole: the flags of every run, the configuration they resolved to, the training code
    assert r["shared_flags"] == "--env tinyagent --max-steps 3" and r["argv"][:4] == [
        "--env",
        "tinyagent",
        "--max-steps",
        "3",
    ]
    assert (r["settings"]["env"], r["settings"]["max_steps"], r["settings"]["lr"]) == ("tinyagent", 3, 1e-3)
    assert "seed" not in r["settings"] and r["code"] == code_fingerprint() and len(r["code"]) == 16
    assert f"- 1 run(s) on {r['machine']}, fp32, torch {r['torch']}, at {r['commit']}" in table
    header, again, _, body = table.split("\n", 3)  # the command its header names prints the same tables
    assert header == "train.py flags of every run: --env tinyagent --max-steps 3"
    assert again.startswith("Tabled again by: python -m lrl_lab.experiments.decide --from-results ")
    assert main(shlex.split(again.removeprefix("Tabled again by: "))[3:]) == 0
    assert capsys.readouterr().out == body + "\n"


def test_runs_of_another_machine_are_not_resumed_into_and_the_tables_say_where_runs_come_from(
    tmp_path, capsys
):
    from lrl_lab.experiments.decide import main

    other = {"row": "on-policy", "flags": "", "seed": 0, "greedy_first": 0.1, "greedy": 0.5, "sampled": 0.4,
             "reward": 0.3, "mismatch": 0.0, "over_cap": 0.0, "wall": 60.0, "machine": "8-core Elsewhere (amx_bf16)",
             "precision": "bf16", "torch": "2.13.0", "commit": "abc1234"}  # fmt: skip
    (tmp_path / "results.jsonl").write_text(json.dumps(other) + "\n")
    argv = ["--rows", "on-policy=", "--seeds", "2", "--samples", "0", "--out", str(tmp_path), "--", "--env",
            "tinyagent", "--max-steps", "1"]  # fmt: skip
    assert main(argv) == 2  # seed 1 would run here, beside seed 0 of another machine
    err = capsys.readouterr().err
    assert "holds runs of 8-core Elsewhere (amx_bf16)" in err and machine_name("cpu") in err
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 1  # nothing ran
    mine = dict(other, seed=1, machine=machine_name("cpu"), precision="fp32", commit="def5678")
    unknown = {k: v for k, v in other.items() if k not in ("machine", "precision", "torch", "commit")}
    lines = provenance_lines([other, mine, dict(mine, seed=2, commit="0123abc"), dict(unknown, seed=3)])
    assert lines[1] == "- 1 run(s) on 8-core Elsewhere (amx_bf16), bf16, torch 2.13.0, at abc1234"
    assert lines[2] == f"- 2 run(s) on {machine_name('cpu')}, fp32, torch 2.13.0, at def5678, 0123abc"
    assert lines[3] == "- 1 run(s) without a record of their machine, arithmetic or commit"
    assert "more than one machine" in lines[4]
    assert not any("more than one" in line for line in provenance_lines([mine]))


def test_stretches_between_evaluations_pair_the_held_out_change_with_the_mismatch_of_their_steps(
    tmp_path, capsys
):
    from lrl_lab.experiments.decide import main

    def run(seed, rates, mismatches, grad_norms, skipped=()):
        history = [{"step": k, "skipped": float(k in skipped), "mismatch": m, "grad_norm": g}
                   for k, (m, g) in enumerate(zip(mismatches, grad_norms))]  # fmt: skip
        evals = [{"step": 2 * i, "pass_rate": r, "solved": []} for i, r in enumerate(rates)]
        return {"row": "lag 8", "seed": seed, "greedy_first": rates[0], "greedy": rates[-1], "sampled": 0.0,
                "reward": 0.0, "mismatch": 0.0, "over_cap": 0.0, "wall": 60.0, "evals": evals,
                "history": history}  # fmt: skip

    runs = [
        # evaluations at steps 0, 2, 4: stretches of steps 0-1 and 2-3; step 3 skipped (it counts in no mean)
        run(0, [0.1, 0.5, 0.25], [0.2, 0.4, 0.6, 9.0], [1.0, 2.0, 3.0, 99.0], skipped={3}),
        run(1, [0.1, 0.2, 0.2], [0.1, 0.1, 0.3, 0.5], [1.0, 1.0, 2.0, 2.0]),
        {
            "row": "lag 8",
            "seed": 2,
            "greedy_first": 0.1,
            "greedy": 0.3,
            "sampled": 0.0,
            "reward": 0.0,
            "mismatch": 0.0,
            "over_cap": 0.0,
            "wall": 60.0,
        },  # fmt: skip
    ]  # seed 2 kept no step records: no stretch of it is tabled
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert main(["--from-results", str(path), "--stretches", "lag 8"]) == 0
    out = capsys.readouterr().out
    assert "| 0 | 0-1 | +0.400 | 0.30 | 1.50 |" in out and "| 0 | 2-3 | -0.250 | 0.60 | 3.00 |" in out
    assert "| 1 | 0-1 | +0.100 | 0.10 | 1.00 |" in out and "| 1 | 2-3 | +0.000 | 0.40 | 2.00 |" in out
    assert "| 2 |" not in out
    assert "held-out rate fell over 1 of 2, mismatch 0.60\n" in out
    assert "held-out rate stayed over 1 of 2, mismatch 0.40\n" in out
    assert "held-out rate rose over 0 of 2\n" in out
    with pytest.raises(SystemExit):
        main(["--from-results", str(path), "--stretches", "lag 4"])
    assert "--stretches: 'lag 4' not among the rows (lag 8)" in capsys.readouterr().err
    assert (
        "| 0 | 0-1 | +0.400 | 0.30 | 1.50 | - / - | - / - |" in out
    )  # records from before the clip's figures


def test_stretches_show_the_clip_by_the_sign_of_the_advantage(tmp_path, capsys):
    """A stretch's clipped shares are the mean over its trained steps, and the share of each sign's gradient let
    through is each step's push / adv averaged: (1/2 + 1) / 2 for A > 0, not the ratio of the sums (2/3); so is the
    negative advantages' weight against the positive ones' (adv_neg / adv_pos: (1 + 2) / 2)."""
    from lrl_lab.experiments.decide import main

    steps = [
        {"step": 0, "skipped": 0.0, "mismatch": 0.3, "grad_norm": 1.0, "clip_pos": 0.02, "clip_neg": 0.0,
         "push_pos": 1.0, "push_neg": 3.0, "adv_pos": 2.0, "adv_neg": 2.0},
        {"step": 1, "skipped": 0.0, "mismatch": 0.3, "grad_norm": 1.0, "clip_pos": 0.04, "clip_neg": 0.01,
         "push_pos": 1.0, "push_neg": 1.0, "adv_pos": 1.0, "adv_neg": 2.0},
        {"step": 2, "skipped": 1.0, "mismatch": 0.3},  # skipped: no update, no clip figures
    ]  # fmt: skip
    run = {
        "row": "FP8, bypass",
        "seed": 0,
        "greedy_first": 0.1,
        "greedy": 0.0,
        "sampled": 0.0,
        "reward": 0.0,
        "mismatch": 0.3,
        "over_cap": 0.0,
        "wall": 60.0,
        "history": steps,
        "evals": [{"step": 0, "pass_rate": 0.1, "solved": []}, {"step": 3, "pass_rate": 0.0, "solved": []}],
    }
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(run) + "\n")
    assert main(["--from-results", str(path), "--stretches", "FP8, bypass"]) == 0
    assert (
        "| 0 | 0-2 | -0.100 | 0.30 | 1.00 | 3.0% / 0.5% | 75.0% / 100.0% | 1.50 |" in capsys.readouterr().out
    )


def three_rows() -> list[dict]:
    """Rows over four seeds: "b" below "a" on every seed (by 0.2 to 0.3), "c" on both sides of it."""
    values = {"a": [0.5, 0.6, 0.4, 0.7], "b": [0.2, 0.35, 0.15, 0.45], "c": [0.6, 0.5, 0.5, 0.6]}
    return [
        {"row": row, "seed": seed, "greedy": v, "sampled": v, "reward": v, "greedy_first": 0.1}
        for row, vs in values.items()
        for seed, v in enumerate(vs)
    ]


def test_the_figure_draws_each_rows_interval_and_its_paired_difference_coloured_by_its_side_of_zero():
    from lrl_lab.experiments.decide_plot import draw, forest

    entries = forest(three_rows(), ["a", "b", "c"], "a", "greedy")
    fig = draw(entries, "a", "greedy", 0.1)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_yticklabels()] == ["a", "b", "c"]  # the first row at the top

    def bars(ax):
        """Each error bar's (low, high) along x and its colour, top row first."""
        out = []
        for c in ax.containers:
            (low, y), (high, _) = c.lines[2][0].get_segments()[0]
            out.append((y, low, high, c.lines[0].get_color()))
        return [b[1:] for b in sorted(out, reverse=True)]

    def expected(xs):  # mean +- t(3) sd / 2, over four seeds
        mean = sum(xs) / 4
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / 3)
        return mean - 3.182 * sd / 2, mean + 3.182 * sd / 2

    for (low, high, _), row in zip(bars(left), ("a", "b", "c")):
        xs = [r["greedy"] for r in three_rows() if r["row"] == row]
        assert (low, high) == pytest.approx(expected(xs), abs=1e-9)
    (b_low, b_high, b_colour), (c_low, c_high, c_colour) = bars(right)  # the baseline has no difference
    assert (b_low, b_high) == pytest.approx(expected([-0.3, -0.25, -0.25, -0.25]), abs=1e-9)
    assert b_high < 0 and b_colour == "tab:red"  # wholly below 0: decided
    assert c_low < 0 < c_high and c_colour == "black"  # +0.1, -0.1, +0.1, -0.1: not decided
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_decide_writes_its_figure_from_a_results_file_and_refuses_a_format_it_cannot_write(tmp_path, capsys):
    from lrl_lab.experiments.decide import main

    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps({**r, "mismatch": 0.0, "over_cap": 0.0, "wall": 60.0}) + "\n"
                            for r in three_rows()))  # fmt: skip
    assert (
        main(["--from-results", str(path), "--metric", "greedy", "--plot", str(tmp_path / "rows.png")]) == 0
    )
    assert f"figure: {tmp_path / 'rows.png'}" in capsys.readouterr().out
    assert (tmp_path / "rows.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit) as stop:
        main(["--from-results", str(path), "--plot", str(tmp_path / "rows.jpeg")])
    assert stop.value.code == 2 and "--plot: " in capsys.readouterr().err
    assert not (tmp_path / "rows.jpeg").exists()


def test_without_matplotlib_the_figure_is_one_line_and_the_tables_stand(tmp_path, monkeypatch):
    import sys

    from lrl_lab.experiments.decide_plot import figure_line

    monkeypatch.setitem(
        sys.modules, "matplotlib", None
    )  # import matplotlib fails as where it is not installed
    line = figure_line(three_rows(), ["a", "b", "c"], "a", "greedy", 0.1, tmp_path / "rows.png", "here")
    assert line.startswith("figure not drawn: matplotlib is not installed (pip install matplotlib)")
    assert not (tmp_path / "rows.png").exists()


def test_the_step_records_keep_what_each_mask_dropped():
    """A step's figures in results.jsonl: the named metrics under their short names, each rule's dropped shares
    without the ``offpolicy/`` prefix, and nothing else the step logged."""
    from lrl_lab.experiments.decide_tables import step_figures

    logged = {"step": 3, "train/reward": 0.25, "train/clip_neg": 0.02, "mismatch/abs_mean": 0.3,
              "offpolicy/dropped_tokens/opsm": 0.19, "offpolicy/dropped_seqs/opsm": 0.25,
              "offpolicy/dropped_tokens/kl": 0.17, "offpolicy/ess": 0.8, "time/update": 4.0}  # fmt: skip
    assert step_figures(logged) == {"step": 3, "reward": 0.25, "clip_neg": 0.02, "mismatch": 0.3, "update_s": 4.0,
                                    "dropped_tokens/opsm": 0.19, "dropped_seqs/opsm": 0.25,
                                    "dropped_tokens/kl": 0.17}  # fmt: skip
