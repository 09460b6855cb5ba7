"""The records' tables, rendered again from the records: each ``table.md`` under ``docs/results/records/`` is what the
command it names prints today from the ``results.jsonl`` beside it.

    python -m lrl_lab.experiments.render            # check every table and figure: exit 1, naming each that differs
    python -m lrl_lab.experiments.render --write    # write every table and figure again from its records

A ``table.md`` holds one or more blocks, each as ``decide`` writes it: a line with the train.py flags of the runs,
``Tabled again by: COMMAND``, an empty line, then what COMMAND printed. A block's text is compared with what its
command prints now, line for line; so a number changed in a record, in a table, or in the code that makes the tables
shows as a difference until the table is written again (``--write``) and the change is committed with it.

A page's sentences quote the same tables: a figure in prose is written between two comments that name the cell it
is (invisible where the page is shown),

    <!-- figure calc-t07-epyc-avx2 1 differences "lag 4" "held-out, greedy" -->-0.170 ± 0.160<!-- /figure -->

(the records folder, the block of its table.md counted from 1, the table - ``rows``, ``differences``, ``claims``,
``kinds`` or, for a budgeted command, ``sequential`` - the row's first cell and the column's header; an optional
sixth word, ``mean`` or ``half``, quotes the part before or after " ± "). The check reads every figure of README.md and docs/ against its cell as the block's
command prints it now, and ``--write`` writes them again with the tables.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECORDS = ROOT / "docs" / "results" / "records"
COMMAND = "Tabled again by: "
MODULE = ["python", "-m", "lrl_lab.experiments.decide"]
FIGURE = re.compile(r"<!-- figure (?P<spec>[^>]*?) -->(?P<text>.*?)<!-- /figure -->", re.S)
# each table of a block, known by the start of its header line
TABLES = {
    "rows": "| row | seeds | learned (+",
    "differences": "| row | seeds | learned: only row",
    "claims": "| claim |",
    "kinds": "| row | runs |",
    "sequential": "| comparison | seeds | look |",
}
PARTS = ("mean", "half")


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


def printed_now(command: str, root: Path = ROOT, printed: dict | None = None) -> str:
    """:func:`render` of `command`, once per `printed` (a memo by command: a check or a write renders each block's
    command once, for its table and for every figure that quotes it)."""
    if printed is None:
        return render(command, root)
    if command not in printed:
        printed[command] = render(command, root)
    return printed[command]


def differences(folder: Path, root: Path = ROOT, printed: dict | None = None) -> list[str]:
    """Each block of `folder`/table.md whose text is not what its command prints now, as a short unified diff."""
    table = folder / "table.md"
    found = []
    for block in blocks(table.read_text()):
        now = printed_now(block.command, root, printed)
        if now != block.text:
            diff = difflib.unified_diff(block.text.splitlines(), now.splitlines(), "table.md", "rendered now", n=0,
                                        lineterm="")  # fmt: skip
            found.append(f"{table.relative_to(root) if table.is_relative_to(root) else table}: "
                         f"{block.command}\n" + "\n".join(list(diff)[:12]))  # fmt: skip
    return found


class FigureError(ValueError):
    """A figure's comment names no cell: a folder, block, table, row or column that is not there."""


def cell(spec: str, root: Path = ROOT, printed: dict | None = None) -> str:
    """The text of the cell a figure's `spec` names (module docstring), as its block's command prints it now
    (`printed`: the commands' texts already printed, by command, filled as they are)."""
    words = shlex.split(spec)
    if len(words) not in (5, 6) or (len(words) == 6 and words[5] not in PARTS):
        raise FigureError(f"figure {spec!r}: want FOLDER BLOCK TABLE ROW COLUMN [mean|half]")
    folder, block, table, row, column = words[:5]
    path = root / "docs" / "results" / "records" / folder / "table.md"
    if not path.is_file():
        raise FigureError(f"figure {spec!r}: no records table {path}")
    found = blocks(path.read_text())
    if not block.isdigit() or not 1 <= int(block) <= len(found):
        raise FigureError(f"figure {spec!r}: {folder} has blocks 1-{len(found)}")
    if table not in TABLES:
        raise FigureError(f"figure {spec!r}: the table is one of {', '.join(TABLES)}")
    command = found[int(block) - 1].command
    lines = printed_now(command, root, printed).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(TABLES[table])), None)
    if start is None:
        raise FigureError(f"figure {spec!r}: block {block} of {folder} prints no {table} table")
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    if column not in header:
        raise FigureError(f"figure {spec!r}: the {table} table's columns are {header}")
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == row:
            text = cells[header.index(column)]
            if len(words) == 6:
                mean, _, half = text.partition(" ± ")
                text = mean if words[5] == "mean" else half
            return text
    raise FigureError(f"figure {spec!r}: the {table} table has no row {row!r}")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages whose figures are checked: README.md and every page under docs/."""
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.is_file()]


def figure_differences(page: Path, root: Path = ROOT, printed: dict | None = None) -> list[str]:
    """Each figure of `page` whose text is not its cell's today: ``page:line: says X, the records say Y``."""
    text = page.read_text()
    printed = {} if printed is None else printed
    found = []
    for match in FIGURE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        where = f"{page.relative_to(root) if page.is_relative_to(root) else page}:{line}"
        try:
            now = cell(match["spec"], root, printed)
        except FigureError as err:
            found.append(f"{where}: {err}")
            continue
        if now != match["text"]:
            found.append(f"{where}: says {match['text']!r}, the records say {now!r} ({match['spec']})")
    return found


def write_figures(page: Path, root: Path = ROOT, printed: dict | None = None) -> int:
    """Write `page`'s figures again from their cells -> how many changed (a figure naming no cell: FigureError)."""
    text = page.read_text()
    printed = {} if printed is None else printed
    changed = 0

    def again(match):
        nonlocal changed
        now = cell(match["spec"], root, printed)
        changed += now != match["text"]
        return f"<!-- figure {match['spec']} -->{now}<!-- /figure -->"

    out = FIGURE.sub(again, text)
    if changed:
        page.write_text(out)
    return changed


def write(folder: Path, root: Path = ROOT, printed: dict | None = None) -> None:
    """Write `folder`/table.md again: every block's text as its command prints it now."""
    table = folder / "table.md"
    parts = [f"{b.head}\n{COMMAND}{b.command}\n\n{printed_now(b.command, root, printed)}" for b in blocks(table.read_text())]
    table.write_text("\n".join(parts))


def folders(root: Path = ROOT) -> list[Path]:
    return sorted(p.parent for p in (root / "docs" / "results" / "records").glob("*/table.md"))


def main(argv=None) -> int:
    from lrl.cli import OneLineParser

    p = OneLineParser(prog="python -m lrl_lab.experiments.render", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="write every table and figure again from its records")
    args = p.parse_args(argv)
    printed: dict = {}
    if args.write:
        for folder in folders():
            write(folder, ROOT, printed)
            print(f"wrote {folder.relative_to(ROOT) / 'table.md'}")
        for page in pages():
            try:
                changed = write_figures(page, ROOT, printed)
            except FigureError as err:
                print(f"{page.relative_to(ROOT)}: {err}", file=sys.stderr)
                return 1
            if changed:
                print(f"wrote {changed} figure(s) of {page.relative_to(ROOT)}")
        return 0
    found = [d for folder in folders() for d in differences(folder, ROOT, printed)]
    figures = [d for page in pages() for d in figure_differences(page, ROOT, printed)]
    for d in found + figures:
        print(d)
    if found or figures:
        print(f"{len(found)} table(s) and {len(figures)} figure(s) of the pages differ from their records")
    else:
        print("every table and every figure of the pages is its records'")
    return 1 if found or figures else 0


if __name__ == "__main__":
    sys.exit(main())
