"""The planner's calibration: what the engine, the trainer and the workload cost on this machine, measured once.

    python -m lrl_lab.experiments.engine_cost --json results/calibration/engine.json            # the engine alone
    python -m lrl_lab.experiments.engine_cost --run HISTORY.jsonl --json results/calibration/cal.json  # and a run's

The engine's part is a benchmark of the engine in use (the sampler a run names: the built-in KV-cache engine by
default, ``--sampler vllm`` for vLLM): the TinyAgent gym rolled out at each of ``--slots`` (episodes join as
others end, tools answer after the workload's drawn latency, as in a pipeline worker), every engine step timed
with the number of episodes it decoded. The step's cost as a function of that number is the engine curve
(:class:`lrl_lab.sim.load.EngineCurve`): points ``[episodes decoding, seconds]``, the mean over steps at each count.
A weight load (``sampler.sync``) is timed too, and the co-run slowdown (one fixed piece of work alone and as two
processes on this machine's cores: what the trainer and a busy rollout process do to each other).

``--run`` adds what only runs have: the workload's turns (``time/finished_turns``: tokens decoded and tool
seconds of every turn of every episode, in start order) and the trainer's seconds per step outside getting its
data. Calibrate from a run other than the ones to predict (``lrl_lab.experiments.designs`` uses a synchronous run with
a seed of its own); nothing of a predicted run enters its prediction.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from lrl.cli import OneLineParser
from lrl_lab.experiments.inputs import ERRORS, InputError, numbers, outputs, read_history
from lrl_lab.experiments.workload import LATENCY, SKIP

SLOTS = (1, 4, 16, 64, 128)
EPISODES_PER_SLOT = 4  # episodes rolled out at each slot count, per slot


def engine_curve(
    flags: list[str], slots=SLOTS, episodes_per_slot: int = EPISODES_PER_SLOT, seed: int = 0
) -> dict:
    """Time the engine's steps at each slot count -> {points, steps, per_slots}."""
    import torch

    from lrl.arguments import parse_args
    from lrl.envs import make_env, run_tokenizer
    from lrl.envs.workers import make_tools
    from lrl.policy import make_policy
    from lrl.preflight import resolve
    from lrl.rollout import Rollout
    from lrl.samplers import make_sampler

    cfg = resolve(parse_args(flags))  # a named model -> its folder, as a run's preflight does
    torch.set_num_threads(cfg.threads)
    spec = make_env(cfg, run_tokenizer(cfg.policy))
    tasks = list(spec.train_tasks)
    policy = make_policy(spec.tok, seed=seed).float().eval()
    sampler = make_sampler(cfg, spec.tok)
    sampler.setup(policy, 0)
    log: list[list] = []
    per_slots = {}
    for n in slots:
        generator = torch.Generator().manual_seed(seed)
        tools = make_tools(cfg.environment, torch.Generator().manual_seed(seed + 1))
        rollout = Rollout(
            sampler.decoder(), spec, (), generator, sampler.sampling, 0, lockstep=False, tools=tools
        )
        rollout.step_log = []
        todo = [tasks[i % len(tasks)] for i in range(n * episodes_per_slot)]
        start = time.perf_counter()
        while todo or not rollout.done:
            room = rollout.room(n)
            if todo and room:
                rollout.add(todo[:room])
                todo = todo[room:]
            rollout.advance()
        wall = time.perf_counter() - start
        steps = rollout.step_log
        log.extend(steps)
        per_slots[n] = {
            "wall_s": wall,
            "steps": len(steps),
            "mean_decoding": statistics.fmean(b for b, _ in steps) if steps else 0.0,
            "mean_step_s": statistics.fmean(s for _, s in steps) if steps else 0.0,
        }
        print(
            f"  {n:4d} slots: {len(steps)} steps, {per_slots[n]['mean_step_s'] * 1e3:.2f} ms a step",
            flush=True,
        )
    by_b: dict[int, list[float]] = {}
    for b, s in log:
        by_b.setdefault(int(b), []).append(s)
    points = [[b, statistics.fmean(v), len(v)] for b, v in sorted(by_b.items()) if len(v) >= 3]
    switch = []  # a worker's weight load: new weights copied into its model, then the sampler told
    shadow = make_policy(spec.tok, seed=seed + 1).float().eval()
    for v in range(1, 6):
        t0 = time.perf_counter()
        shadow.load_state_dict(policy.state_dict())
        sampler.sync(shadow, v)
        switch.append(time.perf_counter() - t0)
    return {
        "points": [[b, s] for b, s, _ in points],
        "counts": [c for *_, c in points],
        "per_slots": per_slots,
        "switch_s": statistics.median(switch),
        "sampler": cfg.sampler,
        "threads": cfg.threads,
    }


def run_part(history: list[dict]) -> dict:
    """What a calibration run contributes: its episodes' turns in start order, and the trainer's seconds."""
    from lrl_lab.experiments.workload import trainer_seconds

    pairs = sorted((int(i), t) for h in history for i, t in h.get("time/finished_turns", []))
    if not pairs:
        raise ValueError(
            "the run's history has no time/finished_turns: run it with --slots (or --pipeline async) on this lrl"
        )
    sync = "pipeline/trainer_wait" not in history[-1]
    service = [float(t) for h in history for t in h.get("env/tool_times", [])]  # real tools' own run seconds
    return {
        "turns": [t for _, t in pairs],
        **({"tool_service": service} if service else {}),
        "train_s": trainer_seconds(history, sync),
        "trainer_measured": "alone (synchronous run)" if sync else "beside the rollout (asynchronous run)",
        "steps": len(history),
        "skip": SKIP,
    }


def run_parts(paths: list[str], tool_servers: int | None) -> list[dict]:
    """The calibration runs' parts (:func:`run_part`), each history read and checked -> parts; InputError naming
    the file for a history engine_cost cannot use."""
    parts = []
    for path in paths:
        history = read_history(path)
        if not any("time/finished_turns" in h for h in history):
            raise InputError(
                f"{path}: no time/finished_turns in it: not the history of a run with --slots (or --pipeline "
                "async) on this lrl, which a calibration needs"
            )
        if len(history) < SKIP + 3:
            raise InputError(
                f"{path}: {len(history)} steps; a calibration needs a run of at least {SKIP + 3}"
            )
        sync = "pipeline/trainer_wait" not in history[-1]
        numbers(path, history, ("time/end", "time/sample" if sync else "pipeline/trainer_wait"))
        try:
            part = {"file": str(path), **run_part(history)}
        except (TypeError, ValueError, KeyError, IndexError) as err:
            raise InputError(f"{path}: time/finished_turns cannot be read ({str(err)[:100]})") from None
        if tool_servers and "tool_service" not in part:
            raise InputError(
                f"{path}: no env/tool_times, which --tool-servers needs (a run of real tools: --env codefix)"
            )
        parts.append(part)
    return parts


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="python -m lrl_lab.experiments.engine_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--slots", type=int, nargs="+", default=list(SLOTS), help="slot counts to time the engine at"
    )
    p.add_argument("--episodes-per-slot", type=int, default=EPISODES_PER_SLOT)
    p.add_argument(
        "--run",
        nargs="+",
        default=None,
        help="calibration runs' --history-file: their turns and trainer time (several: the prediction is the "
        "mean over them, as a learning workload differs from seed to seed)",
    )
    p.add_argument(
        "--engine", default=None, help="reuse this earlier JSON's engine part instead of timing again"
    )
    p.add_argument(
        "--tool-servers",
        type=int,
        default=None,
        help="with --run: the runs' tools are served by this many servers per rollout worker (codefix: its "
        "--env-workers, one per core by default); the prediction then queues each call for a free one, with the "
        "tools' own run seconds (env/tool_times) as its service time",
    )
    p.add_argument("--json", required=True, help="where to write the calibration")
    p.add_argument("flags", nargs="*", help="train.py flags of the engine (after --), e.g. --sampler vllm")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.slots):
        p.error("--slots must be positive")
    if args.episodes_per_slot < 1:
        p.error("--episodes-per-slot must be positive")
    if args.tool_servers is not None and (args.tool_servers < 1 or not args.run):
        p.error("--tool-servers needs --run and must be at least 1")
    for problem in outputs(("--json", args.json, "file")):
        p.error(problem)
    out: dict = {}
    try:  # every input read and checked before the engine is timed
        if args.engine:
            from lrl_lab.sim import calibration

            old = calibration.read_json(args.engine)
            if not isinstance(old, dict) or "engine" not in old:
                raise InputError(f"{args.engine}: no engine part (an earlier JSON of engine_cost)")
            calibration.engine_of(args.engine, old)
            if not isinstance(old.get("co_run"), dict) or "slowdown" not in old["co_run"]:
                raise InputError(f"{args.engine}: no co_run slowdown (an earlier JSON of engine_cost)")
            out.update({k: old[k] for k in ("engine", "co_run")})
        parts = run_parts(args.run or [], args.tool_servers)
    except ERRORS as err:
        p.error(str(err))
    if not args.engine:
        from lrl_lab.experiments.calibrate import co_run_slowdown

        flags = ["--tool-latency", LATENCY, "--threads", "1", *args.flags]
        print(f"timing the engine ({' '.join(flags)}) ...", flush=True)
        out["engine"] = engine_curve(flags, args.slots, args.episodes_per_slot)
        print("measuring the co-run slowdown ...", flush=True)
        out["co_run"] = co_run_slowdown()
        print(f"  {out['co_run']['slowdown']:.2f}x", flush=True)
    if args.run:
        out["runs"] = parts
        for part in parts:
            print(
                f"  {part['file']}: {len(part['turns'])} episodes' turns, trainer {part['train_s']:.3f} s a step"
            )
    if args.tool_servers:
        out["tool_servers"] = args.tool_servers
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
