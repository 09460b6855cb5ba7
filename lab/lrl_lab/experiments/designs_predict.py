"""The simulator's predictions of the designs' runs: from each run's own measurements (:func:`predicted`), or from a
calibration alone (:func:`predicted_from`, the load model with the engine's curve and the workload's turns)."""

from __future__ import annotations

import statistics
from pathlib import Path

from lrl.pipeline.policies import DEFAULT_POLICY
from lrl_lab.experiments.labels import sim_policy
from lrl_lab.experiments.workload import (
    DESIGNS,
    GROUP,
    GROUPS,
    SKIP,
    SLOTS,
    durations,
    switch_seconds,
    trainer_seconds,
)


def window_rate(sim: dict) -> float:
    """A simulation's trained episodes per second, taken as a run's are: after step SKIP, to the last step."""
    ends = sim["step_ends"]
    return sum(sim["step_trained"][SKIP + 1 :]) / (ends[-1] - ends[SKIP])


def predicted(run: dict, drop: bool, policy: str = DEFAULT_POLICY) -> dict:
    """The simulator's prediction of a run from the run's own measured durations, trainer time and loads."""
    from lrl_lab.sim.board import simulate_board

    spec = DESIGNS[run["design"]]
    h = run["history"]
    sync = bool(spec.get("sync"))
    sim = simulate_board(
        durations(h),
        run.get("slots", SLOTS),
        GROUP,
        GROUPS,
        trainer_seconds(h, sync),
        switch_seconds(h),
        spec["eta"],
        spec["interrupt"],
        run.get("steps") or len(h),
        drop=drop,
        sync_before=sync,
        **sim_policy(policy),
    )
    return {
        "episodes_per_s": window_rate(sim),
        "slot_util": sim["slot_util"],
        "staleness_mean": sim["staleness_mean"],
        "staleness_max": sim["staleness_max"],
        "staleness_hist": sim["staleness_hist"],
        "trained_duration": sim["trained_duration"],
        "dropped": sim["dropped"],
        "aborted": sim["aborted"],
        "cut": sim["cut"],
        "wasted_share": sim["wasted_tokens"] / max(sim["decoded_tokens"], 1e-9),  # episodes as equal units
        "inputs": {
            "durations": len(durations(h)),
            "train_s": trainer_seconds(h, sync),
            "switch_s": switch_seconds(h),
        },
    }


def load_calibration(path) -> dict:
    """A calibration file (lrl_lab.experiments.engine_cost with --run) -> its parts, checked (lrl_lab.sim.calibration;
    TraceError naming the file)."""
    from lrl_lab.sim import calibration

    cal = calibration.read(str(path))
    # a pool of tool servers: a call's time is a tool's own run, the wait simulated
    if cal.get("tool_servers"):
        for part in cal["runs"]:
            part["turns"] = with_service(part["turns"], part.get("tool_service") or [])
    return cal


def calibration_of(predict_from: str | None):
    """`--predict-from`: None, one calibration, or with ``{seed}`` in the name a function of a run's seed."""
    if not predict_from:
        return None
    if "{seed}" not in predict_from:
        return load_calibration(predict_from)
    cache: dict = {}

    def of_seed(seed: int) -> dict:
        if seed not in cache:
            path = Path(predict_from.format(seed=seed))
            if not path.is_file():
                raise SystemExit(f"--predict-from: no calibration for seed {seed} ({path})")
            cache[seed] = load_calibration(path)
        return cache[seed]

    return of_seed


def with_service(turns: list, service: list[float]) -> list:
    """`turns` with each tool wait replaced by the next of `service` (the tools' own run seconds, in the order
    logged, from the first again when they run out): a recorded wait includes the queue for a server."""
    if not service:
        raise SystemExit("a calibration with tool_servers needs its runs' tool_service (env/tool_times)")
    out, k = [], 0
    for episode in turns:
        parts = episode["turns"] if isinstance(episode, dict) else episode
        new = []
        for turn in parts:
            if float(turn[1]) > 0:
                new.append([turn[0], service[k % len(service)], *turn[2:]])
                k += 1
            else:
                new.append(list(turn))
        out.append({**episode, "turns": new} if isinstance(episode, dict) else new)
    return out


def predicted_from(run: dict, drop: bool, cal: dict, policy: str = DEFAULT_POLICY) -> dict:
    """The load model's prediction of a run from a calibration only: the engine curve and co-run slowdown of the
    benchmark, the trainer's seconds and the workload's turns of each calibration run (the prediction is the mean
    over them; staleness max the largest). Nothing of `run` enters but its configuration (design, slots,
    steps)."""
    from lrl_lab.sim.board import simulate_board
    from lrl_lab.sim.calibration import co_run_of, engine_of

    spec = DESIGNS[run["design"]]
    sync = bool(spec.get("sync"))
    curve = engine_of("the calibration", cal)
    slow = co_run_of(cal) if not sync else 1.0  # sync: the trainer has the cores alone
    switch_s = float(cal["engine"].get("switch_s", 0.0))
    servers = cal.get("tool_servers")  # None: tools at once; else turns of service times
    sims = []
    for part in cal["runs"]:
        sim = simulate_board(
            None,
            run.get("slots", SLOTS),
            GROUP,
            GROUPS,
            float(part["train_s"]) * slow,
            switch_s,
            spec["eta"],
            spec["interrupt"],
            run.get("steps") or len(run["history"]),
            drop=drop,
            sync_before=sync,
            turns=part["turns"],
            engine=curve,
            co_run=slow,
            **sim_policy(policy),
            tool_servers=servers,
        )
        sim["episodes_per_s"] = window_rate(sim)
        sims.append(sim)
    mean = lambda key: statistics.fmean(s[key] for s in sims)  # noqa: E731
    width = max(len(s["staleness_hist"]) for s in sims)
    hist = [statistics.fmean(s["staleness_hist"][k] if k < len(s["staleness_hist"]) else 0.0 for s in sims)
            for k in range(width)]  # fmt: skip
    return {
        "episodes_per_s": mean("episodes_per_s"),
        "slot_util": mean("slot_util"),
        "staleness_mean": mean("staleness_mean"),
        "staleness_max": max(s["staleness_max"] for s in sims),
        "staleness_hist": hist,
        "trained_duration": mean("trained_duration"),
        "dropped": round(mean("dropped")),
        "aborted": round(mean("aborted")),
        "cut": round(mean("cut")),
        "wasted_share": statistics.fmean(s["wasted_tokens"] / max(s["decoded_tokens"], 1e-9) for s in sims),
        "per_calibration_run": [s["episodes_per_s"] for s in sims],
        "inputs": {"runs": len(sims), "switch_s": switch_s, "co_run": slow},
    }
