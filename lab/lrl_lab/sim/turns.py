"""Turn-level traces for the planner: ``python -m lrl_lab.sim --trace FILE`` with episodes as turns (docs/simulate.md).

A turn trace is JSONL, one episode a line: ``{"turns": [[tokens decoded, tool seconds], ...]}`` (a third number
per turn, observation tokens, is allowed and not used). An optional first object holds settings: ``train_s``
(the trainer's seconds a step), ``sync_s`` (a worker's weight load), ``slots``, ``batch``, ``group`` (episodes
per task, the trainer's unit; default 1), ``co_run`` (the engine's and the trainer's slowdown when both run at
once; default 1; a measured one below 1 is read as 1), and ``engine``: ``{"points": [[episodes decoding, step seconds], ...]}`` or
``{"base_s": B, "per_episode_s": P}``. A calibration file of ``python -m lrl_lab.experiments.engine_cost --run``
is a turn trace too (its engine curve, co-run slowdown and first run's turns and trainer time).

The plan simulates lrl's own pipeline (:func:`lrl_lab.sim.board.simulate_board`, the load model) for each slot
count and bound asked: synchronous, and for each bound partial rollouts and drain, with the throttle alone.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from lrl_lab.sim import calibration
from lrl_lab.sim.load import EngineCurve, parse_turns
from lrl_lab.sim.trace import TraceError

SETTINGS = ("train_s", "sync_s", "slots", "batch", "group", "co_run", "tool_servers")
MODELS = ("auto", "event", "windowed")
WINDOWED_FROM = 16_384  # slots a worker from which `auto` plans with the windowed model (there it is faster)


@dataclass
class TurnTrace:
    path: str
    episodes: list  # [[(tokens, tool s), ...], ...]
    settings: dict = field(default_factory=dict)
    engine: EngineCurve | None = None


def is_turn_trace(path: str) -> bool:
    """Whether a trace file holds turns (or is a calibration): its first object says so, or its second holds
    turns after a first of settings, or the file is a calibration written over several lines."""
    seen, opened = 0, False
    try:
        with open(path, encoding="utf-8-sig") as handle:
            for text in handle:
                if not text.strip():
                    continue
                opened = opened or (not seen and text.lstrip().startswith("{"))
                obj = json.loads(text)
                if not isinstance(obj, dict):
                    return False
                if "turns" in obj or (
                    not seen and any(k in obj for k in ("runs", "run", "engine", "co_run"))
                ):
                    return True
                seen += 1
                if seen == 2 or "duration_s" in obj:
                    return False
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
        pass
    if not (opened and not seen):  # only a first object that did not end on its line may be one
        return False
    try:
        return calibration.is_calibration(_whole(calibration.read_text(path)))
    except TraceError:
        return False


def _whole(text: str):
    """The file as one JSON value (a calibration, written on one line or several), or None."""
    try:
        return calibration.strict_loads(text)
    except ValueError:
        return None


def _engine(path: str, line: int, spec) -> EngineCurve:
    try:
        if isinstance(spec, dict) and "points" in spec:
            return EngineCurve.of(spec["points"], spec.get("counts"))
        if isinstance(spec, dict) and "base_s" in spec:
            return EngineCurve.linear(float(spec["base_s"]), float(spec.get("per_episode_s", 0.0)))
    except (TypeError, ValueError) as err:
        raise TraceError(path, line, f"engine: {err}") from None
    raise TraceError(
        path, line, 'engine: give {"points": [[b, s], ...]} or {"base_s": B, "per_episode_s": P}'
    )


def _setting(path: str, line: int, name: str, value) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(path, line, f"{name} is {json.dumps(value)[:40]}, not a finite number")
    if name in ("slots", "batch", "group", "tool_servers"):
        if value < 1 or value != int(value):
            raise TraceError(path, line, f"{name} is {value:g}; it must be an integer >= 1")
        return int(value)
    if name == "co_run":  # measured: one below 1 is noise, read as 1 (lrl_lab.sim.calibration)
        if value <= 0:
            raise TraceError(path, line, f"co_run is {value:g}; a slowdown is > 0")
        return max(float(value), 1.0)
    if value < 0:
        raise TraceError(path, line, f"{name} is {value:g}; it must be >= 0")
    return float(value)


def read_turn_trace(path: str) -> TurnTrace:
    """Read and check a turn trace (or a calibration file) -> TurnTrace."""
    text = calibration.read_text(path)
    lines = [(i, t) for i, t in enumerate(text.splitlines(), 1) if t.strip()]
    if not lines:
        raise TraceError(path, 1, 'the file is empty; expected one JSON object per line with "turns"')
    whole = _whole(text)
    if calibration.is_calibration(whole):  # lrl_lab.experiments.engine_cost's: its first run's turns
        cal = calibration.check(path, whole)
        run = cal["runs"][0]
        settings = {"train_s": float(run["train_s"]), "co_run": calibration.co_run_of(cal)}
        settings["sync_s"] = float(cal["engine"].get("switch_s", 0.0))
        return TurnTrace(path, parse_turns(run["turns"]), settings, calibration.engine_of(path, cal))
    trace = TurnTrace(path, [])
    raw = []
    for k, (line, t) in enumerate(lines):
        try:
            obj = calibration.strict_loads(t)
        except ValueError as err:
            raise TraceError(path, line, f"not JSON ({' '.join(str(err).split())[:120]})") from None
        if not isinstance(obj, dict):
            raise TraceError(path, line, f"expected a JSON object, got {type(obj).__name__}")
        if "turns" not in obj and k:
            raise TraceError(path, line, "no turns (only the first object may hold the settings alone)")
        for name in SETTINGS:
            if name in obj:
                trace.settings[name] = _setting(path, line, name, obj[name])
        if "engine" in obj:
            trace.engine = _engine(path, line, obj["engine"])
        if "turns" in obj:
            try:
                raw.append(parse_turns([obj])[0])
            except (TypeError, ValueError, IndexError) as err:
                raise TraceError(path, line, f"turns: {str(err).replace('episode 0: ', '')}") from None
    if not raw:
        raise TraceError(path, 1, 'no episodes (no object with "turns")')
    trace.episodes = raw
    return trace


def _drop_like(policies: list[str]) -> dict[str, bool]:
    """Each of `policies` (lrl's --stale-policy, a plugin's included) -> whether it acts as ``drop`` does (what
    the windowed model covers); ValueError naming those not registered."""
    from lrl.registry import STALENESS
    from lrl_lab.sim.policy import acts_as_drop

    unknown = [x for x in policies if x not in STALENESS]
    if unknown:
        raise ValueError(f"unknown staleness policy {unknown}: choose from {list(STALENESS)}")
    return {p: acts_as_drop(p) for p in policies}


def plan_turns(
    trace: TurnTrace,
    slots: list[int],
    bounds: list[int],
    steps: int,
    engine=None,
    workers: int = 1,
    policies: list[str] | None = None,
    patience: list[float] | None = None,
    model: str = "auto",
    progress=None,
    patience_steps: list[float] | None = None,
    **given,
) -> list:
    """Every design at every slot count (per worker, on `workers` workers, each its own engine) -> rows.
    `given` (train_s, sync_s, batch, group, co_run) overrides the trace; `engine` (an EngineCurve) too.
    `policies`: the async designs under the hard bound, once with each staleness policy (lrl's
    ``--stale-policy``: any registered name, a plugin's included), instead of with the throttle alone; a policy
    with a take patience (``ordered``) once with each of `patience` (seconds) and of `patience_steps` (trainer
    steps; neither: it waits for every earlier group). `model`: ``event`` (lrl_lab.sim.board, event by event),
    ``windowed`` (lrl_lab.sim.windowed: numpy windows, for large slot counts; the throttle alone and a policy that
    acts as ``drop`` does, tools at once) or ``auto`` (windowed from WINDOWED_FROM slots a worker where it
    applies, else event). `progress(done, total,
    row)`, if given, is called after each row."""
    from lrl.pipeline.policies import DEFAULT_POLICY, takes_patience
    from lrl_lab.sim.board import Steps, simulate_board
    from lrl_lab.sim.windowed import simulate_windowed

    if model not in MODELS:
        raise ValueError(f"model: one of {MODELS}")
    drop_like = _drop_like(policies or [])  # what the windowed model covers

    s = {**trace.settings, **{k: v for k, v in given.items() if v is not None}}
    curve = engine or trace.engine
    if curve is None:
        raise TraceError(
            trace.path, 1, "no engine curve: give one in the trace or with --engine-step BASE PER"
        )
    if "train_s" not in s:
        raise TraceError(trace.path, 1, "no train_s: give it in the trace or with --train-time")
    group = int(s.get("group", 1))
    batch = int(s.get("batch", 64))
    if batch % group:
        raise TraceError(trace.path, 1, f"the batch ({batch}) must be a whole number of groups of {group}")
    co = float(s.get("co_run", 1.0))
    servers = int(s["tool_servers"]) if s.get("tool_servers") else None  # tools queue for a pool of servers
    designs = [("synchronous", 0, True, True, None, None)]
    variants = []  # (policy, its patience: seconds, or a Steps in trainer steps)
    for policy in policies or [None]:
        waits = [*(patience or []), *(Steps(k) for k in patience_steps or [])]
        waits = (waits or [None]) if policy is not None and takes_patience(policy) else [None]
        variants += [(policy, w) for w in waits]
    for k in bounds:
        for policy, wait in variants:
            designs += [
                (f"async bound {k}, partial", k, True, False, policy, wait),
                (f"async bound {k}, drain", k, False, False, policy, wait),
            ]
    rows = []
    total = len(slots) * len(designs)
    for n in slots:
        for name, eta, interrupt, sync, policy, wait in designs:
            # what the windowed model covers: the throttle alone, a policy that acts as drop, tools at once
            windowed = (policy is None or drop_like[policy]) and servers is None
            if model == "windowed" and not windowed:
                raise ValueError(
                    "the windowed model covers the throttle alone and --stale-policy drop with tools at once; "
                    f"{'--tool-servers' if servers else policy} needs the event model (--model event or auto)"
                )
            use = (
                "windowed"
                if windowed and (model == "windowed" or (model == "auto" and n >= WINDOWED_FROM))
                else "event"
            )
            common = (n, group, batch // group, float(s["train_s"]) * (1.0 if sync else co),
                      float(s.get("sync_s", 0.0)), eta, interrupt, steps)  # fmt: skip
            if use == "windowed":
                r = simulate_windowed(
                    *common, drop=policy is not None, sync_before=sync, workers=workers, turns=trace.episodes,
                    engine=curve, co_run=1.0 if sync else co,
                )  # fmt: skip
            else:
                r = simulate_board(
                    None, *common, drop=policy is not None, sync_before=sync, workers=workers,
                    turns=trace.episodes, engine=curve, co_run=1.0 if sync else co, policy=policy or DEFAULT_POLICY,
                    tool_servers=servers, patience=math.inf if wait is None or isinstance(wait, Steps) else wait,
                    patience_steps=float(wait) if isinstance(wait, Steps) else None,
                )  # fmt: skip
            rows.append(
                {
                    "slots": n,
                    "workers": workers,
                    "model": use,
                    "design": name,
                    "policy": policy
                    if wait is None
                    else f"{policy} {wait:g}{'x' if isinstance(wait, Steps) else 's'}",
                    "wasted_share": r["wasted_tokens"] / r["decoded_tokens"] if r["decoded_tokens"] else 0.0,
                    "dropped": r["dropped"],
                    "aborted": r["aborted"],
                    "cut": r["cut"],
                    "max_staleness": eta,
                    "episodes_per_s": r["episodes_per_s"],
                    "slot_utilization": r["slot_util"],
                    "staleness_mean": r["staleness_mean"],
                    "staleness_max": r["staleness_max"],
                    "trained_duration_mean_s": r["trained_duration"],
                    "simulated_s": r["time"],
                    "episodes_started": r["started"],
                    "cycled": r["started"] > len(trace.episodes),
                }
            )
            if progress is not None:
                progress(len(rows), total, rows[-1])
    return rows


def turn_lines(trace: TurnTrace, rows: list[dict], settings: dict) -> list[str]:
    eps = trace.episodes
    turns = sum(len(e) for e in eps)
    tokens = sum(t for e in eps for t, _ in e)
    tool = sum(x for e in eps for _, x in e)
    out = [
        f"turn trace {trace.path}: {len(eps):,} episodes, {turns / len(eps):.2f} turns each, "
        f"{tokens / turns:.1f} tokens and {tool / turns:.3f} tool s a turn",
        "settings: " + ", ".join(f"{k} {v:g}" for k, v in sorted(settings.items())),
        "",
    ]
    policies = any(r.get("policy") for r in rows)  # the hard bound, a staleness policy per row
    width = max([12, *(len(r.get("policy") or "") for r in rows)])  # a plugin's name may be longer
    head = f"{'slots':>6} x {'workers':<7} | {'design':<24} | "
    head += f"{'policy':<{width}} | " if policies else ""
    out.append(
        head
        + f"{'episodes/s':>10} | {'slot util':>9} | staleness mean, max"
        + (" | wasted" if policies else "")
    )
    for r in rows:
        line = f"{r['slots']:>6} x {r['workers']:<7} | {r['design']:<24} | "
        line += f"{r.get('policy') or '-':<{width}} | " if policies else ""
        line += f"{r['episodes_per_s']:10.3f} | {r['slot_utilization']:9.2f} | {r['staleness_mean']:.2f}, {r['staleness_max']}"
        line += f" | {100 * r['wasted_share']:5.1f}%" if policies else ""
        out.append(line + (" w" if r.get("model") == "windowed" else "") + (" *" if r["cycled"] else ""))
    if policies:
        out += [
            "",
            "policy: the hard bound with that --stale-policy; wasted: the action tokens decoded and never trained",
        ]
    if any(r.get("model") == "windowed" for r in rows):
        out += [
            "",
            "w: simulated in windows (lrl_lab.sim.windowed, a worker sees its messages at once); the others event by "
            "event",
        ]
    if any(r["cycled"] for r in rows):
        out += ["", f"* needed more episodes than the trace's {len(eps):,}: they were used again in order"]
    return out


def plan_series(rows: list[dict]) -> tuple[dict[str, list[tuple]], str]:
    """The plan's lines: one per design (and staleness policy, with --policies) -> {label: [(slots, episodes/s,
    right)]}, and what `right` is: the mean token staleness, or with policies the share of tokens wasted."""
    policies = any(r.get("policy") for r in rows)
    series: dict[str, list[tuple]] = {}
    for r in rows:
        label = r["design"] + (f", {r['policy']}" if r.get("policy") else "")
        right = 100 * r["wasted_share"] if policies else r["staleness_mean"]
        series.setdefault(label, []).append((r["slots"] * r["workers"], r["episodes_per_s"], right))
    return series, ("wasted tokens (% of decoded)" if policies else "mean token staleness (versions)")


def plot_plan(rows: list[dict], name: str, folder: str) -> str:
    """Episodes per second, and mean staleness (or with policies the waste), against the slots, one line per
    design -> the PNG's path."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, right_label = plan_series(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, points in series.items():
        xs = [p[0] for p in points]
        left.plot(xs, [p[1] for p in points], "o-", label=label)
        right.plot(xs, [p[2] for p in points], "o-", label=label)
    for ax, what in ((left, "trained episodes per second"), (right, right_label)):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("slots (all workers)")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    fig.suptitle(f"plan from {os.path.basename(name)}", fontsize=10)
    fig.tight_layout()
    path = os.path.join(folder, "plan.png")
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
