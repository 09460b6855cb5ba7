"""Whether a change left runs unchanged: two folders of run histories (``--history-file`` JSONL, one step a line)
compared file by file and key by key, every key but ``time/*``, bit for bit.

    python bench/compare_histories.py BEFORE AFTER                 # every BEFORE/*.jsonl against AFTER's namesake
    python bench/compare_histories.py BEFORE AFTER --noise AGAIN   # AGAIN: BEFORE's runs recorded a second time

Each file must have as many steps in both folders, each step the same keys, and every value equal as JSON (floats
are written with repr, so equal text is equal bits). ``run`` (the run's folder) is compared below the recording's
``runs/`` folder. Some keys are wall-clock measurements under another name than ``time/*`` (the pipeline's
occupancy, waits, rates and queue depths), which differ from run to run of the same code; ``--noise`` finds them
as the keys on which two recordings of the same code disagree (in any file), and compares only whether each step
has them. Prints one line per file and the first step where each differing key differs; exit status 1 if any file
differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lrl.cli import OneLineParser


def load(path: Path) -> list[dict]:
    return [normalised(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def normalised(row: dict) -> dict:
    """`run` is the run's folder: compared below the recording's own runs/ folder."""
    if isinstance(row.get("run"), str) and "/runs/" in row["run"]:
        row = {**row, "run": row["run"].split("/runs/", 1)[1]}
    return row


def same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def differs(a: dict, b: dict, key: str, presence: set[str]) -> bool:
    if (key in a) != (key in b):
        return True
    return key in a and key not in presence and not same(a[key], b[key])


def differing(rows_a: list[dict], rows_b: list[dict], presence: set[str] = frozenset()) -> set[str]:
    """Keys (not time/*) that one side lacks in some step, or whose value differs there (for keys in `presence`,
    only whether both have it)."""
    return {
        key
        for a, b in zip(rows_a, rows_b)
        for key in set(a) | set(b)
        if not key.startswith("time/") and differs(a, b, key, presence)
    }


def compare(before: Path, after: Path, noise: set[str]) -> int:
    """Print the comparison of every history in `before` -> how many files differ."""
    bad = 0
    for path in sorted(before.glob("*.jsonl")):
        other = after / path.name
        if not other.exists():
            print(f"{path.name}: missing from {after}")
            bad += 1
            continue
        rows_b, rows_a = load(path), load(other)
        keys = {k for r in rows_b for k in r if not k.startswith("time/")}
        diff = differing(rows_b, rows_a, noise)
        equal = len(rows_a) == len(rows_b) and not diff
        bad += not equal
        counts = f"{len(keys - noise)} keys bit for bit, {len(keys & noise)} for presence"
        print(f"{path.name}: {'IDENTICAL' if equal else 'DIFFERENT'}: {len(rows_b)} steps, {counts}")
        if len(rows_a) != len(rows_b):
            print(f"  steps: {len(rows_b)} before, {len(rows_a)} after")
        for key in sorted(diff):
            step = next(i for i, (b, a) in enumerate(zip(rows_b, rows_a)) if differs(b, a, key, noise))
            print(
                f"  {key} differs first at step {step}: {rows_b[step].get(key)!r} -> {rows_a[step].get(key)!r}"
            )
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="compare_histories.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="folder of the histories before the change")
    parser.add_argument("after", type=Path, help="folder of the same runs' histories after it")
    parser.add_argument("--noise", type=Path, help="BEFORE's runs recorded again: their wall-clock keys")
    args = parser.parse_args(argv)
    for name in ("before", "after", "noise"):  # a missing folder would compare nothing and pass
        folder = getattr(args, name)
        if folder is not None and not folder.is_dir():
            parser.error(f"{name.upper()}: {str(folder)!r} is not a folder")
    if not any(args.before.glob("*.jsonl")):
        parser.error(f"BEFORE: {str(args.before)!r} holds no history (*.jsonl) to compare")
    noise: set[str] = set()
    if args.noise is not None:
        for path in sorted(args.before.glob("*.jsonl")):
            if (args.noise / path.name).exists():
                noise |= differing(load(path), load(args.noise / path.name))
        print(
            "compared for presence only (two recordings of the same code differ): " + ", ".join(sorted(noise))
        )
    return 1 if compare(args.before, args.after, noise) else 0


if __name__ == "__main__":
    sys.exit(main())
