"""Bypass against the recomputed pi_old, step time on the calc recipe: one run, the two taking turns step by step.

    python bench/bench_proximal.py                                 # calc on SmolLM2-135M-Instruct, 8 steps
    python bench/bench_proximal.py --steps 4 -- --sampler fp8      # any train.py flags after --

``--proximal recompute`` scores the batch with the trainer's weights before the update (pi_old); ``rollout`` takes
the sampler's own log-probs instead and scores nothing. The run alternates the two on its steps (even steps
recompute, odd steps rollout; the seed, the sampler and everything else the same), with the policy frozen
(learning rate 0: every step samples the same policy, so the workloads stay alike while Adam's work is still
done). Each step's phases come from the run's own history (time/sample, time/old_logp, time/update, time/sync);
the table gives each arm's mean seconds per phase and the ratios rollout / recompute; ``train`` is old_logp +
update, the part the choice changes, and ``step, pooled sampling`` each arm's step with the sampling time of both
arms averaged (sampling does not depend on the choice, and its noise from batch to batch is larger than the
difference measured). Nothing is asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning as L  # noqa: E402

from lrl.cli import OneLineParser  # noqa: E402

ARMS = ("recompute", "rollout")
PHASES = ("sample", "old_logp", "update", "shift", "sync")


class Alternate(L.Callback):
    """Sets the step's proximal choice before it runs: recompute on even versions, rollout on odd ones."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pl_module.cfg.update.proximal = ARMS[pl_module.version % 2]


def table(history: list[dict]) -> list[str]:
    """Each arm's mean seconds per phase and per step, the ratio rollout / recompute of each."""
    rows = {arm: [h for h in history if ARMS[h["step"] % 2] == arm] for arm in ARMS}
    mean = {
        arm: {p: sum(h.get(f"time/{p}", 0.0) for h in hs) / max(len(hs), 1) for p in PHASES}
        for arm, hs in rows.items()
    }
    pooled = sum(mean[arm]["sample"] for arm in ARMS) / len(ARMS)
    for arm in ARMS:
        mean[arm]["step"] = sum(mean[arm].values())
        mean[arm]["train"] = mean[arm]["old_logp"] + mean[arm]["update"]  # what the choice can change
        # sampling does not depend on the choice: each arm's step with the two arms' mean sampling time, so that
        # which episodes happened to be long on which arm's steps does not enter the ratio
        mean[arm]["step, pooled sampling"] = mean[arm]["step"] - mean[arm]["sample"] + pooled
    skipped = {arm: sum(h["train/skipped"] for h in hs) for arm, hs in rows.items()}
    lines = [f"{'seconds (mean)':<24}" + "".join(f"{a:>12}" for a in ARMS) + f"{'ratio':>10}"]
    for key in ("sample", "old_logp", "update", "sync", "train", "step", "step, pooled sampling"):
        a, b = mean["recompute"][key], mean["rollout"][key]
        ratio = f"{b / a:>10.3f}" if a > 0 else f"{'-':>10}"
        lines.append(f"{key:<24}{a:>12.2f}{b:>12.2f}{ratio}")
    lines.append(
        f"steps: {len(rows['recompute'])} recompute, {len(rows['rollout'])} rollout; skipped (no advantage "
        f"signal, no update): {int(skipped['recompute'])} and {int(skipped['rollout'])}"
    )
    return lines


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_proximal.py", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8, help="training steps, the two arms taking turns")
    p.add_argument("train_flags", nargs="*", help="train.py flags for both arms (after --)")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error(f"--steps: {args.steps} is not allowed; the two arms take turns, so at least 2")
    from bench_real_model import machine

    from lrl.arguments import parse_args
    from lrl.config import ConfigError
    from lrl.run import build_run

    flags = ["--env", "calc", "--max-steps", str(args.steps), "--freeze-policy", "true", "--eval-at-start"]
    flags += ["false", "--progress", "false", *args.train_flags]
    try:
        cfg = parse_args(flags)
    except ConfigError as err:
        p.error(f"train.py flags: {err}")
    # no held-out evaluation: it would cost both arms alike, and minutes
    run = build_run(cfg, callbacks=[Alternate()], logger=False, limit_val_batches=0)
    print(f"machine: {machine()}")  # after the run set its threads
    print(f"run: {' '.join(flags)}")
    run.trainer.fit(run.module, run.datamodule)
    print("\n".join(table(run.module.history)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
