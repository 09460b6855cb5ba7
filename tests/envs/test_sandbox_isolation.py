"""codefix's sandbox against candidates that buy their verdict by reading the machine or by breaking the harness:
at the namespaces level a run sees a filesystem of its own (no task folder, no package data, no other task);
what a candidate writes on its result channel is judged as the candidate's (error, never the worker's end); a
tree of folders it leaves is removed without recursion; every process it starts is gone when the run is."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from lrl.envs.codefix import make_code_tasks
from lrl.envs.codefix import tasks as T
from lrl.envs.codefix.pool import EnvPool
from lrl.envs.codefix.sandbox import harness, levels
from lrl.envs.codefix.sandbox.harness import Limits

pytestmark = pytest.mark.xdist_group("codefix")  # the sandbox tests run one after another, on one worker

GOOD = "def double(x):\n    return 2 * x\n"
WRONG = "def double(x):\n    return x + 2\n"
CALLS = ["double(2)", "double(21)"]
EXPECT = [{"value": 4}, {"value": 42}]


def machine_has_namespaces() -> bool:
    from test_codefix import machine_has_namespaces as probe

    return probe()


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(1, "auto", Limits(wall_seconds=2.0, cpu_seconds=2), retries=0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def rl_pool():
    p = EnvPool(1, "rlimits", Limits(wall_seconds=2.0, cpu_seconds=2), retries=0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def readable_tasks():
    """A task folder anyone may read, as users' folders usually are: task a (train) and task b (held out)."""
    top = Path(tempfile.mkdtemp(prefix="readable-", dir=os.environ["LRL_TEST_TMPDIR"]))
    os.chmod(top, 0o755)
    for name, split in (("a", "train"), ("b", "heldout")):
        d = top / name
        (d / "candidates").mkdir(parents=True)
        (d / "task.json").write_text(json.dumps({"calls": CALLS, "expect": EXPECT, "split": split}))
        (d / "solution.py").write_text(WRONG)
        (d / "candidates" / "1.py").write_text(WRONG)
        (d / "candidates" / "2.py").write_text(GOOD)
    for path in [top, *top.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return top


ANSWERS = "_i = [0]\ndef _answer(*args):\n    _i[0] += 1\n    return _values[_i[0] - 1]\n"


def readers(tasks: Path) -> dict[str, tuple[str, list[str], list, Path]]:
    """name -> (a wrong candidate that reads the answers from the machine, its calls, their expectations, what
    it reads). None of them computes anything: each is right only if the file it reads is there."""
    values = T.SHIPPED_VALUES
    task = make_code_tasks("train")[0]
    correct = task.candidates[task.kinds.index("correct")]
    key = hashlib.sha256(json.dumps([correct, list(task.calls)]).encode()).hexdigest()[:20]
    assert key in json.loads(values.read_text())  # the generated task's values ship under this key
    function = task.calls[0].split("(")[0]
    own = tasks / "a" / "task.json"
    other = tasks / "b" / "candidates" / "2.py"
    return {
        "reads its task's expectations": (
            f"import json\n_values = [e['value'] for e in json.load(open({str(own)!r}))['expect']]\n"
            + ANSWERS + "double = _answer\n",
            CALLS, EXPECT, own,
        ),
        "reads the package's values.json": (
            f"import json\n_values = [e['value'] for e in json.load(open({str(values)!r}))[{key!r}]]\n"
            + ANSWERS + f"{function} = _answer\n",
            list(task.calls), list(task.expect), values,
        ),
        "imports another task's candidate": (
            "import importlib.util\n"
            f"_spec = importlib.util.spec_from_file_location('other', {str(other)!r})\n"
            "_m = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_m)\ndouble = _m.double\n",
            CALLS, EXPECT, other,
        ),
    }  # fmt: skip


def test_at_the_namespaces_level_a_candidate_that_reads_the_answers_is_never_passed(
    pool, rl_pool, readable_tasks
):
    if pool.level != "namespaces":
        assert not machine_has_namespaces(), (
            f"namespaces work here, yet the pool chose {pool.level}: {pool.notes}"
        )
        pytest.skip(f"the namespaces level does not work here ({pool.notes})")
    for name, (source, calls, expect, target) in readers(readable_tasks).items():
        verdict, _, _ = pool.run({"solution.py": source}, "solution", calls, expect, name="reader")
        assert verdict.kind == "error", (name, verdict)  # it found nothing to read: its import failed
        # the same candidate where the file is readable (rlimits: the host's filesystem) passes: the attack is real
        as_root = os.geteuid() == 0 and rl_pool.uid_base is None
        if as_root or levels.accessible_to_others(str(target)):
            control, _, _ = rl_pool.run({"solution.py": source}, "solution", calls, expect, name="reader")
            assert control.kind == "passed", (name, control)
    control, _, _ = pool.run({"solution.py": GOOD}, "solution", CALLS, EXPECT)
    assert control.kind == "passed", control


def test_the_run_sees_only_the_interpreter_its_folder_and_its_own_processes(pool):
    if pool.level != "namespaces":
        pytest.skip(f"the namespaces level does not work here ({pool.notes})")
    look = (
        "import os, sys\n"
        "def listing():\n"
        "    return sorted(os.listdir('/'))\n"
        "def pids():\n"
        "    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "def site():\n"
        "    return [p for p in sys.path if os.path.isdir(p) and os.listdir(p) and 'site-packages' in p]\n"
        "def home():\n"
        "    return os.path.exists(os.path.expanduser('~root')) and os.listdir(os.path.expanduser('~root'))\n"
        "def write_root():\n"
        "    try:\n        open('/x', 'w')\n        return 'written'\n    except OSError:\n        return 'refused'\n"
    )
    calls = ["listing()", "pids()", "site()", "write_root()", "len(os.listdir('.')) > 0"]
    verdict, _, _ = pool.run({"solution.py": look}, "solution", calls, [{"value": None}] * 5, name="look")
    assert verdict.kind == "failed", verdict  # every call reported (the values are not what is expected)
    root = levels.make_root()
    try:
        box = harness.Sandbox(root, "namespaces", pool.limits, pool.uid_of(7))
        got = harness.run(box, {"solution.py": look}, "solution", calls, [{"value": None}] * 5, values=True)
    finally:
        from lrl.reaper import remove

        remove([root])
    assert got.values is not None, got
    values = got.values
    top, pids, site, write_root, folder = values
    assert set(top) <= {"dev", "proc", *Path(os.path.realpath(sys.executable)).parts[1:2], "usr", "lib", "lib64",
                        "bin", *Path(pool.root).parts[1:2]}, top  # fmt: skip
    assert "work" not in top and "etc" not in top, top
    assert pids == [1, 2], pids  # the namespace's init and the run: no process of the host is visible
    assert site == [] and write_root == "refused" and folder is True


@pytest.mark.parametrize(
    "name, candidate, expect",
    [
        ("returns 10**400 where a float is expected", "def f():\n    return 10 ** 400\n", [{"value": 1.5}]),
        ("writes 100,000 '[' on its result channel", "import os\nos.write(3, b'[' * 100_000 + b'\\n')\n"
         "def f():\n    return 1.5\n", [{"value": 1.5}]),
        ("reports NaN", "import os\nos.write(3, b'{\"i\": 0, \"value\": NaN}\\n{\"done\": 1}\\n')\nos._exit(0)\n",
         [{"value": 1.5}]),
        ("reports a number of 100,000 digits", "import os\nos.write(3, b'{\"i\": 0, \"value\": ' + b'9' * 100_000 + "
         "b'}\\n{\"done\": 1}\\n')\nos._exit(0)\n", [{"value": 1.5}]),
        ("reports a value nested 5,000 deep", "import os\nos.write(3, b'{\"i\": 0, \"value\": ' + b'[' * 5000 + "
         "b']' * 5000 + b'}\\n{\"done\": 1}\\n')\nos._exit(0)\n", [{"value": []}]),
    ],
)  # fmt: skip
def test_a_result_the_harness_cannot_parse_or_compare_is_the_candidates_error_and_the_worker_lives(
    pool, name, candidate, expect
):
    worker = pool.workers[0].proc.pid
    verdict, _, _ = pool.run({"solution.py": candidate}, "solution", ["f()"], expect, name="parse")
    assert verdict.kind == "error", (name, verdict)
    assert pool.workers[0].proc.pid == worker and pool.stats["replaced"] == 0, (
        name
    )  # the same worker answered
    control, _, _ = pool.run({"solution.py": GOOD}, "solution", CALLS, EXPECT)
    assert control.kind == "passed", control


DEEP = (
    "import os\n"
    "for _ in range(2500):\n"  # deeper than the recursion limit, and its path longer than PATH_MAX
    "    os.mkdir('dir')\n"
    "    os.chdir('dir')\n"
    "open('leaf', 'w').write('x')\n"
    "os.chmod('.', 0o500)\n" + GOOD  # a folder its owner cannot write to
)


@pytest.mark.parametrize("level", ["auto", "rlimits"])
def test_a_deep_tree_of_folders_is_removed_and_nothing_is_left(level, tmp_path):
    pool = EnvPool(1, level, Limits(wall_seconds=5.0, cpu_seconds=5), retries=0)
    try:
        worker = pool.workers[0].proc.pid
        verdict, _, _ = pool.run({"solution.py": DEEP}, "solution", CALLS, EXPECT, name="deep")
        assert verdict.kind == "passed", verdict
        assert pool.workers[0].proc.pid == worker and pool.stats["replaced"] == 0
        left = [p.name for p in Path(pool.root, "w0").iterdir() if p.name.startswith("deep-")]
        assert left == [], left  # the run's folder went with the run
    finally:
        pool.close()
    assert not os.path.exists(pool.root)


def test_the_reaper_removes_a_deep_tree_without_recursion(tmp_path):
    from lrl.reaper import remove

    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(2500):
        os.mkdir("dir", dir_fd=fd)
        child = os.open("dir", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    remove([str(top)])
    assert not top.exists()


def _marked(mark: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                if "State:\tZ" not in Path(f"/proc/{pid}/status").read_text():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("level", ["auto", "rlimits"])
def test_a_detached_grandchild_is_gone_when_the_run_is(level):
    mark = f"lrl-detached-{os.getpid()}-{level}"
    detach = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.closerange(0, 64)\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', {mark!r}])\n"
        "    os._exit(0)\n"
        "os.wait()\n" + GOOD
    )
    # the wall limit is not what is tested: starting a second interpreter beside the run took over 2 s on a loaded
    # 2-core machine, and the run was a timeout; a run that passes ends when it is done, whatever the limit
    pool = EnvPool(1, level, Limits(wall_seconds=10.0, cpu_seconds=2), retries=0)
    try:
        verdict, _, _ = pool.run({"solution.py": detach}, "solution", CALLS, EXPECT, name="detach")
        assert verdict.kind == "passed", verdict
        assert _marked(mark) == [], "a process the candidate detached outlived its run"
    finally:
        pool.close()
        for pid in _marked(mark):
            os.kill(pid, 9)


PLAIN = "candidates can read what the machine lets other users read, expected values included"


def test_where_the_kernel_refuses_a_root_of_its_own_auto_falls_back_and_the_first_line_says_so(
    monkeypatch, readable_tasks
):
    if not machine_has_namespaces():
        pytest.skip("namespaces do not work here: the fallbacks are what every run gets (test_codefix)")
    from lrl.envs.codefix.sandbox.kernel import REFUSE

    monkeypatch.setenv(REFUSE, "root")  # the kernel refuses what a filesystem of its own needs
    fallback = EnvPool(1, "auto", Limits(wall_seconds=2.0, cpu_seconds=2), retries=0)
    try:
        assert fallback.level == "namespaces" and not fallback.own_root
        line = fallback.describe()
        assert PLAIN in line and "does not work here" in line, line
        assert "files outside its folder readable" in line, line  # what the probe found
        # which is what the line warns of: a reader of its task's expectations passes there
        source, calls, expect, _ = readers(readable_tasks)["reads its task's expectations"]
        assert fallback.run({"solution.py": source}, "solution", calls, expect)[0].kind == "passed"
    finally:
        fallback.close()
    monkeypatch.setenv(REFUSE, "root,namespaces")  # no namespaces at all
    bare = EnvPool(1, "auto", Limits(wall_seconds=2.0, cpu_seconds=2), retries=0)
    try:
        assert (
            bare.level == "rlimits" and "expected values included" in bare.describe()
        )  # as another user or root
        assert "namespaces" in "; ".join(bare.notes)
    finally:
        bare.close()
    monkeypatch.setenv(REFUSE, "root")
    with pytest.raises(OSError, match="namespaces with a filesystem of their own do not work here"):
        EnvPool(1, "namespaces", Limits(wall_seconds=2.0, cpu_seconds=2), retries=0)


def test_sandbox_namespaces_asked_by_name_stops_the_run_in_one_line_where_it_does_not_work(
    monkeypatch, tmp_path
):
    from helpers import FAST, one_clear_line, train

    from lrl.envs.codefix import _PROBED
    from lrl.envs.codefix.sandbox.kernel import REFUSE

    monkeypatch.setenv(REFUSE, "root")
    monkeypatch.setattr("lrl.envs.codefix._PROBED", {})
    out = train("--env", "codefix", "--sandbox", "namespaces", *FAST, "--log-dir", str(tmp_path / "r"))
    one_clear_line(out, 2, "sandbox: namespaces does not work here", "filesystem of their own")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "r").exists()  # stopped before the run started
    assert _PROBED == {}  # the process's cache was the test's own
