"""Code-fixing tasks: a small Python module with one bug, its test calls with expected values, and K candidate
patches (each a whole replacement of the module), of which exactly one passes.

Generated tasks come from :data:`FAMILIES`: each family is a function with a correct body, the buggy body the
task ships, wrong fixes, and test calls whose inputs are built in the sandbox at a size drawn log-uniformly per
task, so a test run costs from a few milliseconds to a few tenths of a second of real computation and file I/O
(the tool-time distribution is long-tailed by itself). Wrong candidates fail the way real code fails: a wrong
value, an exception, an infinite loop, a memory blow-up, a crash of the interpreter, a fork storm, a write
outside the folder, a socket. Expected values are computed here by running the correct module in this process
(our own code), and never enter a sandbox.

A user's tasks come from a folder (:mod:`lrl.envs.codefix.folder`, format in docs/sandbox.md).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

K = 4  # candidates per generated task
MAX_CANDIDATES = 8  # the most a task may have (the policy's vocabulary spells 1..MAX_CANDIDATES)
SPLIT_SEED = 9001
N_TRAIN, N_HELDOUT = 40, 20
MODULE = "solution"
MAX_CALLS = 32  # test calls a task may have (the observation spells the counts)
AGENT_OBS = ("failed", "error", "timeout")  # the verdicts of a candidate that does not pass


@dataclass(frozen=True)
class CodeTask:
    """One task: the buggy module, the test calls, what each must give, and the candidate modules."""

    task_id: int
    family: str
    module: str  # the buggy source, as shipped (candidate sources replace it)
    calls: tuple[str, ...]
    expect: tuple  # per call: {"value": v} or {"raises": "Name"}; stays outside the sandbox
    candidates: tuple[str, ...]  # K module sources
    kinds: tuple[str, ...] = ()  # what each candidate is (documentation and tests; never shown to the policy)
    split: str = "train"
    extra: dict = field(default_factory=dict, hash=False, compare=False)  # files beside the module

    @property
    def n(self) -> int:
        return len(self.candidates)

    @property
    def prompt(self) -> str:
        return f"fix : {self.family} . candidates {' '.join(str(k) for k in range(1, self.n + 1))} ."

    def files(self, k: int) -> dict[str, str]:
        """The sandbox's files when candidate `k` (1-based) is applied."""
        return {**self.extra, f"{MODULE}.py": self.candidates[k - 1]}

    def passing(self) -> list[int]:
        return [k for k, kind in enumerate(self.kinds, 1) if kind == "correct"]


# -- the families ----------------------------------------------------------------------------------------
# each: name, signature, correct body, buggy body, wrong fixes, calls(size) with "{n}" for the work size.
FAMILIES = {
    "squares": dict(
        head="def total(n):",
        correct="    return sum(i * i for i in range(n))",
        bug="    return sum(i * i for i in range(1, n - 1))",
        wrong=["    return sum(i * 2 for i in range(n))", "    return sum(i * i for i in range(n + 1))"],
        calls=["total(0)", "total(5)", "total({n})"],
    ),
    "primes": dict(
        head="def count_primes(n):",
        correct="    sieve = bytearray([1]) * max(n, 2)\n    sieve[0] = sieve[1] = 0\n"
        "    for p in range(2, int(n ** 0.5) + 1):\n        if sieve[p]:\n"
        "            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))\n    return sum(sieve[:n])",
        bug="    sieve = bytearray([1]) * max(n, 2)\n    sieve[0] = sieve[1] = 0\n"
        "    for p in range(2, int(n ** 0.5)):\n        if sieve[p]:\n"
        "            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))\n    return sum(sieve[:n])",
        wrong=["    return sum(1 for i in range(2, n) if i % 2)", "    return n // 2"],
        calls=["count_primes(10)", "count_primes(100)", "count_primes({n} * 8)"],
    ),
    "words": dict(
        head="def top_words(n):",
        correct="    import collections\n    with open('words.txt', 'w') as f:\n"
        "        f.write(' '.join('w%d' % (i * i % 97) for i in range(n)))\n"
        "    with open('words.txt') as f:\n        counts = collections.Counter(f.read().split())\n"
        "    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]",
        bug="    import collections\n    with open('words.txt', 'w') as f:\n"
        "        f.write(' '.join('w%d' % (i * i % 97) for i in range(n)))\n"
        "    with open('words.txt') as f:\n        counts = collections.Counter(f.read().split())\n"
        "    return sorted(counts.items())[:3]",
        wrong=[
            "    with open('words.txt', 'w') as f:\n        f.write('w0')\n    return [['w0', n]]",
            "    import collections\n    counts = collections.Counter('w%d' % (i % 97) for i in range(n))\n"
            "    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]",
        ],
        calls=["top_words(1)", "top_words(50)", "top_words({n})"],
    ),
    "maxes": dict(
        head="def running_max(n):",
        correct="    xs = [(i * 7919) % 1009 for i in range(n)]\n    out, best = [], None\n    for x in xs:\n"
        "        best = x if best is None or x > best else best\n        out.append(best)\n"
        "    return [len(out), sum(out)]",
        bug="    xs = [(i * 7919) % 1009 for i in range(n)]\n    out, best = [], None\n    for x in xs:\n"
        "        best = x if best is None or x < best else best\n        out.append(best)\n"
        "    return [len(out), sum(out)]",
        wrong=["    xs = [(i * 7919) % 1009 for i in range(n)]\n    return [len(xs), sum(xs)]"],
        calls=["running_max(1)", "running_max(10)", "running_max({n})"],
    ),
    "checksum": dict(
        head="def checksum(n):",
        correct="    data = bytes((i * 31 + 7) % 251 for i in range(n))\n    with open('blob.bin', 'wb') as f:\n"
        "        f.write(data)\n    a, b = 1, 0\n    with open('blob.bin', 'rb') as f:\n"
        "        for byte in f.read():\n            a = (a + byte) % 65521\n            b = (b + a) % 65521\n"
        "    return b * 65536 + a",
        bug="    data = bytes((i * 31 + 7) % 251 for i in range(n))\n    with open('blob.bin', 'wb') as f:\n"
        "        f.write(data)\n    a, b = 0, 0\n    with open('blob.bin', 'rb') as f:\n"
        "        for byte in f.read():\n            a = (a + byte) % 65521\n            b = (b + a) % 65521\n"
        "    return b * 65536 + a",
        wrong=["    return n * 65536 + 1", "    data = bytes(n)\n    return sum(data) + 1"],
        calls=["checksum(0)", "checksum(3)", "checksum({n})"],
    ),
    "fib": dict(
        head="def fib(n):",
        correct="    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % 1000000007\n    return a",
        bug="    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, (a + b) % 1000000007\n    return a",
        wrong=[
            "    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, (a + b) % 1000000007\n    return a"
        ],
        calls=["fib(0)", "fib(10)", "fib({n})"],
    ),
    "dedupe": dict(
        head="def dedupe(n):",
        correct="    seen, out = set(), []\n    for i in range(n):\n        x = (i * i) % 1013\n"
        "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n"
        "    return [len(out), out[:5]]",
        bug="    out = sorted(set((i * i) % 1013 for i in range(n)))\n    return [len(out), out[:5]]",
        wrong=["    out = [(i * i) % 1013 for i in range(n)]\n    return [len(out), out[:5]]"],
        calls=["dedupe(0)", "dedupe(7)", "dedupe({n})"],
    ),
    "sortfile": dict(
        head="def sort_lines(n):",
        correct="    import os\n    os.makedirs('data', exist_ok=True)\n    with open('data/in.txt', 'w') as f:\n"
        "        f.write('\\n'.join(str((i * 7907) % 10007) for i in range(n)))\n"
        "    with open('data/in.txt') as f:\n        xs = sorted(int(x) for x in f.read().split())\n"
        "    return [len(xs), xs[:3], xs[-3:]]",
        bug="    import os\n    os.makedirs('data', exist_ok=True)\n    with open('data/in.txt', 'w') as f:\n"
        "        f.write('\\n'.join(str((i * 7907) % 10007) for i in range(n)))\n"
        "    with open('data/in.txt') as f:\n        xs = sorted(f.read().split())\n"
        "    return [len(xs), xs[:3], xs[-3:]]",
        wrong=["    xs = list(range(n))\n    return [len(xs), xs[:3], xs[-3:]]"],
        calls=["sort_lines(1)", "sort_lines(4)", "sort_lines({n})"],
    ),
}

# how a wrong candidate fails, with its share among generated wrong candidates (module-level code or body)
FAILURES = {
    "wrong": 0.44,  # a wrong fix: a wrong value
    "bug": 0.22,  # the module as shipped
    "raises": 0.14,  # an exception in the function
    "crash": 0.06,  # the interpreter aborts or segfaults
    "memory": 0.06,  # a memory blow-up
    "hang": 0.02,  # an infinite loop (until the timeout)
    "fork": 0.02,  # a fork storm
    "outside": 0.02,  # writes outside its folder, then answers like the bug
    "socket": 0.02,  # opens a socket, then answers like the bug
}

BODIES = {  # failures in the function's body; the other kinds are module-level code before the shipped bug
    "raises": "    raise RuntimeError('not implemented for this input')",
    "memory": "    big = []\n    while True:\n        big.append(bytearray(64 << 20))",
    "hang": "    while True:\n        n += 1",
}


def _module(head: str, body: str, prefix: str = "") -> str:
    return f'"""The module under test."""\n{prefix}\n\n{head}\n{body}\n'


def _failing_source(kind: str, spec: dict, rng: random.Random) -> str:
    if kind == "wrong":
        return _module(spec["head"], rng.choice(spec["wrong"]))
    if kind == "bug":
        return _module(spec["head"], spec["bug"])
    if kind in BODIES:
        return _module(spec["head"], BODIES[kind])
    if kind == "crash":
        prefix = rng.choice(["import os\nos.abort()", "import ctypes\nctypes.string_at(0)"])
        return _module(spec["head"], spec["bug"], prefix)
    if kind == "fork":
        prefix = (
            "import os\nfor _ in range(5):\n    try:\n        os.fork()\n    except OSError:\n        break"
        )
        return _module(spec["head"], spec["bug"], prefix)
    if kind == "outside":
        prefix = "try:\n    open('../lrl-was-here', 'w').write('x')\nexcept OSError:\n    pass"
        return _module(spec["head"], spec["bug"], prefix)
    if kind == "socket":
        prefix = (
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=0.2)\n"
            "except OSError:\n    pass"
        )
        return _module(spec["head"], spec["bug"], prefix)
    raise ValueError(kind)


def expected_values(source: str, calls) -> tuple:
    """Run `calls` against `source` here (our own correct module) -> each call's expectation."""
    import os
    import tempfile

    scope: dict = {}
    out = []
    with tempfile.TemporaryDirectory(prefix="lrl-codefix-ref-") as folder:
        cwd = os.getcwd()
        os.chdir(folder)
        try:
            exec(compile(source, "solution.py", "exec"), scope)  # noqa: S102 (the reference is our own code)
            for call in calls:
                try:
                    value = eval(call, scope)  # noqa: S307
                    out.append({"value": json.loads(json.dumps(value))})
                except Exception as err:  # noqa: BLE001
                    out.append({"raises": type(err).__name__})
        finally:
            os.chdir(cwd)
    return tuple(out)


def random_code_task(rng: random.Random, task_id: int = -1, split: str = "train") -> CodeTask:
    """One generated task: a family, a work size (log-uniform), K candidates with one correct."""
    family = rng.choice(sorted(FAMILIES))
    spec = FAMILIES[family]
    n = int(math.exp(rng.uniform(math.log(300), math.log(1_000_000))))
    calls = tuple(c.format(n=n) for c in spec["calls"])
    correct = _module(spec["head"], spec["correct"])
    kinds = ["correct"] + rng.choices(list(FAILURES), weights=list(FAILURES.values()), k=K - 1)
    rng.shuffle(kinds)
    candidates = tuple(correct if kind == "correct" else _failing_source(kind, spec, rng) for kind in kinds)
    return CodeTask(
        task_id, family, _module(spec["head"], spec["bug"]), calls, (), candidates, tuple(kinds), split
    )


def _with_expectations(task: CodeTask, rng: random.Random, cache: dict) -> CodeTask:
    """The task with its expected values; a wrong fix or the shipped bug that happens to give the right values
    on these calls is replaced by another wrong fix (a task has exactly one passing candidate)."""
    correct = task.candidates[task.kinds.index("correct")]
    expect = _values(correct, task.calls, cache)
    spec = FAMILIES[task.family]
    candidates, kinds = list(task.candidates), list(task.kinds)
    for j, kind in enumerate(kinds):
        while kind in ("wrong", "bug") and _values(candidates[j], task.calls, cache) == expect:
            kind = kinds[j] = "wrong" if kind == "bug" else "raises"
            candidates[j] = _failing_source(kind, spec, rng)
    return CodeTask(
        task.task_id, task.family, task.module, task.calls, expect,
        tuple(candidates), tuple(kinds), task.split, task.extra,
    )  # fmt: skip


def _values(source: str, calls, cache: dict) -> tuple:
    import hashlib

    key = hashlib.sha256(json.dumps([source, list(calls)]).encode()).hexdigest()[:20]
    if key not in cache:
        cache[key] = list(expected_values(source, calls))
    return tuple(cache[key])


def _cache_path() -> Path:
    from lrl.warmstart import cache_dir

    return cache_dir() / "codefix-values.json"


SHIPPED_VALUES = Path(__file__).parent / "values.json"  # the generated tasks' values, computed once


_GENERATED: dict[str, list[CodeTask]] = {}


def make_code_tasks(split: str = "all") -> list[CodeTask]:
    """The generated train (40) and held-out (20) tasks, deterministic; `all` is both."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all'; got {split!r}")
    if not _GENERATED:
        rng = random.Random(SPLIT_SEED)
        cache: dict = {}
        for path in (SHIPPED_VALUES, _cache_path()):
            try:
                cache.update(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass
        known = len(cache)
        tasks = []
        for i in range(N_TRAIN + N_HELDOUT):
            task = random_code_task(rng, i, "train" if i < N_TRAIN else "heldout")
            tasks.append(_with_expectations(task, rng, cache))
        if len(cache) > known:  # computed here: kept for the next run (atomically)
            _save_values(cache)
        _GENERATED["train"], _GENERATED["heldout"] = tasks[:N_TRAIN], tasks[N_TRAIN:]
        _GENERATED["all"] = tasks
    return list(_GENERATED[split])


def _save_values(cache: dict) -> None:
    import os
    import tempfile

    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".values-")
        with os.fdopen(fd, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: computed again next time


def vocabulary_words() -> list[str]:
    words = {"fix", ":", ".", "candidates", "test", "submit", "of", "task", *FAMILIES}
    words.update(["passed", "failed", "error", "timeout"])
    words.update(str(i) for i in range(0, 33))
    return sorted(words)
