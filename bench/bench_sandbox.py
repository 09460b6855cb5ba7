"""The codefix sandbox's start-up cost per run, at each level, against the same measure of an earlier revision.

    python bench/bench_sandbox.py                          # this tree, every level that works here
    python bench/bench_sandbox.py --baseline 2609ac5       # and that revision's harness, interleaved

One run is ``harness.run`` on a candidate that does nothing but define the function its one test calls: what
it costs is the sandbox (fresh folder, fork, namespaces, mounts, the interpreter's start, the judge, clean-up),
not the test. The two harnesses run in turns (one run of each, repeated), so a change in the machine's load
weighs on both alike; the ratio is the median of the new over the median of the old. A bare ``python -I -S -B``
start is timed the same way, as the floor every level pays, and this tree's namespaces level once more on the
machine's filesystem (read-only, the fallback of ``auto``): the difference is what a filesystem of its own costs.
Nothing is asserted: it prints the numbers and the machine they came from.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SANDBOX = "lrl/envs/codefix/sandbox"
sys.path.insert(0, str(ROOT))

from lrl.cli import OneLineParser  # noqa: E402

SOURCE = "def double(x):\n    return 2 * x\n"
CALLS, EXPECT = ["double(21)"], [{"value": 42}]


def load_harness(folder: Path, name: str):
    """The harness module of a sandbox folder (its siblings importable), imported as `name`."""
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / "harness.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def revision_of(revision: str) -> tuple[str | None, str]:
    """The full hash of the commit `revision` names, and why it cannot serve as the baseline ('' where it can): it
    must be a commit of this repository (never read as an option of git's) whose tree holds the sandbox."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"],
                           cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    commit = found.stdout.strip() if found.returncode == 0 else ""
    if not commit:
        return None, f"--baseline: {revision!r} is not a commit of this repository (git rev-parse finds none)"
    has = subprocess.run(["git", "cat-file", "-e", f"{commit}:{SANDBOX}"], cwd=ROOT, capture_output=True)
    if has.returncode != 0:
        return None, f"--baseline: {revision} has no {SANDBOX} (the sandbox came after it)"
    return commit, ""


def baseline_harness(revision: str, into: Path):
    """The harness (and its runner) of an earlier revision, written out of git into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{SANDBOX}"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    for name in listing:
        text = subprocess.run(["git", "show", f"{revision}:{SANDBOX}/{name}"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
        (into / name).write_text(text)
    return load_harness(into, f"harness_{revision}")


def boxes(harness, root: str, uid: int | None) -> dict:
    """level -> a probed Sandbox of this harness (the levels that work here)."""
    found = {}
    choose = (
        getattr(harness, "choose", None) or sys.modules[harness.__name__.replace("harness", "levels")].choose
    )
    for level in ("namespaces", "rlimits"):
        try:
            box, notes = choose(level, root, harness.Limits(wall_seconds=2.0, cpu_seconds=2), uid)
        except OSError as err:
            print(f"  {level}: does not work here ({err})")
            continue
        found[level] = box
    if "namespaces" in found and hasattr(
        found["namespaces"], "own_root"
    ):  # the same level on the host's files
        ns = found["namespaces"]
        found["namespaces, host fs"] = harness.Sandbox(root, "namespaces", ns.limits, ns.uid, own_root=False)
    return found


def one_run(harness, box) -> float:
    start = time.perf_counter()
    verdict = harness.run(box, {"solution.py": SOURCE}, "solution", CALLS, EXPECT, "bench")
    seconds = time.perf_counter() - start
    if verdict.kind != "passed":
        raise SystemExit(f"the bench candidate did not pass at {box.level}: {verdict.kind} {verdict.detail}")
    return seconds


def bare_start() -> float:
    start = time.perf_counter()
    subprocess.run([os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", "pass"], check=True)
    return time.perf_counter() - start


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or "unknown CPU")  # fmt: skip
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


def main(argv=None) -> int:
    p = OneLineParser(
        prog="bench_sandbox.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=100, help="runs per level and harness (default 100)")
    p.add_argument("--baseline", default=None, metavar="REV", help="also time this git revision's harness")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error(f"--runs: {args.runs} is not allowed; it must be at least 1")
    baseline = None
    if args.baseline is not None:
        baseline, problem = revision_of(args.baseline)
        if problem:
            p.error(problem)
    uid = (
        1_999_000 if os.geteuid() == 0 else None
    )  # as root, an unused user id, as the pool gives its workers
    with tempfile.TemporaryDirectory(prefix="lrl-bench-sandbox-") as tmp:
        os.chmod(tmp, 0o711)
        sys.path.insert(0, str(ROOT))
        from lrl.envs.codefix.sandbox import harness as current
        from lrl.envs.codefix.sandbox import levels  # noqa: F401  (where this tree's choose lives)

        current.adopt_orphans()  # as an environment worker does: this tree kills what a run leaves
        harnesses = {"this tree": current}
        if baseline:
            harnesses[args.baseline] = baseline_harness(baseline, Path(tmp) / "baseline")
        setups = {}
        for label, harness in harnesses.items():
            root = os.path.join(tmp, label.replace(" ", "-"))
            os.makedirs(os.path.join(root, "python"), mode=0o755)
            os.chmod(root, 0o711)
            print(f"{label}:")
            setups[label] = (harness, boxes(harness, root, uid))
        times: dict = {}
        for _ in range(args.runs):
            times.setdefault(("bare", "python -I -S -B"), []).append(bare_start())
            for label, (harness, found) in setups.items():
                for level, box in found.items():
                    times.setdefault((label, level), []).append(one_run(harness, box))
    print(f"\nmachine: {machine()}; {args.runs} runs each, interleaved")
    print(f"{'harness':<12} {'level':<20} {'median ms':>10} {'p90 ms':>8}")
    medians = {}
    for (label, level), values in times.items():
        values.sort()
        medians[(label, level)] = statistics.median(values)
        p90 = values[int(0.9 * (len(values) - 1))]
        print(f"{label:<12} {level:<20} {1e3 * medians[(label, level)]:>10.1f} {1e3 * p90:>8.1f}")
    own, host = medians.get(("this tree", "namespaces")), medians.get(("this tree", "namespaces, host fs"))
    if own and host:
        print(
            f"this tree: a filesystem of its own / the machine's, read-only = {own / host:.2f} (median per run)"
        )
    if args.baseline:
        for level in ("namespaces", "rlimits"):
            new, old = medians.get(("this tree", level)), medians.get((args.baseline, level))
            if new and old:
                print(f"{level}: this tree / {args.baseline} = {new / old:.2f} (median per run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
