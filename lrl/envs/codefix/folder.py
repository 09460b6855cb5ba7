"""A user's codefix tasks, from a folder (``--codefix-tasks DIR``, format in docs/sandbox.md), checked before the run.

Everything is read with bounds and checked before a run starts, and anything that cannot be used is one
:class:`TaskFolderError` naming the file: ``task.json`` is strict JSON (no NaN or Infinity, no key twice) of at
most :data:`MAX_TASK_BYTES`, its calls are Python expressions of at most :data:`MAX_CALL_CHARS` characters
whose syntax trees nest at most :data:`MAX_CALL_DEPTH` deep (whatever this process's recursion limit), its
expected values keep to the bounds of what a sandbox can report (:mod:`lrl.envs.codefix.sandbox.results`), and
an expected exception is named as ``type(err).__name__`` gives it; ``solution.py`` and every candidate are
regular files (a link to one is one) of at most :data:`MAX_MODULE_BYTES`, in UTF-8, that compile. A folder, a
link to nothing, a FIFO or a device where a file is due is refused without being opened for reading.
"""

from __future__ import annotations

import ast
import builtins
import os
import stat
from pathlib import Path

from lrl.envs.codefix.sandbox import results
from lrl.envs.codefix.tasks import MAX_CALLS, MAX_CANDIDATES, MODULE, CodeTask

MAX_TASK_BYTES = 4 << 20  # a task.json: no larger than the result channel that must carry its values
MAX_MODULE_BYTES = 1 << 20  # the shipped module and each candidate
MAX_CALL_CHARS = 10_000  # one test call
MAX_CALL_DEPTH = 100  # its syntax tree's nesting (unary operators, brackets, chains of binary operators)


class TaskFolderError(ValueError):
    """A task folder that cannot be read: the message names the file and what is wrong with it."""


def load_tasks(folder) -> list[CodeTask]:
    """The tasks of a folder (docs/sandbox.md): one sub-folder per task, each with ``task.json`` (``calls``,
    ``expect``, ``split``; optional ``family``), ``solution.py`` (the module as shipped) and ``candidates/1.py``
    ... ``candidates/K.py``; optional ``correct`` in task.json lists the candidates that should pass (checked
    by the tests of the format, not by training). Raises TaskFolderError naming the file."""
    root = Path(folder)
    if not root.is_dir():
        raise TaskFolderError(f"{root}: not a folder")
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    if not dirs:
        raise TaskFolderError(f"{root}: no task folders in it (one sub-folder per task)")
    tasks = [_load_task(d, i) for i, d in enumerate(dirs)]
    splits = {t.split for t in tasks}
    if "train" not in splits or "heldout" not in splits:
        raise TaskFolderError(
            f"{root}: needs tasks of both splits, train and heldout; found {sorted(splits)}"
        )
    return tasks


def read_file(path: Path, limit: int, what: str) -> str:
    """A regular file's text (UTF-8, at most `limit` bytes), read without blocking -> its text;
    TaskFolderError naming the file for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise TaskFolderError(f"{path}: a link to nothing ({os.readlink(path)}); {what}") from None
        raise TaskFolderError(f"{path}: missing ({what})") from None
    except OSError as err:
        raise TaskFolderError(f"{path}: cannot be read ({err.strerror or err})") from None
    if stat.S_ISDIR(st.st_mode):
        raise TaskFolderError(f"{path}: a folder; it must be a file ({what})")
    if not stat.S_ISREG(st.st_mode):
        raise TaskFolderError(
            f"{path}: not a regular file (a FIFO, socket or device); it must be a file ({what})"
        )
    if st.st_size > limit:
        raise TaskFolderError(f"{path}: {st.st_size} bytes; at most {limit} bytes ({what})")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO put there since: no wait
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TaskFolderError(f"{path}: not a regular file; it must be a file ({what})")
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
    except OSError as err:
        raise TaskFolderError(f"{path}: cannot be read ({err.strerror or err})") from None
    if len(data) > limit:
        raise TaskFolderError(f"{path}: more than {limit} bytes ({what})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TaskFolderError(f"{path}: not UTF-8 (byte {err.start}); {what}") from None


def _meta(meta_path: Path) -> dict:
    text = read_file(meta_path, MAX_TASK_BYTES, "the task's calls and expectations")
    try:
        meta = results.loads(text, results.MAX_DEPTH + 3)  # {"expect": [{"value": V}]}: V may nest MAX_DEPTH
    except results.Unparseable as err:
        raise TaskFolderError(f"{meta_path}: not valid JSON: {err}") from None
    if not isinstance(meta, dict):
        raise TaskFolderError(f"{meta_path}: must be a JSON object")
    return meta


def _calls(meta_path: Path, meta: dict) -> list[str]:
    calls = meta.get("calls")
    if not isinstance(calls, list) or not calls or not all(isinstance(c, str) and c.strip() for c in calls):
        raise TaskFolderError(f"{meta_path}: 'calls' must be a non-empty list of expression strings")
    if len(calls) > MAX_CALLS:
        raise TaskFolderError(f"{meta_path}: {len(calls)} calls; a task may have at most {MAX_CALLS}")
    for j, c in enumerate(calls):
        if len(c) > MAX_CALL_CHARS:
            raise TaskFolderError(f"{meta_path}: calls[{j}] is {len(c)} characters; at most {MAX_CALL_CHARS}")
        try:
            tree = ast.parse(c, f"call {j}", "eval")
            deep = _depth(tree) > MAX_CALL_DEPTH
        except (SyntaxError, ValueError):
            raise TaskFolderError(f"{meta_path}: calls[{j}] is not a Python expression: {c[:80]!r}") from None
        except (RecursionError, MemoryError):
            deep = True
        if deep:  # the sandbox's interpreter compiles it at the default recursion limit: keep far below it
            raise TaskFolderError(
                f"{meta_path}: calls[{j}] nests more than {MAX_CALL_DEPTH} deep: {c[:80]!r}"
            ) from None
    return calls


def _depth(tree: ast.AST) -> int:
    """How deep a syntax tree nests, without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _expectations(meta_path: Path, meta: dict, n: int) -> list:
    expect = meta.get("expect")
    if not isinstance(expect, list) or len(expect) != n:
        raise TaskFolderError(f"{meta_path}: 'expect' must be a list with one entry per call ({n})")
    for j, e in enumerate(expect):
        if not (
            isinstance(e, dict)
            and (set(e) == {"value"} or (set(e) == {"raises"} and isinstance(e["raises"], str)))
        ):
            raise TaskFolderError(
                f'{meta_path}: expect[{j}] must be {{"value": V}} or {{"raises": "ExceptionName"}}'
            )
        if "raises" in e and not _exception_name(e["raises"]):
            raise TaskFolderError(
                f"{meta_path}: expect[{j}] raises {e['raises'][:60]!r}, which no call can raise; give the name of "
                "an exception class as type(err).__name__ gives it (ValueError, or a class of the module)"
            )
        if "value" in e and results.depth(e["value"]) > results.MAX_DEPTH:
            raise TaskFolderError(
                f"{meta_path}: expect[{j}] holds values nested more than {results.MAX_DEPTH} deep"
            )
    return expect


def _exception_name(name: str) -> bool:
    """Whether a call can raise an exception of this name: an identifier, and not a builtin other than an
    exception class (a class of the candidate's own module may take any other name)."""
    if not name.isidentifier():
        return False
    known = getattr(builtins, name, None)
    return known is None or (isinstance(known, type) and issubclass(known, BaseException))


def _candidates(d: Path) -> list[str]:
    cand_dir = d / "candidates"
    if not cand_dir.is_dir():
        raise TaskFolderError(f"{cand_dir}: missing (candidates/1.py ... candidates/K.py)")
    names = sorted(p.name for p in cand_dir.iterdir())
    k = len(names)
    want = [f"{j}.py" for j in range(1, k + 1)]
    if not 2 <= k <= MAX_CANDIDATES or sorted(names, key=lambda s: (len(s), s)) != want:
        raise TaskFolderError(
            f"{cand_dir}: must hold 1.py ... K.py with 2 <= K <= {MAX_CANDIDATES} and nothing else; found "
            f"{names[:12]}"
        )
    return [_module(cand_dir / f"{j}.py", f"candidate {j}, a whole module") for j in range(1, k + 1)]


def _module(path: Path, what: str) -> str:
    text = read_file(path, MAX_MODULE_BYTES, what)
    try:
        compile(text, str(path), "exec")
    except (SyntaxError, ValueError) as err:
        raise TaskFolderError(f"{path}: not a Python module ({str(err)[:120]})") from None
    except (RecursionError, MemoryError):
        raise TaskFolderError(f"{path}: not a Python module (it nests too deep to compile)") from None
    return text


def _load_task(d: Path, task_id: int) -> CodeTask:
    meta_path = d / "task.json"
    meta = _meta(meta_path)
    calls = _calls(meta_path, meta)
    expect = _expectations(meta_path, meta, len(calls))
    split = meta.get("split")
    if split not in ("train", "heldout"):
        raise TaskFolderError(f'{meta_path}: \'split\' must be "train" or "heldout"; got {str(split)[:40]!r}')
    module = read_file(d / f"{MODULE}.py", MAX_MODULE_BYTES, "the module as shipped, with its bug")
    candidates = _candidates(d)
    k = len(candidates)
    correct = meta.get("correct", [])
    if not isinstance(correct, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= k for c in correct
    ):
        raise TaskFolderError(f"{meta_path}: 'correct' must list candidate numbers between 1 and {k}")
    kinds = tuple("correct" if j in correct else "unknown" for j in range(1, k + 1))
    return CodeTask(task_id, "task", module, tuple(calls), tuple(expect), tuple(candidates), kinds, split)
