"""decide's records: one line of ``results.jsonl`` a run, read back whole or not at all, and pooled only with runs
made the same way.

What makes a run, beside its row label and seed, is kept in its record: the train.py flags of every run
(``shared_flags``) and the row's own (``flags``), the configuration they resolve to (``settings``: every option,
defaults included, less those that only say where output goes), the machine, its arithmetic and torch, the commit
and a fingerprint of the training code (``code``: the files of the installed lrl package, so a run of edited code
is told apart from one of its commit). Records written before decide kept all of this hold only their row's flags
(and, for the repository's own records, the shared flags their folder was run with).

Two records are of one setting when their settings agree (where both hold them; else their flags, compared as
options rather than as text, so ``--lag 2 --sampler lagged`` is ``--sampler lagged --lag 2``) and so do their
machine, arithmetic, torch and training code (where both recorded it). A row's table pools the runs of one setting: those of the run being made where there
is one, else the most numerous (ties: the one run last); every run it leaves out is named with what differs.

The file is appended to one whole line at a time (one write, flushed to disk); a line that does not read (cut short
by a crash, or damaged) is named and skipped, and the next record never joins it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

# options that say where a run's output goes, not what it computes: two runs differing only there are alike
OUTPUT_ONLY = frozenset(
    {"seed", "progress", "log_dir", "run_name", "checkpoint_every", "checkpoint_dir", "resume", "history_file",
     "overwrite"}
)  # fmt: skip
WHERE = ("machine", "precision", "torch", "code")


# -- what makes a run ----------------------------------------------------------------------------------------------
def settings(cfg) -> dict:
    """A run's configuration as its record keeps it: every option, less :data:`OUTPUT_ONLY`, as JSON values."""
    values = {k: v for k, v in cfg.to_dict().items() if k not in OUTPUT_ONLY}
    return json.loads(json.dumps(values, default=str))


def code_fingerprint() -> str:
    """16 hex digits of SHA-256 over the installed lrl package's files (paths and contents; its samplers and
    callbacks included, compiled caches not): the same for two runs of the same training code, wherever it lives."""
    import lrl

    root = Path(lrl.__file__).resolve().parent
    digest = hashlib.sha256()
    files = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [Path(folder, n) for n in names if not n.endswith((".pyc", ".pyo"))]
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def options(words: list[str]) -> tuple:
    """Flags as options: ``--name value...`` groups, the last of a repeated name standing (as argparse takes it),
    sorted by name -> a tuple that compares equal for the same options in any order."""
    groups: dict[str, list[str]] = {}
    name = ""
    for word in words:
        if word.startswith("--"):
            name, _, inline = word.partition("=")
            groups[name] = [inline] if inline else []
        else:
            groups.setdefault(name, []).append(word)
    return tuple(sorted((k, tuple(v)) for k, v in groups.items()))


def flag_words(text: str | None) -> list[str]:
    try:
        return shlex.split(text or "")
    except ValueError:  # an unbalanced quote: the words as written
        return (text or "").split()


def same_setting(a: dict, b: dict) -> bool:
    """Whether two records (or a record and the run about to be made) are of one setting (module docstring); a shared
    flag, machine, arithmetic, torch or code fingerprint that one of them did not record is taken to agree."""
    if any(a.get(k) is not None and b.get(k) is not None and a[k] != b[k] for k in WHERE):
        return False
    if "settings" in a and "settings" in b:
        return a["settings"] == b["settings"]
    shared = [r.get("shared_flags") for r in (a, b)]
    if None in shared:  # compare the rows' own flags only
        return options(flag_words(a.get("flags"))) == options(flag_words(b.get("flags")))
    return options(flag_words(shared[0]) + flag_words(a.get("flags"))) == options(
        flag_words(shared[1]) + flag_words(b.get("flags"))
    )


def difference(run: dict, like: dict) -> str:
    """What sets `run` apart from the runs it was left out of, in a few words."""
    for key in WHERE:
        if run.get(key) is not None and like.get(key) is not None and run[key] != like[key]:
            return f"{key} {run[key]} (the row's: {like[key]})"
    if "settings" in run and "settings" in like:
        keys = sorted(k for k in run["settings"].keys() | like["settings"].keys()
                      if run["settings"].get(k) != like["settings"].get(k))  # fmt: skip
        said = [f"{k} {run['settings'].get(k)!r} (the row's: {like['settings'].get(k)!r})" for k in keys[:3]]
        return ", ".join(said) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    if run.get("shared_flags") is None or like.get("shared_flags") is None:  # the row's own flags only
        return f"row flags {run.get('flags') or ''!r} (the row's: {like.get('flags') or ''!r})"
    mine = shlex.join([*flag_words(run.get("shared_flags")), *flag_words(run.get("flags"))])
    theirs = shlex.join([*flag_words(like.get("shared_flags")), *flag_words(like.get("flags"))])
    return f"flags {mine!r} (the row's: {theirs!r})"


# -- the file --------------------------------------------------------------------------------------------------
def read(path: Path) -> tuple[list[dict], list[str]]:
    """The records of a results file, and one line for each line of it that does not read as a record (skipped)."""
    runs, damaged = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                cut = "" if line.endswith("\n") else ", cut short (a run's write was interrupted)"
                damaged.append(f"{path}:{number}: not a record ({err.msg}{cut}); skipped")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("row"), str) or type(record.get("seed")) is not int:
                damaged.append(f"{path}:{number}: not a run's record (no row label and whole seed); skipped")
                continue
            runs.append(record)
    return runs, damaged


def append(path: Path, record: dict) -> None:
    """Add one record as one whole line: written in one call, on a fresh line (a last line cut short stays alone,
    to be named and skipped), and flushed to disk before the next run is counted as kept."""
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


# -- pooling ------------------------------------------------------------------------------------------------------
def pool(results: list[dict], rows: dict[str, str | None], wanted: dict[str, dict] | None = None):
    """The runs a table of `rows` pools, and one line for each row that left runs out -> (runs, lines).

    `rows`: label -> the row's flags (None: any); a run of the label made with other row flags is left out.
    `wanted`: label -> the record a run made now would carry (its settings, machine...): the row pools the runs
    of that setting. Else the row pools its most numerous setting (ties: the one with the run recorded last). Of
    runs of one seed in the pooled setting the last recorded stands (the others are named)."""
    kept, lines = [], []
    for label, flags in rows.items():
        mine = [r for r in results if r["row"] == label]
        left: list[tuple[dict, str]] = []
        if flags is not None:
            given = {"flags": flags}
            left += [(r, f"row flags {r.get('flags') or '(none)'!r}, not {flags or '(none)'!r}")
                     for r in mine if not same_setting(dict(r, shared_flags=None), given)]  # fmt: skip
            mine = [r for r in mine if same_setting(dict(r, shared_flags=None), given)]
        groups: list[list[dict]] = []
        for r in mine:
            group = next((g for g in groups if same_setting(g[0], r)), None)
            group.append(r) if group is not None else groups.append([r])
        if wanted and label in wanted:
            chosen = next((g for g in groups if same_setting(g[0], wanted[label])), [])
        else:
            last = {id(r): i for i, r in enumerate(mine)}
            chosen = max(groups, key=lambda g: (len({r["seed"] for r in g}), max(last[id(r)] for r in g)), default=[])
        by_seed: dict[int, dict] = {}
        for r in chosen:
            if r["seed"] in by_seed:
                left.append((by_seed[r["seed"]], "an earlier run of the same seed and setting"))
            by_seed[r["seed"]] = r
        like = chosen[0] if chosen else wanted.get(label) if wanted else None
        left += [(r, difference(r, like) if like else "") for g in groups if g is not chosen for r in g]
        kept += sorted(by_seed.values(), key=lambda r: r["seed"])
        if left:
            said = "; ".join(f"seed {r['seed']} ({why})" if why else f"seed {r['seed']}" for r, why in left)
            lines.append(f"- row {label!r}: {len(left)} run(s) left out, made otherwise than its {len(by_seed)}: {said}")
    return kept, lines
