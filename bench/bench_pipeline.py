"""Async against sync on this machine, with repeats and error bars, and the same projected to 64 rollout workers.

    python bench/bench_pipeline.py                 # 3 repeats of sync, async (bound 1) and async --deterministic
    python bench/bench_pipeline.py --repeats 5 --steps 40
    python bench/bench_pipeline.py --backends      # rollout workers as local processes against Ray actors
    python bench/bench_pipeline.py --slotted       # 64 slots with slow tools: sync against async bounds 1 and 2

Part 1 runs ``python train.py`` (evaluation and checkpoints off, one torch thread per process) and prints steps per
second, mean ± standard error over repeats, and each mode's ratio to sync; the deterministic row is what the
logical clock costs against free-running async. Part 2 measures, on one thread, the seconds a rollout worker
takes to generate one group of episodes on its own (the base policy on the train tasks), and gives those
durations, with the synchronous run's training time per step, to the simulator (`lrl_lab.sim`) for 64 workers with
one group per job: steps per second at staleness bounds 0 (synchronous), 1, 2 and 4. The projection holds the
trainer's time fixed (one trainer, as here); it is a model, not a measurement.

``--slotted`` runs the slow-tool workload of the designs experiment (64 engine slots, tool calls of lognormal
seconds with median 0.3 and sigma 1.0, 8 tasks x 8 episodes a step) synchronously and asynchronously at bounds 1
and 2 (partial rollouts interrupted), and prints trained episodes per second with repeats and error bars, and each
row's ratio to sync.

``--backends`` (needs ``pip install -e ".[ray]"``) runs the same async work (bound 1, two workers) with
``--rollout-backend local`` and ``ray`` (a one-node Ray the run starts) and prints steps per second with repeats
and error bars, the ratio, and the seconds per step Ray adds; then what one message between the controller and
an actor costs, and what publishing the weights costs by parameter count (the object store against the local
shared-memory board).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from lrl.cli import OneLineParser  # noqa: E402
from lrl_lab.experiments.calibrate import SKIP, steps_per_s  # noqa: E402
from lrl_lab.experiments.stats import mean_se  # noqa: E402
from lrl_lab.experiments.workload import RUN_FLAGS, WORKLOAD, train_command  # noqa: E402  the same train.py flags as the experiment

MODES = {
    "sync": [],
    "async, bound 1": ["--pipeline", "async", "--max-staleness", "1"],
    "async, bound 1, deterministic": [
        "--pipeline",
        "async",
        "--max-staleness",
        "1",
        "--deterministic",
        "true",
    ],
}


def run(flags: list[str], seed: int, steps: int) -> tuple[float, list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        history = Path(tmp) / "h.jsonl"
        cmd = train_command(*RUN_FLAGS, *flags, "--seed", str(seed), "--max-steps", str(steps))
        cmd += ["--log-dir", str(Path(tmp) / "runs"), "--history-file", str(history)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-600:]}")
        lines = [json.loads(x) for x in history.read_text().splitlines() if x.strip()]
    return steps_per_s([h["time/end"] for h in lines]), lines


def group_durations(n: int, seed: int = 0) -> list[float]:
    """Seconds to generate one group (episodes_per_task episodes of one task) alone on one thread, n groups."""
    import torch

    torch.set_num_threads(1)
    from lrl.arguments import parse_args
    from lrl.envs import make_env
    from lrl.preflight import resolve
    from lrl.rollout import Rollout
    from lrl.run import load_model, run_tokenizer
    from lrl.samplers import make_sampler

    cfg = resolve(parse_args(["--seed", str(seed)]))  # a named model -> its folder, as a run's preflight does
    tok = run_tokenizer(cfg.policy)
    spec = make_env(cfg, tok)
    policy = (
        load_model(cfg.policy, spec.tok) or spec.warm_start()
    ).eval()  # the run's base, as train.py starts
    sampler = make_sampler(cfg, spec.tok)
    sampler.setup(policy, 0)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        task = spec.train_tasks[i % len(spec.train_tasks)]
        start = time.perf_counter()
        rollout = Rollout(sampler.decoder(), spec, [], gen, sampler.sampling, 0)
        rollout.add([task] * cfg.episodes_per_task)
        while not rollout.done:
            rollout.advance()
        out.append(time.perf_counter() - start)
    return out, cfg.tasks_per_step


def project(
    durations: list[float], groups_per_step: int, train_time: float, workers: int = 64, steps: int = 200
):
    import torch

    from lrl_lab.sim import simulate_pipeline

    rows = {}
    for eta in (0, 1, 2, 4):
        need = (steps + eta) * groups_per_step
        d = torch.tensor([durations[i % len(durations)] for i in range(need)], dtype=torch.float64)
        r = simulate_pipeline(d, workers, groups_per_step, train_time, 0.0, max_staleness=eta, steps=steps)
        rows[eta] = (steps / r["time"], r["staleness_mean"], r["gen_util"])
    return rows


# -- --backends: local processes against Ray actors -----------------------------------------------------
BACKEND_WORK = ["--pipeline", "async", "--max-staleness", "1", "--rollout-workers", "2"]
SIZES = {"0.15M": None, "6M": 6_000_000, "60M": 60_000_000}  # None: the TinyAgent policy itself


def backend_rates(repeats: int, steps: int) -> dict[str, list[float]]:
    """Steps per second of the same async work on each backend, interleaved repeats."""
    rates: dict[str, list[float]] = {"local": [], "ray": []}
    for k in range(repeats):
        for backend in rates:
            rate, _ = run([*BACKEND_WORK, "--rollout-backend", backend], k, steps)
            rates[backend].append(rate)
            print(f"  repeat {k} {backend}: {rate:.3f} steps/s", flush=True)
    return rates


def message_costs(n: int = 400) -> dict[str, float]:
    """Milliseconds per controller -> actor message (calls sent back to back, then one awaited) and per call
    round trip (an empty collect, what an idle long poll costs), on a one-node Ray."""
    from lrl.pipeline.backends.ray.cluster import RayRuntime
    from lrl.pipeline.backends.ray.workers import RolloutActor
    from lrl.pipeline.messages import Resume

    runtime = RayRuntime(None, 2)
    ray = runtime.connect()
    try:
        actor = ray.remote(max_concurrency=8)(RolloutActor).options(num_cpus=1).remote(0, [])
        ray.get(actor.place.remote())
        start = time.perf_counter()
        for i in range(n):
            actor.deliver.remote(i + 1, Resume())  # numbered past 0: held in order, never run
        ray.get(actor.place.remote())
        sent = (time.perf_counter() - start) / n
        trips = []
        for _ in range(n // 4):
            t = time.perf_counter()
            ray.get(actor.collect.remote(0.0))
            trips.append(time.perf_counter() - t)
    finally:
        runtime.close()
    return {"message": 1e3 * sent, "round trip": 1e3 * statistics.median(trips)}


def _state(parameters: int | None) -> dict:
    import torch

    if parameters is None:
        from lrl.arguments import parse_args
        from lrl.envs import make_env
        from lrl.run import run_tokenizer

        cfg = parse_args([])
        return make_env(cfg, run_tokenizer(cfg.policy)).warm_start().state_dict()
    side = 1024
    rows = parameters // side
    return {f"w{i}": torch.randn(rows // 8, side) for i in range(8)}  # eight matrices, float32


def publish_costs(repeats: int = 5) -> dict[str, dict[str, float]]:
    """Per size: milliseconds to publish (local board, object store put + announce to 2 actors) and for an actor
    to load a version (fetch and copy into its model), medians of `repeats`."""
    import torch

    from lrl.pipeline.backends.ray.board import ObjectStoreBoard, from_arrays
    from lrl.pipeline.backends.ray.cluster import RayRuntime
    from lrl.pipeline.backends.shared_board import WeightBoard

    class Holder(torch.nn.Module):
        def __init__(self, state):
            super().__init__()
            for k, tensor in enumerate(state.values()):
                self.register_buffer(f"b{k}", torch.zeros_like(tensor))

    class Loader:
        def load(self, names: list, refs: list) -> float:
            start = time.perf_counter()
            state = from_arrays(names, ray.get(refs[0]))
            for value in state.values():
                value.clone()  # what load_state_dict's copy costs, into memory of its own
            return time.perf_counter() - start

    runtime = RayRuntime(None, 2)
    ray = runtime.connect()
    out = {}
    try:
        loaders = [ray.remote(Loader).options(num_cpus=1).remote() for _ in range(2)]

        class Owner:
            def connect(self):
                return ray

            def announce(self, version, ref):
                pass

        for name, parameters in SIZES.items():
            state = _state(parameters)
            count = sum(t.numel() for t in state.values())
            model = Holder(state)
            local = WeightBoard(model, 0, 1)
            board = ObjectStoreBoard(model, 1, owner=Owner())
            local_ms, put_ms, load_ms = [], [], []
            for v in range(1, repeats + 1):
                local_ms.append(1e3 * local.publish_state(state, v))
                put_ms.append(1e3 * board.publish_state(state, v))
                ref = board.refs[v]
                loads = ray.get([a.load.remote(board.names, [ref]) for a in loaders])
                load_ms.append(1e3 * max(loads))
            out[name] = {
                "parameters": count,
                "local publish": statistics.median(local_ms),
                "ray publish": statistics.median(put_ms),
                "ray load": statistics.median(load_ms),
            }
            print(f"  {name}: {out[name]}", flush=True)
    finally:
        runtime.close()
    return out


def backends_main(args) -> int:
    """The --backends section (see the module docstring)."""
    rates = backend_rates(args.repeats, args.steps)
    local_mu = statistics.fmean(rates["local"])
    print("\nsteps per second, the same async work (bound 1, 2 workers; mean ± SE over repeats):")
    for backend, xs in rates.items():
        mu, se = mean_se(xs)
        print(f"  {backend:6s} {mu:.3f} ± {se:.3f}   ratio to local {mu / local_mu:.2f}")
    ray_mu = statistics.fmean(rates["ray"])
    print(f"  Ray adds {1e3 * (1 / ray_mu - 1 / local_mu):+.0f} ms per step")
    costs = message_costs()
    print(
        f"\none message to an actor: {costs['message']:.3f} ms (sent back to back); "
        f"a call's round trip: {costs['round trip']:.3f} ms (median)"
    )
    print("\npublishing a version (median of 5; load: the slower of 2 actors, fetch and copy):")
    for name, row in publish_costs().items():
        print(
            f"  {name:6s} ({row['parameters'] / 1e6:.2f}M): local board {row['local publish']:.2f} ms, "
            f"object store {row['ray publish']:.2f} ms, actor load {row['ray load']:.2f} ms"
        )
    return 0


# -- --slotted: the slow-tool workload --------------------------------------------------------------------
SLOTTED = WORKLOAD  # the designs experiment's workload (lrl_lab.experiments.designs)
SLOTTED_MODES = {
    "sync": [],
    "async, bound 1": ["--pipeline", "async", "--max-staleness", "1", "--partial-rollouts", "interrupt"],
    "async, bound 2": ["--pipeline", "async", "--max-staleness", "2", "--partial-rollouts", "interrupt"],
}
EPISODES = 64  # a step's episodes in the slotted workload


def slotted_main(args) -> int:
    """The --slotted section (see the module docstring)."""
    rates: dict[str, list[float]] = {m: [] for m in SLOTTED_MODES}
    for k in range(args.repeats):
        for mode, flags in SLOTTED_MODES.items():
            rate, _ = run([*SLOTTED, *flags], k, args.steps)
            rates[mode].append(EPISODES * rate)
            print(f"  repeat {k} {mode}: {EPISODES * rate:.1f} episodes/s", flush=True)
    sync_mu = statistics.fmean(rates["sync"])
    print("\ntrained episodes per second, 64 slots with slow tools (mean ± SE over repeats):")
    for mode, xs in rates.items():
        mu, se = mean_se(xs)
        print(f"  {mode:16s} {mu:.1f} ± {se:.1f}   ratio to sync {mu / sync_mu:.2f}")
    return 0


def main(argv=None) -> int:
    p = OneLineParser(
        prog="bench_pipeline.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--backends", action="store_true", help="local processes against Ray actors (needs ray)")
    p.add_argument(
        "--slotted", action="store_true", help="64 slots with slow tools: sync against async 1 and 2"
    )
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats} is not allowed; it must be at least 1")
    if args.steps < SKIP + 2:  # a rate is taken between the end of step SKIP and the end of the last
        p.error(
            f"--steps: {args.steps} is not allowed; a rate leaves out the first {SKIP} steps, so at least {SKIP + 2}"
        )
    if args.backends:
        return backends_main(args)
    if args.slotted:
        return slotted_main(args)
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    train_times = []
    for k in range(args.repeats):
        for mode, flags in MODES.items():
            rate, lines = run(flags, k, args.steps)
            rates[mode].append(rate)
            if mode == "sync":
                ends = [h["time/end"] for h in lines]
                train_times += [b - a - h["time/sample"] for a, b, h in zip(ends, ends[1:], lines[1:])][SKIP:]
            print(f"  repeat {k} {mode}: {rate:.3f} steps/s", flush=True)
    sync_mu = statistics.fmean(rates["sync"])
    print("\nsteps per second on this machine (mean ± SE over repeats):")
    for mode, xs in rates.items():
        mu, se = mean_se(xs)
        print(f"  {mode:32s} {mu:.3f} ± {se:.3f}   ratio to sync {mu / sync_mu:.2f}")
    det, free = statistics.fmean(rates[list(MODES)[2]]), statistics.fmean(rates[list(MODES)[1]])
    print(f"  the logical clock costs {100 * (1 - det / free):.1f}% of free-running async throughput")

    durations, groups = group_durations(64)
    train_time = statistics.fmean(train_times)
    print(
        f"\none group alone on one thread: mean {statistics.fmean(durations):.3f} s, max {max(durations):.3f} s "
        f"({len(durations)} groups); trainer {train_time:.3f} s per step"
    )
    print("projected to 64 rollout workers, one group per job, by the simulator:")
    rows = project(durations, groups, train_time)
    for eta, (rate, st, util) in rows.items():
        name = "synchronous (bound 0)" if eta == 0 else f"async, bound {eta}"
        print(
            f"  {name:24s} {rate:.3f} steps/s  x{rate / rows[0][0]:.2f}  staleness {st:.2f}  worker use {util:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
