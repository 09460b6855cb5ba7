"""A training step of today's code beside the same step of an earlier commit, on the same machine, in one run.

    python bench/bench_recipe_speed.py                          # the calc recipe, this tree against b714b39
    python bench/bench_recipe_speed.py --ref HEAD~3 --steps 8 -- --sampler fp8   # train.py flags after --
    python bench/bench_recipe_speed.py --ref HEAD --ref-flags="--sampler vllm --vllm-dtype bfloat16"   # two paths

The earlier commit is unpacked from git (``git archive``) into a temporary folder; both trees run ``train.py
--env calc`` with the same flags and seed (the recipe's defaults unless flags are given), each in a process of its
own, and their steps take turns (bench/plugins/step_gate.py), so a change in the machine's load falls on both. A step is
timed from its start (before its batch is sampled) to the end of its update and weight sync.

Reported: every step of both (seconds, whether it trained, its reward and the step's own sample / old_logp /
update laps), then each side's median over the steps that trained (a step with no group of differing rewards only
samples and scores; the two runs draw different tokens once the draw changed, so they skip different steps: those
are listed apart) and the ratio of the medians. Nothing is asserted.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Listener
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
BASELINE = "b714b39"  # the last commit before the step's work was cut (docs/real_model.md, "Speed")

from lrl.cli import OneLineParser  # noqa: E402


def commit_of(ref: str) -> str | None:
    """The full hash of the commit `ref` names in this repository; None where it names none (a ref is never read as
    an option of git's, whatever it starts with)."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", "--end-of-options",
                            f"{ref}^{{commit}}"], capture_output=True, text=True)  # fmt: skip
    return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else None


def unpack(commit: str, into: Path) -> Path:
    """The tree of `commit` (a full hash) of this repository, written into `into` (the repo itself is left as it is)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start(tree: Path, socket: str, flags: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE / 'plugins'}", "LRL_STEP_GATE": socket}
    cmd = [
        sys.executable,
        "train.py",
        "--env",
        "calc",
        *flags,
        "--plugins",
        "step_gate",
        "--callbacks",
        "step_gate",
    ]
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def main(argv=None) -> int:
    p = OneLineParser(prog="bench_recipe_speed.py", description=__doc__.split("\n")[0])
    p.add_argument("--ref", default=BASELINE, help="the earlier commit (default: %(default)s)")
    p.add_argument("--steps", type=int, default=8, help="steps of each run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ref-flags", default="", help="train.py flags for the earlier commit's run only (one string)"
    )
    p.add_argument("train_args", nargs="*", help="train.py flags (after --)")
    args = p.parse_args(argv)
    # every input is checked before the earlier tree is unpacked and the runs start (each loads the real model)
    commit = commit_of(args.ref)
    if commit is None:
        p.error(f"--ref: {args.ref!r} is not a commit of this repository (git rev-parse finds none)")
    if args.steps < 1:
        p.error(f"--steps: {args.steps} is not allowed; a run needs at least 1 step")
    flags = [*args.train_args, "--max-steps", str(args.steps), "--seed", str(args.seed), "--eval-at-start", "false",
             "--eval-every", "1000000", "--progress", "false"]  # fmt: skip
    from lrl.arguments import parse_args
    from lrl.config import ConfigError

    try:  # this tree's run takes them as they are (the earlier tree's flags are its own: they are not checked here)
        parse_args(["--env", "calc", *flags])
    except ConfigError as err:
        p.error(f"train.py flags: {err}")
    sys.path.insert(0, str(HERE))
    from bench_real_model import machine

    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True)
    here_name = f"this tree ({head.stdout.strip()}{', with changes' if dirty.stdout.strip() else ''})"
    print(f"machine: {machine()}")
    print(f"each run: train.py --env calc {' '.join(flags)}")
    with tempfile.TemporaryDirectory(prefix="lrl-bench-recipe-") as tmp:
        tmp = Path(tmp)
        (tmp / "old").mkdir()
        old = unpack(commit, tmp / "old")
        trees = {f"{args.ref} {args.ref_flags}".strip(): old, here_name: ROOT}
        listeners, procs, conns = {}, {}, {}
        for i, (name, tree) in enumerate(trees.items()):
            socket = str(tmp / f"gate{i}.sock")
            listeners[name] = Listener(socket, family="AF_UNIX")
            logs = tmp / f"logs{i}"
            extra = args.ref_flags.split() if tree is old else []
            procs[name] = start(tree, socket, [*flags, *extra, "--log-dir", str(logs)], tmp / f"run{i}.log")
        try:
            for name, listener in listeners.items():
                conns[name] = accept(listener, procs[name], name)
            steps = {name: [] for name in trees}
            for name, conn in conns.items():
                wait_ready(name, conn)
            for i in range(args.steps):
                for name, conn in conns.items():
                    conn.send("go")
                    _, seconds, record = conn.recv()
                    steps[name].append((seconds, record))
                    # the other run's step starts only once this one is idle again: at its next gate, or gone
                    if i + 1 < args.steps:
                        wait_ready(name, conn)
                    else:
                        procs[name].terminate()
                        try:
                            procs[name].wait(120)
                        except subprocess.TimeoutExpired:
                            procs[name].kill()
                    laps = "  ".join(
                        f"{k[5:]} {record.get(k, 0.0):5.1f}"
                        for k in ("time/sample", "time/old_logp", "time/update")
                    )
                    print(f"step {i} {name:<24} {seconds:6.1f} s  {'skipped' if record.get('train/skipped') else 'trained'}  "
                          f"reward {record.get('train/reward', float('nan')):.3f}  {laps}", flush=True)  # fmt: skip
        except (EOFError, ConnectionError) as err:
            for i, name in enumerate(trees):
                print(f"--- {name} ---\n{(tmp / f'run{i}.log').read_text()[-3000:]}")
            raise SystemExit(f"a run ended early: {err}") from None
        finally:
            # the gates first: a run waiting at its gate for a turn that will not come reads their end and exits
            for conn in conns.values():
                conn.close()
            for listener in listeners.values():
                listener.close()
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    report(steps)
    return 0


def accept(listener: Listener, proc: subprocess.Popen, name: str):
    """The run's connection to its gate, once it connects; a ConnectionError where the run ends before that (a flag
    its tree refuses, a model it cannot load), instead of waiting for it forever."""
    accepted = []
    waiter = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    waiter.start()
    while waiter.is_alive():
        waiter.join(0.5)
        if waiter.is_alive() and proc.poll() is not None:
            raise ConnectionError(f"{name} exited with status {proc.returncode} before its first step")
    return accepted[0]


def wait_ready(name: str, conn) -> None:
    message = conn.recv()
    if message[0] != "ready":
        raise RuntimeError(f"{name}: {message}")


def report(steps: dict) -> None:
    medians = {}
    print()
    for name, rows in steps.items():
        trained = [s for s, r in rows if not r.get("train/skipped")]
        skipped = [s for s, r in rows if r.get("train/skipped")]
        if trained:
            medians[name] = statistics.median(trained)
        extra = f"; {len(skipped)} skipped (median {statistics.median(skipped):.1f} s)" if skipped else ""
        shown = f"{medians[name]:.2f} s" if name in medians else "-"
        print(f"{name:<24} median step that trained {shown} over {len(trained)} steps{extra}")
    if len(medians) == 2:
        old, new = medians.values()
        print(f"today's median step / the earlier commit's: {new / old:.2f} ({old / new:.2f}x faster)")


if __name__ == "__main__":
    sys.exit(main())
