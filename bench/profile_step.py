"""Where a training step's time goes, phase by phase: a real run of ``train.py`` with timers around its pieces.

    python bench/profile_step.py                                   # the calc recipe on SmolLM2, 4 steps
    python bench/profile_step.py --steps 6 -- --sampler fp8 --lag 2  # any train.py flags after --

The run is the one ``train.py --env calc`` starts (its defaults, or the flags after ``--``), with no logger and no
held-out evaluation inside it; every step's seconds are split into

- ``prefill``: forwards of the KV-cache engine that feed more than one token a row (prompts, observations);
- ``decode``: its one-token decode steps;
- ``draw``: turning a step's logits into the sampling distribution and drawing from it;
- ``sample, rest``: the rest of sampling (the episode loop, the environment, collating and advantages);
- ``old_logp``: the separate pi_old forward (0 where the step takes pi_old from its update's own forward);
- ``forward`` / ``backward`` / ``optimizer``: the update's forwards with gradients, their backwards, Adam;
- ``other``: what the step spends elsewhere (weight sync, metrics, the callbacks).

After the steps, one held-out evaluation is timed on its own (``--eval-episodes``; 0: none). Steps that had no
advantage signal (skipped) are shown but kept out of the medians. Nothing is asserted: the figures are for
choosing what to change, and checking that a change did what it was meant to.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from floors import Floors, Work, body_tokens  # noqa: E402

from lrl.cli import OneLineParser  # noqa: E402

PHASES = (
    "prefill",
    "decode",
    "draw",
    "sample, rest",
    "old_logp",
    "forward",
    "backward",
    "optimizer",
    "other",
)


class Timers:
    """Seconds per phase since the last ``take``; nested timers of one phase count once (the outermost)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.depth: dict[str, int] = defaultdict(int)

    def wrap(self, owner, name: str, phase, is_method: bool = True):
        """Replace ``owner.name`` by a timed version; ``phase`` is a name or a function of the call's args."""
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            key = phase(*args, **kwargs) if callable(phase) else phase
            if key is None:
                return original(*args, **kwargs)
            self.depth[key] += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.depth[key] -= 1
                if self.depth[key] == 0:
                    self.seconds[key] += time.perf_counter() - start

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def instrument(timers: Timers, work: Work) -> None:
    """Timers around the pieces of a step (by class and module attribute, so every caller is timed), and the work
    of each counted (floors.Work)."""
    import lrl.logprobs as logprobs_mod
    import lrl.module as module_mod
    import lrl.rollout as rollout_mod
    from lrl.decoding import Sampling
    from lrl.kvcache import KVBatch
    from lrl.module import OffPolicyModule
    from lrl.sources.sync import SyncSource

    def feed_phase(self, chunks):
        return "decode" if isinstance(chunks, torch.Tensor) and chunks.shape[1] == 1 else "prefill"

    count_feeds(KVBatch, work)
    count_forwards(module_mod, logprobs_mod, work)
    timers.wrap(KVBatch, "feed", feed_phase)
    timers.wrap(rollout_mod, "sample_tokens", "draw")
    timers.wrap(Sampling, "log_probs", "draw")
    timers.wrap(SyncSource, "next_batch", "sample")
    timers.wrap(OffPolicyModule, "score", "old_logp")
    timers.wrap(OffPolicyModule, "heldout_evaluation", "evaluation")
    timers.wrap(OffPolicyModule, "manual_backward", "backward")

    def forward_phase(*args, **kwargs):
        return "forward" if torch.is_grad_enabled() else None

    timers.wrap(module_mod, "token_log_probs", forward_phase)
    timers.wrap(torch.optim.Adam, "step", "optimizer")


def count_feeds(kvbatch, work: Work) -> None:
    """Count each engine forward: a decode step's rows, a prefill's padded tokens (the head scores one a row)."""
    original = kvbatch.feed

    def feed(self, chunks):
        if isinstance(chunks, torch.Tensor) and chunks.shape[1] == 1:
            work.add("decode", len(chunks))
        else:
            width = chunks.shape[1] if isinstance(chunks, torch.Tensor) else max(len(c) for c in chunks)
            work.add("prefill", len(chunks) * width, len(chunks))
        return original(self, chunks)

    kvbatch.feed = feed


def count_forwards(module_mod, logprobs_mod, work: Work) -> None:
    """Count the update's forwards (and so its backwards) and pi_old's: body tokens and head positions of each."""

    def counted(original, grad_phase, plain_phase):
        def call(model, ids, attention_mask, temperature=1.0, positions=None, *args, **kwargs):
            prefix = kwargs.get("prefix")
            head = int(positions.sum()) if positions is not None else ids.shape[0] * (ids.shape[1] - 1)
            rows = body_tokens(ids, attention_mask, prefix if positions is not None else None)
            if torch.is_grad_enabled():
                work.add(grad_phase, rows, head)
                work.add("backward", rows, head)
            elif plain_phase:
                work.add(plain_phase, rows, head)
            return original(model, ids, attention_mask, temperature, positions, *args, **kwargs)

        return call

    module_mod.token_log_probs = counted(module_mod.token_log_probs, "forward", None)
    logprobs_mod.token_log_probs = counted(logprobs_mod.token_log_probs, "forward", "old_logp")


class OperatorProfile:
    """The update's forwards and backwards profiled by operator (torch.profiler), summed over the steps."""

    def __init__(self):
        self.profiles = []

    def around(self, fn):
        def call(*args, **kwargs):
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = fn(*args, **kwargs)
            self.profiles.append(prof)
            return out

        return call

    def table(self, top: int) -> str:
        """The `top` operators by self time: seconds, share of the profiled time, calls, microseconds a call."""
        seconds: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        for prof in self.profiles:
            for event in prof.key_averages():
                seconds[event.key] += event.self_cpu_time_total / 1e6
                calls[event.key] += event.count
        total = sum(seconds.values()) or 1.0
        lines = [f"{'operator':<60} {'seconds':>8} {'share':>6} {'calls':>7} {'us/call':>8}"]
        for key in sorted(seconds, key=seconds.get, reverse=True)[:top]:
            lines.append(f"{key[:60]:<60} {seconds[key]:8.2f} {seconds[key] / total:6.1%} {calls[key]:7d} "
                         f"{1e6 * seconds[key] / max(calls[key], 1):8.0f}")  # fmt: skip
        lines.append(f"{'all':<60} {total:8.2f}")
        return "\n".join(lines)


def profile_updates() -> OperatorProfile:
    """Profile every minibatch update of the run (its forwards, loss and backwards) by operator."""
    from lrl.module import OffPolicyModule

    ops = OperatorProfile()
    OffPolicyModule.minibatch_update = ops.around(OffPolicyModule.minibatch_update)
    return ops


FLOOR_PHASES = ("prefill", "decode", "old_logp", "forward", "backward")


def floor_table(rows, floors: Floors) -> None:
    """Each trained step's phases beside their floors on this machine (floors.py): the matrix products alone."""
    print("\nphases beside their floors (the model's matrix products alone at the phase's shapes, floors.py)")
    print(f"machine: GEMM floors measured here; memory read {floors.bandwidth / 1e9:.1f} GB/s")
    print(f"{'step':>4} {'phase':<9} {'seconds':>8} {'GFLOP':>8} {'floor s':>8} {'share':>6} {'GFLOP/s':>8}")
    for i, _total, parts, skipped, work in rows:
        if skipped:
            continue
        update = [0.0, 0.0, 0.0]
        for phase in FLOOR_PHASES:
            flops, floor = floors.phase(phase, work.get(phase, []))
            seconds = parts[phase]
            if phase in ("forward", "backward"):
                update = [update[0] + seconds, update[1] + flops, update[2] + floor]
            print(f"{i:>4} {phase:<9} {seconds:8.2f} {flops / 1e9:8.0f} {floor:8.2f} "
                  f"{floor / seconds if seconds else 0:6.0%} {flops / seconds / 1e9 if seconds else 0:8.0f}")  # fmt: skip
        seconds, flops, floor = update
        if seconds:
            print(f"{i:>4} {'update':<9} {seconds:8.2f} {flops / 1e9:8.0f} {floor:8.2f} {floor / seconds:6.0%} "
                  f"{flops / seconds / 1e9:8.0f}")  # fmt: skip


def split(raw: dict[str, float], step_seconds: float) -> dict[str, float]:
    """A step's raw timer seconds -> the PHASES (sampling's parts out of its whole)."""
    out = {p: raw.get(p, 0.0) for p in PHASES}
    inner = out["prefill"] + out["decode"] + out["draw"]
    out["sample, rest"] = max(raw.get("sample", 0.0) - inner, 0.0)
    counted = sum(out[p] for p in PHASES if p != "other")
    out["other"] = max(step_seconds - counted, 0.0)
    return out


def main(argv=None) -> int:
    p = OneLineParser(prog="profile_step.py", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4, help="training steps to time")
    p.add_argument(
        "--eval-episodes", type=int, default=64, help="held-out episodes of the timed evaluation (0: none)"
    )
    p.add_argument(
        "--floors", action=argparse.BooleanOptionalAction, default=True,
        help="time the model's matrix products alone at each phase's shapes and print each phase beside them",
    )  # fmt: skip
    p.add_argument(
        "--ops", type=int, default=0, metavar="N",
        help="also profile the updates (forwards and backwards of the trained steps) by operator: the N operators "
        "of most time (0: no operator profile)",
    )  # fmt: skip
    p.add_argument("train_args", nargs="*", help="train.py flags (after --)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.eval_episodes < 0 or args.ops < 0:
        p.error(
            f"--steps must be at least 1 (got {args.steps}), --eval-episodes and --ops at least 0 (got "
            f"{args.eval_episodes}, {args.ops})"
        )

    import lightning as L

    from lrl.arguments import parse_args
    from lrl.config import ConfigError
    from lrl.run import build_run, fit

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_real_model import machine

    flags = ["--env", "calc", *args.train_args]
    flags += [
        "--max-steps",
        str(args.steps),
        "--eval-at-start",
        "false",
        "--eval-every",
        "100000",
        "--progress",
        "false",
    ]
    try:
        cfg = parse_args(flags)
    except ConfigError as err:
        p.error(f"train.py flags: {err}")
    timers = Timers()
    work = Work()
    instrument(timers, work)
    ops = profile_updates() if args.ops else None
    rows: list[tuple[int, float, dict, bool, dict]] = []

    class PerStep(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            timers.take()
            work.take()
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seconds = time.perf_counter() - self.start
            record = pl_module.history[-1]
            skipped = bool(record["train/skipped"])
            rows.append((len(rows), seconds, split(timers.take(), seconds), skipped, work.take()))

    run = build_run(cfg, callbacks=[PerStep()], logger=False)
    run.module.heldout_evaluation = lambda: {"pass_rate": float("nan")}  # fit's final evaluation: timed below
    print(f"machine: {machine()}")
    print(f"run: train.py {' '.join(flags)}")
    fit(run)
    header = f"{'step':>4} {'total':>7} " + " ".join(f"{p:>12}" for p in PHASES) + "  skipped"
    print("\nseconds per step and phase\n" + header)
    for i, total, parts, skipped, _ in rows:
        cells = " ".join(f"{parts[p]:12.2f}" for p in PHASES)
        print(f"{i:>4} {total:7.2f} {cells}  {'yes' if skipped else ''}")
    trained = [r for r in rows if not r[3]]
    if trained:
        med = {p: statistics.median(r[2][p] for r in trained) for p in PHASES}
        total = statistics.median(r[1] for r in trained)
        print(f"{'med':>4} {total:7.2f} " + " ".join(f"{med[p]:12.2f}" for p in PHASES)
              + f"  ({len(trained)} steps that trained)")  # fmt: skip
    if trained and args.floors:
        floor_table(rows, Floors(run.policy))
    if ops is not None:
        print(f"\nthe updates' operators (forwards and backwards of {len(trained)} trained steps, self time)")
        print(ops.table(args.ops))
    if args.eval_episodes:
        cfg.evaluation.eval_episodes = 1
        del run.module.heldout_evaluation  # the class's own method again
        run.spec.heldout_tasks = run.spec.heldout_tasks[: args.eval_episodes]
        start = time.perf_counter()
        stats = run.module.heldout_evaluation()
        print(f"\nheld-out evaluation of {len(run.spec.heldout_tasks)} episodes: {time.perf_counter() - start:.1f} s "
              f"(pass rate {stats['pass_rate']:.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
