"""The simulator's calibration from run histories (lrl_lab.experiments.calibrate), on histories whose answers are known."""

from __future__ import annotations

import json

import pytest

from lrl_lab.experiments.calibrate import (
    async_train_time,
    compare,
    handoff,
    histogram,
    steps_per_s,
    sync_train_time,
    token_staleness_mean,
    total_variation,
    unit_staleness,
)

UNIT, TRAIN, HANDOFF = 0.3, 0.6, 0.05


def async_history(steps: int, eta: int) -> list[dict]:
    """What a trainer-bound run at bound `eta` logs: units of UNIT s, steps of TRAIN + HANDOFF s, staleness
    climbing to the bound (the worker is always ahead), 10 tokens per step."""
    out, t = [], 0.0
    for k in range(steps):
        wait = UNIT + HANDOFF if eta == 0 else 0.0
        t += wait + TRAIN if eta == 0 else TRAIN + HANDOFF
        stale = min(k, eta)
        out.append(
            {
                "time/end": t,
                "time/group_seconds": [UNIT / 2, UNIT],
                "pipeline/trainer_wait": wait,
                "staleness_counts": [0] * stale + [10],
                "trained_ids": [f"0:{2 * k}", f"0:{2 * k + 1}"],
            }
        )
    return out


def test_rates_times_and_staleness_read_from_a_history():
    h = async_history(12, 0)
    assert steps_per_s([x["time/end"] for x in h]) == pytest.approx(1 / (UNIT + HANDOFF + TRAIN))
    assert async_train_time({"history": h}) == pytest.approx(TRAIN)
    assert handoff({"history": h}) == pytest.approx(HANDOFF)
    sync = [{"time/end": 0.9 * (k + 1), "time/sample": 0.25} for k in range(10)]
    assert sync_train_time({"history": sync}) == pytest.approx(0.65)
    h2 = async_history(6, 2)
    assert unit_staleness(h2) == [0, 1, 2, 2, 2, 2]
    assert token_staleness_mean(h2) == pytest.approx(9 / 6)  # every step trains 10 tokens


def test_histograms_and_total_variation():
    assert histogram([0, 1, 1], [1.0, 1.0, 2.0]) == pytest.approx([0.25, 0.75])
    assert total_variation([1.0], [0.0, 1.0]) == pytest.approx(1.0)
    assert total_variation([0.5, 0.5], [0.5, 0.5]) == 0.0


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_the_simulator_predicts_a_trainer_bound_run(eta):
    """Bound 0: generation, hand-off and training take turns. Bound >= 1: the worker (UNIT s) is faster than the
    trainer (TRAIN + HANDOFF s), so the trainer never waits and every batch after warm-up is at the bound."""
    run = {"eta": eta, "history": async_history(30, eta)}
    cell = compare(run, TRAIN, HANDOFF, slowdown=1.0, steps=30)
    expected = 1 / (UNIT + HANDOFF + TRAIN) if eta == 0 else 1 / (TRAIN + HANDOFF)
    assert cell["predicted"] == pytest.approx(expected, rel=1e-6)
    assert cell["measured"] == pytest.approx(expected, rel=1e-6)
    assert cell["st_pred_max"] == cell["st_max"] == eta
    assert cell["tv"] == pytest.approx(0.0, abs=1e-12)
    slower = compare(run, TRAIN, HANDOFF, slowdown=1.5, steps=30)["predicted"]
    assert slower == pytest.approx(expected if eta == 0 else 1 / (1.5 * TRAIN + HANDOFF), rel=1e-6)


def test_the_engine_benchmark_times_steps_by_the_episodes_they_decode(tmp_path, capsys):
    from lrl_lab.experiments.engine_cost import engine_curve, main

    curve = engine_curve(
        ["--tool-latency", "lognormal:0.01:0", "--threads", "1"], slots=(1, 3), episodes_per_slot=2
    )
    assert curve["points"] and all(1 <= b <= 3 and s > 0 for b, s in curve["points"])
    assert set(curve["per_slots"]) == {1, 3} and curve["per_slots"][3]["mean_decoding"] <= 3
    assert curve["switch_s"] > 0
    # a calibration file needs a run with turns
    history = tmp_path / "h.jsonl"
    history.write_text('{"time/end": 1.0, "time/sample": 0.5}\n')
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps({"engine": curve, "co_run": {"slowdown": 1.0}}))
    with pytest.raises(SystemExit) as stop:  # one line, exit status 2 (tests/tools/test_lab_inputs.py)
        main(["--engine", str(engine), "--run", str(history), "--json", str(tmp_path / "cal.json")])
    assert stop.value.code == 2 and "finished_turns" in capsys.readouterr().err
