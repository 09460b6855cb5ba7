"""The simulator of lrl's own pipeline (lrl_lab.sim.board) against hand calculations, and the five-designs
experiment's measured quantities on a history whose numbers are known."""

from __future__ import annotations

import math
import random

import pytest

from lrl_lab.experiments.designs import measured, token_hist, total_variation
from lrl_lab.experiments.workload import GROUP, GROUPS, SLOTS
from lrl_lab.sim.board import simulate_board


def test_synchronous_steps_last_the_slowest_episode_plus_training():
    # 2 groups of 2: durations per batch 1, 1, 1, 4 -> each step waits 4 s, then trains 0.5 s
    durations = [1.0, 1.0, 1.0, 4.0] * 10
    sim = simulate_board(durations, 4, 2, 2, 0.5, 0.0, 0, True, 5, sync_before=True)
    assert sim["step_ends"] == pytest.approx([4.5 * k for k in range(1, 6)])
    assert sim["episodes_per_s"] == pytest.approx(4 / 4.5)
    assert sim["slot_util"] == pytest.approx((1 + 1 + 1 + 4) / (4 * 4.5))
    assert sim["staleness_max"] == 0 and sim["dropped"] == 0


def test_a_bound_of_one_overlaps_generation_with_training():
    # constant 1 s episodes, 4 slots, batch 4, train 1 s: once the pipeline is full, one step a second
    sim = simulate_board([1.0] * 200, 4, 2, 2, 1.0, 0.0, 1, True, 8)
    gaps = [b - a for a, b in zip(sim["step_ends"], sim["step_ends"][1:])]
    assert gaps[-3:] == pytest.approx([1.0, 1.0, 1.0])
    assert sim["staleness_max"] == 1  # the next batch was generated on the weights before the last step


def test_the_consumer_drops_what_the_throttle_let_grow_stale():
    # a straggler of 3 s in the first group (steps take about 0.5 s): without the drop it is trained late
    durations = [3.0] + [0.2] * 400
    kept = simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 12, drop=False)
    bounded = simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 12, drop=True)
    assert kept["staleness_max"] > 1 and kept["dropped"] == 0
    assert bounded["staleness_max"] <= 1 and bounded["dropped"] >= 1


def test_drain_starts_nothing_while_episodes_of_the_old_weights_run():
    durations = [3.0, 0.1, 0.1, 0.1] * 50
    drain = simulate_board(durations, 4, 2, 2, 0.2, 0.0, 2, False, 6)
    partial = simulate_board(durations, 4, 2, 2, 0.2, 0.0, 2, True, 6)
    assert drain["time"] > partial["time"]


def test_measured_rates_of_a_known_history():
    batch = GROUP * GROUPS
    history = []
    for step in range(6):
        history.append(
            {
                "step": step,
                "time/end": 10.0 + 2.0 * step,
                "trained_ids": [f"0:{step * batch + i}" for i in range(batch)],
                "time/episode_seconds": [1.5] * batch,
                "time/finished_seconds": [[step * batch + i, 1.5] for i in range(batch)],
                "staleness_counts": [30, 10],
                "pipeline/dropped": 0.0,
            }
        )
    m = measured({"history": history})
    assert m["episodes_per_s"] == pytest.approx(batch / 2.0)  # a batch every 2 s from step 2 on
    assert m["slot_util"] == pytest.approx(3 * batch * 1.5 / (SLOTS * 6.0))
    assert m["staleness_mean"] == pytest.approx(0.25) and m["staleness_max"] == 1
    assert token_hist(history) == pytest.approx([0.75, 0.25])
    assert total_variation([0.75, 0.25], [1.0]) == pytest.approx(0.25)


def test_a_prediction_from_a_calibration_uses_nothing_of_the_predicted_run():
    from lrl_lab.experiments.designs_predict import predicted_from
    from lrl_lab.experiments.engine_cost import run_part

    batch = GROUP * GROUPS
    calibration_history = [  # a synchronous run: 0.3 s outside sampling a step, one-turn episodes
        {
            "time/end": 2.0 * step,
            "time/sample": 1.7,
            "time/finished_turns": [
                [step * batch + i, {"prompt": 4, "turns": [[3, 1.0, 0]]}] for i in range(batch)
            ],
        }
        for step in range(8)
    ]
    part = run_part(calibration_history)
    assert part["train_s"] == pytest.approx(0.3) and len(part["turns"]) == 8 * batch
    cal = {"engine": {"points": [[1, 0.01]], "switch_s": 0.0}, "co_run": {"slowdown": 1.0}, "runs": [part]}
    run = {"design": "synchronous", "history": [{"junk": True}] * 6, "steps": 6, "slots": SLOTS}
    p = predicted_from(run, False, cal)
    # 64 episodes on 64 slots: 3 decode steps of 0.01 s, a 1 s tool, 0.3 s of training
    assert p["episodes_per_s"] == pytest.approx(batch / (0.03 + 1.0 + 0.3))
    assert p["staleness_max"] == 0 and p["staleness_hist"] == [1.0]
    with pytest.raises(ValueError, match="finished_turns"):
        run_part([{"time/end": 0.0}])


def test_finished_episodes_of_an_unfinished_group_keep_their_room():
    # lrl's controller hears of a group, not an episode: a batch of 8 x 8 on 64 slots with long-tailed episodes
    # can issue its next unit only once whole groups are back, so fewer slots are busy than if each ended
    # episode freed its room at once (the rule this simulator had before, kept as release="episode")
    import random

    rng = random.Random(0)
    durations = [rng.lognormvariate(-1.0, 1.0) for _ in range(4000)]
    group = simulate_board(durations, 64, 8, 8, 0.3, 0.0, 2, True, 20, drop=False)
    episode = simulate_board(durations, 64, 8, 8, 0.3, 0.0, 2, True, 20, drop=False, release="episode")
    assert group["slot_util"] < 0.9 * episode["slot_util"]
    assert group["episodes_per_s"] < 0.9 * episode["episodes_per_s"]
    with pytest.raises(ValueError, match="release"):
        simulate_board(durations, 64, 8, 8, 0.3, 0.0, release="task")


# -- the staleness policies (lrl's --stale-policy) ---------------------------------------------------------
STRAGGLER = [3.0, 0.1, 0.1, 0.1] * 100  # one episode in four outlasts several steps of 0.5 s


def test_mask_trains_the_episodes_drop_would_discard_within_the_bound():
    drop = simulate_board(STRAGGLER, 4, 1, 1, 0.5, 0.0, 1, True, 12, policy="drop")
    mask = simulate_board(STRAGGLER, 4, 1, 1, 0.5, 0.0, 1, True, 12, policy="mask")
    assert drop["dropped"] >= 1 and mask["dropped"] == 0
    assert mask["staleness_max"] <= 1  # what is older than the bound is masked, not trained
    assert mask["time"] < drop["time"]  # nothing thrown away: the 12 steps come sooner


def test_abort_stops_a_straggler_in_flight_and_starts_its_task_again():
    drop = simulate_board(STRAGGLER, 4, 1, 1, 0.5, 0.0, 1, True, 12, policy="drop")
    abort = simulate_board(STRAGGLER, 4, 1, 1, 0.5, 0.0, 1, True, 12, policy="abort")
    assert drop["dropped"] >= 1
    assert abort["aborted"] >= 1 and abort["dropped"] == 0  # stopped in flight, so never finished stale
    assert abort["staleness_max"] <= 1
    assert abort["time"] < drop["time"]


def test_oldest_first_trains_a_late_group_before_it_passes_the_bound():
    # 4 slots, batches of one group of one, bound 2, steps of 0.5 s, the first episode 1 s: it finishes behind
    # newer groups; taken first it is trained 2 versions stale; taken in turn it would be 3 and dropped
    durations = [1.0] + [0.1] * 400
    fifo = simulate_board(durations, 4, 1, 1, 0.5, 0.0, 2, True, 12, policy="drop")
    oldest = simulate_board(durations, 4, 1, 1, 0.5, 0.0, 2, True, 12, policy="oldest-first")
    assert fifo["dropped"] == 1 and oldest["dropped"] == 0
    assert oldest["staleness_max"] == 2


def test_the_load_model_counts_each_policys_wasted_tokens():
    from lrl_lab.sim.load import EngineCurve

    flat = EngineCurve.linear(0.05, 0.0)
    turns = [[[40, 0.0]], [[2, 0.0]], [[2, 0.0]], [[2, 0.0]]] * 50  # one long action in four
    runs = {
        p: simulate_board(None, 4, 1, 1, 0.5, 0.0, 1, True, 10, turns=turns, engine=flat, policy=p)
        for p in ("drop", "mask", "abort")
    }
    assert runs["drop"]["wasted_tokens"] > 0 and runs["drop"]["masked_tokens"] == 0
    assert runs["mask"]["wasted_tokens"] == runs["mask"]["masked_tokens"] > 0
    assert runs["abort"]["aborted"] >= 1 and runs["abort"]["wasted_tokens"] > 0
    for sim in runs.values():
        assert sim["wasted_tokens"] <= sim["decoded_tokens"]


def test_cut_sends_late_groups_without_their_stragglers():
    rng = random.Random(1)
    durations = [0.3 + rng.lognormvariate(-1.2, 1.0) for _ in range(3000)]
    drop = simulate_board(durations, 64, 8, 8, 0.5, 0.05, 1, True, 20, policy="drop")
    cut = simulate_board(durations, 64, 8, 8, 0.5, 0.05, 1, True, 20, policy="cut")
    assert cut["cut"] > 0 and cut["dropped"] < drop["dropped"]
    assert cut["staleness_max"] <= 1
    assert cut["wasted_tokens"] <= cut["decoded_tokens"]


def test_ordered_waits_for_an_earlier_group_up_to_its_patience():
    # groups of 2, batches of 2 groups, 8 slots, bound 1, steps of 0.5 s; episode 0 (group 0) takes 3 s, the rest
    # 0.2 s. Groups 1-3 are back at 0.2 s; group 0, issued first, at 3.0 s
    durations = [3.0] + [0.2] * 400
    forever = simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 6, policy="ordered")
    assert forever["step_ends"][0] == pytest.approx(3.5)  # waits for group 0 and trains groups 0, 1
    assert forever["dropped"] == 0 and forever["staleness_max"] == 1
    assert forever["step_trained"] == [4] * 6  # every batch whole
    patient = simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 6, policy="ordered", patience=1.0)
    # waits 0.2-1.2 s; group 0 has half its episodes back: it is sent without episode 0, and trained with group 1
    # to 1.7; groups 2, 3 were issued before anything still out: taken at once, trained to 2.2
    assert patient["step_ends"][:2] == pytest.approx([1.7, 2.2])
    assert patient["cut"] == 1 and patient["step_trained"][0] == 3
    assert patient["dropped"] == 0 and patient["staleness_max"] == 1
    drop = simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 6, policy="drop")
    assert drop["step_ends"][0] == pytest.approx(0.7)  # drop never waits
    # a patience of two trainer steps is 1.0 s here: the same run
    steps = simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 6, policy="ordered", patience_steps=2.0)
    assert steps["step_ends"] == pytest.approx(patient["step_ends"]) and steps["cut"] == 1
    with pytest.raises(ValueError, match="patience_steps"):
        simulate_board(durations, 8, 2, 2, 0.5, 0.0, 1, True, 6, policy="ordered", patience_steps=-1.0)


def test_the_planner_plans_ordered_once_per_patience():
    from lrl_lab.sim.load import EngineCurve
    from lrl_lab.sim.turns import TurnTrace, plan_turns

    rng = random.Random(3)
    episodes = [[(rng.randint(5, 20), rng.lognormvariate(-1.0, 1.0))] for _ in range(400)]
    trace = TurnTrace(
        "t", episodes, {"train_s": 0.3, "group": 4, "batch": 16}, EngineCurve.linear(0.002, 1e-4)
    )
    rows = plan_turns(
        trace, [16], [1], 8, policies=["drop", "ordered"], patience=[None, 0.6], patience_steps=[2]
    )
    partial = {r["policy"]: r for r in rows if r["design"] == "async bound 1, partial"}
    assert list(partial) == ["drop", "ordered", "ordered 0.6s", "ordered 2x"]
    # two steps of a 0.3 s trainer are 0.6 s (the trainer's co-run slowdown is 1 here)
    assert partial["ordered 2x"]["episodes_per_s"] == pytest.approx(partial["ordered 0.6s"]["episodes_per_s"])
    assert partial["ordered"]["dropped"] == 0 and partial["ordered"]["wasted_share"] == 0.0
    assert all(r["staleness_max"] <= 1 for r in partial.values())


def test_a_policy_label_carries_orders_patience(tmp_path):
    from lrl_lab.experiments import policies
    from lrl_lab.experiments.designs import run_flags
    from lrl_lab.experiments.labels import run_folder, split_policy

    assert split_policy("ordered@1.2") == ("ordered", 1.2) and split_policy("mask") == ("mask", None)
    for bad in ("mask@1", "ordered@-1", "ordered@soon"):
        with pytest.raises(SystemExit, match="patience"):
            split_policy(bad)
    flags = run_flags("async eta=1, partial", 0, True, policy="ordered@1.2")
    assert flags[-4:] == ["--stale-policy", "ordered", "--take-patience", "1.2"]
    assert run_folder(policy="ordered@1.2") == "hard-ordered-w1.2"
    for name in ("hard-ordered-w2", "hard-ordered-w0.5", "hard-frozen-ordered-w1", "hard-ordered-wx"):
        (tmp_path / name).mkdir()
    assert policies.labels(tmp_path)[-3:] == ["ordered", "ordered@0.5", "ordered@2"]
    # a patience in trainer steps: its own flag, folder, label and simulator argument
    from lrl_lab.experiments.labels import Steps, shown, sim_policy

    name, wait = split_policy("ordered@1.5x")
    assert name == "ordered" and isinstance(wait, Steps) and wait == 1.5
    assert not isinstance(split_policy("ordered@1.5")[1], Steps)
    flags = run_flags("async eta=1, partial", 0, True, policy="ordered@1.5x")
    assert flags[-4:] == ["--stale-policy", "ordered", "--take-patience-steps", "1.5"]
    assert run_folder(policy="ordered@1.5x") == "hard-ordered-w1.5x"
    (tmp_path / "hard-ordered-w1.5x").mkdir()
    assert policies.labels(tmp_path)[-4:] == ["ordered", "ordered@0.5", "ordered@2", "ordered@1.5x"]
    assert shown("ordered@1.5x") == "ordered, 1.5 steps" and shown("ordered@1x") == "ordered, 1 step"
    assert sim_policy("ordered@1.5x") == {"policy": "ordered", "patience_steps": 1.5}
    with pytest.raises(SystemExit, match="trainer steps"):
        split_policy("ordered@-1x")
    assert policies.labels(tmp_path, frozen=True)[-2:] == ["ordered", "ordered@1"]
    assert policies.shown("ordered@0.5") == "ordered, 0.5 s"


def test_an_unknown_policy_is_an_error():
    for name in ("later", "pace"):  # pace, an admission in time, was the simulator's alone; it is gone
        with pytest.raises(ValueError, match="policy"):
            simulate_board([1.0], 1, 1, 1, 0.1, 0.0, 1, True, 1, policy=name)


def test_a_runs_waste_and_pass_rate_summaries():
    from lrl_lab.experiments.designs import final_pass_rate, pass_rates, waste

    history = [
        {"pipeline/decoded_tokens": 100.0, "pipeline/wasted_tokens": 10.0, "pipeline/masked_tokens": 4.0},
        {"pipeline/decoded_tokens": 300.0, "pipeline/wasted_tokens": 30.0, "pipeline/aborted": 2.0},
        {"train/reward": 1.0},  # a synchronous step logs none
    ]
    w = waste(history)
    assert w["decoded_tokens"] == 400 and w["masked_tokens"] == 4 and w["aborted"] == 2
    assert w["wasted_share"] == pytest.approx(40 / 400)
    assert waste([{"train/reward": 0.0}])["wasted_share"] == 0.0
    rates = pass_rates([0.5, float("nan"), 0.7])  # a run without an evaluation is left out
    assert rates["pass_rate_repeats"] == 2 and rates["measured_pass_rate"] == pytest.approx(0.6)
    assert rates["measured_pass_rate_se"] == pytest.approx(0.1)
    assert final_pass_rate({"run_dir": "/nonexistent"}) != final_pass_rate({"run_dir": "/nonexistent"})  # nan


def _design_history(period: float, sync: bool, decoded: float = 0.0, wasted: float = 0.0) -> list[dict]:
    batch = GROUP * GROUPS
    lines = []
    for step in range(6):
        line = {
            "step": step,
            "time/end": 5.0 + period * step,
            "trained_ids": [f"0:{step * batch + i}" for i in range(batch)],
            "time/episode_seconds": [0.5] * batch,
            "time/finished_seconds": [[step * batch + i, 0.5] for i in range(batch)],
            "staleness_counts": [10] if sync else [30, 10],
            "pipeline/dropped": 0.0,
        }
        if sync:
            line["time/sample"] = period - 0.2
        else:
            line |= {"pipeline/trainer_wait": period - 0.2, "pipeline/decoded_tokens": decoded}
            line |= {"pipeline/wasted_tokens": wasted, "pipeline/masked_tokens": wasted}
        lines.append(line)
    return lines


def test_the_policy_comparison_pairs_each_run_with_the_synchronous_run_of_its_seed(tmp_path):
    import json

    from lrl_lab.experiments import policies

    def write(folder: str, name: str, lines: list[dict]) -> None:
        path = tmp_path / folder / "histories" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    # seed 0 and seed 1 synchronous at a batch every 4 s and 2 s; drop at 2 s and 1 s; mask (seed 0 only) 1 s
    write("hard", "synchronous-r0", _design_history(4.0, True))
    write("hard", "synchronous-r1", _design_history(2.0, True))
    write("hard", "async_eta1_partial-r0", _design_history(2.0, False, 100.0, 10.0))
    write("hard", "async_eta1_partial-r1", _design_history(1.0, False, 100.0, 30.0))
    write("hard-mask", "async_eta1_partial-r0", _design_history(1.0, False, 100.0, 5.0))
    rows = policies.compare(tmp_path)
    assert [r["stale_policy"] for r in rows] == ["drop", "mask"]  # the policies with runs, in option order
    drop, mask = rows
    assert drop["x_sync_per_seed"] == pytest.approx([2.0, 2.0]) and mask["x_sync_per_seed"] == pytest.approx(
        [4.0]
    )
    assert drop["measured_wasted_share"] == pytest.approx(0.2)  # the median of 0.1 and 0.3
    assert mask["measured_wasted_share"] == pytest.approx(0.05) and mask["repeats"] == 1
    text = policies.table(rows)
    assert "| drop | 2 |" in text and "| mask | 1 |" in text
    policies.figure(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no synchronous runs"):
        policies.compare(tmp_path / "nothing")
    # codefix's runs live in folders of their own: the same histories there give the same rows
    for folder in ("hard", "hard-mask"):
        (tmp_path / folder).rename(tmp_path / f"codefix-{folder}")
    with pytest.raises(SystemExit, match="no synchronous runs"):
        policies.compare(tmp_path)
    codefix = policies.compare(tmp_path, env="codefix")
    assert [r["x_sync_per_seed"] for r in codefix] == [r["x_sync_per_seed"] for r in rows]
    # so do the frozen-policy runs' folders (--freeze-policy true), and only those
    for folder in ("hard", "hard-mask"):
        (tmp_path / f"codefix-{folder}").rename(tmp_path / folder.replace("hard", "hard-frozen"))
    frozen = policies.compare(tmp_path, frozen=True)
    assert [r["x_sync_per_seed"] for r in frozen] == [r["x_sync_per_seed"] for r in rows]
    with pytest.raises(SystemExit, match="no synchronous runs"):
        policies.compare(tmp_path)


def test_a_calibration_per_seed_is_read_from_the_seeds_own_file(tmp_path):
    import json

    from lrl_lab.experiments.designs_predict import calibration_of

    for seed in (0, 1):
        run = {"train_s": 0.3 + seed, "turns": [[[4, 0.1]]]}
        cal = {"engine": {"points": [[1, 0.01]]}, "co_run": {"slowdown": 1.0}, "run": run}
        (tmp_path / f"cal-r{seed}.json").write_text(json.dumps(cal))
    assert calibration_of(None) is None
    one = calibration_of(str(tmp_path / "cal-r1.json"))
    assert one["runs"][0]["train_s"] == 1.3
    per_seed = calibration_of(str(tmp_path / "cal-r{seed}.json"))
    assert [per_seed(s)["runs"][0]["train_s"] for s in (1, 0, 1)] == [1.3, 0.3, 1.3]
    with pytest.raises(SystemExit, match="no calibration for seed 2"):
        per_seed(2)


def test_where_the_waste_comes_from_against_the_trainers_pace():
    from lrl_lab.experiments.designs import waste_sources

    # steps end every second (P = 1 s); groups of two: group 0 lasts 0.5 s and 2.5 s, group 1 0.5 s and 1.5 s
    history = [{"time/end": float(t)} for t in range(5)]
    history[1] |= {
        "time/finished_seconds": [[0, 0.5], [1, 2.5], [2, 0.5]],
        "time/finished_turns": [[0, {"turns": [[3, 0.4, 0]]}], [1, {"turns": [[1, 1.0, 0], [2, 1.4, 0]]}]]
        + [[2, {"turns": [[3, 0.4, 0]]}]],
    }
    history[2] |= {"time/finished_seconds": [[3, 1.5]], "time/finished_turns": [[3, [[3, 1.4]]]]}
    src = waste_sources(history, group=2)
    assert src["period_s"] == pytest.approx(1.0)
    assert src["over_1p"] == pytest.approx(2 / 4) and src["over_2p"] == pytest.approx(1 / 4)
    assert src["group_over_2p_tokens"] == pytest.approx(6 / 12)  # group 0's tokens, its fast episode's too
    assert math.isnan(waste_sources([{"time/end": 0.0}])["period_s"])  # one step: no pace


def test_a_pool_calibration_replaces_each_recorded_tool_wait_by_a_service_time():
    from lrl_lab.experiments.designs_predict import with_service

    turns = [{"prompt": 4, "turns": [[3, 1.5, 0], [2, 0.0, 0]]}, [[1, 2.5], [1, 0.7]]]
    out = with_service(turns, [0.1, 0.2])
    assert out == [
        {"prompt": 4, "turns": [[3, 0.1, 0], [2, 0.0, 0]]},
        [[1, 0.2], [1, 0.1]],
    ]  # in order, cycled
    assert turns[0]["turns"][0][1] == 1.5  # the calibration's own turns are left as they were
    with pytest.raises(SystemExit, match="tool_service"):
        with_service(turns, [])


def test_the_policy_table_gives_the_spread_of_the_calibration_runs_predictions():
    from lrl_lab.experiments.designs_report import calibration_spread

    def row(measured: float, *alone: list[float]) -> dict:
        return {
            "measured_episodes_per_s": measured,
            "per_repeat": [{"predicted": {"per_calibration_run": a}} for a in alone],
        }

    assert calibration_spread(row(33.0, [32.5, 44.9, 32.6], [32.5, 44.9, 32.6])) == "32.5-44.9 (holds it)"
    assert calibration_spread(row(30.0, [32.5, 44.9], [31.0])) == "31.0-44.9"  # over every seed's calibration
    assert calibration_spread({"measured_episodes_per_s": 1.0, "per_repeat": [{"predicted": {}}]}) == "-"
