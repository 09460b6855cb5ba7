"""The records' tables, rendered again from the records: each ``table.md`` under ``docs/results/records/`` is what the
command it names prints today from the ``results.jsonl`` beside it.

    python -m lrl_lab.experiments.render            # check every folder: exit 1, naming each table that differs
    python -m lrl_lab.experiments.render --write    # write every table again from its records

A ``table.md`` holds one or more blocks, each as ``decide`` writes it: a line with the train.py flags of the runs,
``Tabled again by: COMMAND``, an empty line, then what COMMAND printed. A block's text is compared with what its
command prints now, line for line; so a number changed in a record, in a table, or in the code that makes the tables
shows as a difference until the table is written again (``--write``) and the change is committed with it.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECORDS = ROOT / "docs" / "results" / "records"
COMMAND = "Tabled again by: "
MODULE = ["python", "-m", "lrl_lab.experiments.decide"]


@dataclass
class Block:
    head: str  # the line of the runs' train.py flags
    command: str  # what follows "Tabled again by: "
    text: str  # what the command printed when the table was written


def blocks(text: str) -> list[Block]:
    """The blocks of a table.md (module docstring); a file without a command line holds none."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(COMMAND)]
    out = []
    for n, i in enumerate(starts):
        end = starts[n + 1] - 1 if n + 1 < len(starts) else len(lines)  # the next block's flags line
        body = lines[i + 2 : end]  # after the command line and its empty line
        out.append(Block(lines[i - 1] if i else "", lines[i][len(COMMAND) :], "\n".join(body).rstrip() + "\n"))
    return out


def render(command: str, root: Path = ROOT) -> str:
    """What `command` (a decide --from-results command) prints now, its results path read from `root`."""
    from lrl_lab.experiments.decide import main

    argv = shlex.split(command)
    if argv[: len(MODULE)] != MODULE or "--from-results" not in argv:
        raise ValueError(f"not a decide --from-results command: {command}")
    argv = argv[len(MODULE) :]
    at = argv.index("--from-results") + 1
    argv[at] = str(root / argv[at]) if not Path(argv[at]).is_absolute() else argv[at]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    if code != 0:
        raise ValueError(f"{command} exited {code}")
    return out.getvalue().rstrip() + "\n"


def differences(folder: Path, root: Path = ROOT) -> list[str]:
    """Each block of `folder`/table.md whose text is not what its command prints now, as a short unified diff."""
    table = folder / "table.md"
    found = []
    for block in blocks(table.read_text()):
        now = render(block.command, root)
        if now != block.text:
            diff = difflib.unified_diff(block.text.splitlines(), now.splitlines(), "table.md", "rendered now", n=0,
                                        lineterm="")  # fmt: skip
            found.append(f"{table.relative_to(root) if table.is_relative_to(root) else table}: "
                         f"{block.command}\n" + "\n".join(list(diff)[:12]))  # fmt: skip
    return found


def write(folder: Path, root: Path = ROOT) -> None:
    """Write `folder`/table.md again: every block's text as its command prints it now."""
    table = folder / "table.md"
    parts = [f"{b.head}\n{COMMAND}{b.command}\n\n{render(b.command, root)}" for b in blocks(table.read_text())]
    table.write_text("\n".join(parts))


def folders(root: Path = ROOT) -> list[Path]:
    return sorted(p.parent for p in (root / "docs" / "results" / "records").glob("*/table.md"))


def main(argv=None) -> int:
    from lrl.cli import OneLineParser

    p = OneLineParser(prog="python -m lrl_lab.experiments.render", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="write every table again from its records")
    args = p.parse_args(argv)
    if args.write:
        for folder in folders():
            write(folder)
            print(f"wrote {folder.relative_to(ROOT) / 'table.md'}")
        return 0
    found = [d for folder in folders() for d in differences(folder)]
    for d in found:
        print(d)
    print(f"{len(found)} table(s) differ from their records" if found else "every table is its records'")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
