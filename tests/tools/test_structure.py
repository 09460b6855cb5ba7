"""The structure lrl promises: no import circle anywhere in the library or its lab (an import by name, through
importlib, counted as one), a core that never imports the lab (the simulator, the experiments, the tools: lrl_lab, a
distribution of its own), no module over 450 lines and no function over 120, a trainer that never reaches into where
its batches come from, a worker process that imports nothing before its parent-death signal, and staleness policies
that the simulator and the config can import without the pipeline's weight."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# folder -> import name: lrl/samplers and lrl/callbacks are links to samplers/ and callbacks/; lrl_lab is the lab
PACKAGES = {"lrl": "lrl", "samplers": "lrl.samplers", "callbacks": "lrl.callbacks", "lab/lrl_lab": "lrl_lab"}
LAB = ("lrl_lab",)  # pip install ./lab
# the library's modules that name the lab: the lab's commands under their former names, each forwarding to the new
# one (lrl/former_names.py), for one release
FORMER_NAMES = {"lrl.sim": "lrl_lab.sim", "lrl.simulate": "lrl_lab.sim", "lrl.mismatch": "lrl_lab.mismatch"}
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 120


def imported_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_pipeline_does_not_import_the_run_builder():
    modules = imported_by(
        "import lrl.pipeline, lrl.pipeline.source, lrl.pipeline.worker, lrl.pipeline.schedule, lrl.sources"
    )
    assert "lrl.run" not in modules
    assert "lrl.pipeline.source" in modules  # the check looked at what it meant to


def test_the_spawn_entry_imports_nothing_heavy():
    modules = imported_by("import lrl.pipeline.backends.spawn")
    assert not {"torch", "transformers", "lightning", "numpy"} & modules, sorted(modules)


def test_the_staleness_policies_import_nothing_heavy():
    modules = imported_by("import lrl.pipeline.policies")
    assert "lrl.pipeline.policies" in modules
    assert not {"torch", "numpy", "lrl.pipeline.schedule", "lrl.pipeline.source", "lrl.config"} & modules


def test_the_controller_asks_its_schedule_and_policy_not_what_they_are():
    for path in ("lrl/pipeline/source.py", "lrl/pipeline/schedule.py", "lrl/pipeline/worker/free.py"):
        text = (ROOT / path).read_text()
        assert "hasattr(" not in text and "stale_policy ==" not in text, path


def test_the_module_never_touches_the_pipeline_or_the_stream():
    text = (ROOT / "lrl" / "module.py").read_text()
    for needle in ("stream.pipeline", "datamodule.stream", "lrl.pipeline", "AsyncSource", "datamodule."):
        assert needle not in text, needle


def test_the_datamodule_only_forwards_to_its_source():
    text = (ROOT / "lrl" / "data.py").read_text()
    assert "lrl.pipeline" not in text and "sampler" not in text


# -- sizes and the import graph, read from the source ----------------------------------------------------------
def sources() -> dict[str, Path]:
    """Every module of the library and the lab by its import name (samplers/x.py is lrl.samplers.x, as
    installed)."""
    found = {}
    for top, package in PACKAGES.items():
        for path in sorted((ROOT / top).rglob("*.py")):  # rglob does not follow lrl/samplers, the link
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join([package, *parts])] = path
    return found


def named(tree: ast.AST, known) -> set[str]:
    """The modules a module that imports by name (``importlib.import_module``, ``import_module``, ``runpy``, as
    :mod:`lrl.plugins` and the lazy ``__getattr__`` of a package do) may import: every string in it, outside its
    docstrings, that is a module's whole name; a module that imports by no name has none."""
    calls = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    if not calls & {"import_module", "__import__", "run_module", "forward"}:
        return set()
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        and node.value in known
    }


def imports(tree: ast.AST, name: str, is_package: bool, known) -> set[str]:
    """The library modules `tree` imports, anywhere in it (in a function, under TYPE_CHECKING too, or by name
    through importlib: :func:`named`)."""
    package = name if is_package else name.rpartition(".")[0]
    out = named(tree, known) - {name}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            target = "lrl." + target if target.split(".")[0] in ("samplers", "callbacks") else target
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = sources()
    return {
        name: imports(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        for name, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: its strongly connected parts of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def in_lab(name: str) -> bool:
    return any(name == lab or name.startswith(lab + ".") for lab in LAB)


def test_the_library_has_no_import_circle():
    graph = import_graph()
    assert not circles(graph), (
        f"modules that import each other (directly or around a circle): {circles(graph)}"
    )
    assert {"lrl.config", "lrl.samplers.vllm", "lrl.callbacks.health"} <= set(
        graph
    )  # it read what it meant to
    assert "lrl.registry" in graph["lrl.config_rules"] and "lrl.registry" in graph["lrl.samplers"]


def test_the_core_never_imports_the_lab():
    graph = import_graph()
    arrows = sorted((a, b) for a, targets in graph.items() if not in_lab(a) for b in targets if in_lab(b))
    former = [(old, new) for old, new in FORMER_NAMES.items()]
    assert sorted(former) == [arrow for arrow in arrows if arrow[0] in FORMER_NAMES]  # the test sees them
    arrows = [arrow for arrow in arrows if arrow not in former]
    assert not arrows, f"the core reaches into the lab (pip install ./lab would be needed to run it): {arrows}"
    assert any(
        in_lab(a) and not in_lab(b) for a, targets in graph.items() for b in targets
    )  # the lab uses the core
    assert {"lrl_lab.sim.cli", "lrl_lab.experiments.designs", "lrl_lab.tools.mismatch"} <= set(graph)


def test_a_former_name_only_forwards_to_the_lab():
    """``python -m lrl.sim`` and the other former names: the lab's command when the lab is installed, one line
    naming the install and the new name when it is not; nothing of the lab when imported."""
    from lrl.former_names import INSTALL, forward

    for old, new in FORMER_NAMES.items():
        path = ROOT / (old.replace(".", "/") + ".py")
        text = path.read_text()
        assert len(text.splitlines()) <= 10 and f'forward("{old}", "{new}")' in text, path
        assert 'if __name__ == "__main__":' in text.split("forward(")[0]
    assert imported_by("import lrl.sim, lrl.simulate, lrl.mismatch").isdisjoint({"lrl_lab", "lrl_lab.sim"})
    try:
        forward("lrl.sim", "no_lab_here.sim")
    except SystemExit as stop:
        assert str(stop) == f"python -m lrl.sim is now python -m no_lab_here.sim, in the lab: {INSTALL} (from a checkout of lrl)"
    else:
        raise AssertionError("a former name ran without the lab")


def test_the_graph_reader_finds_circles_and_imports():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    code = "import lrl.x\nfrom . import y\ndef f():\n    from samplers.base import z\n"
    known = {"lrl.x", "lrl.pkg.y", "lrl.samplers.base", "lrl.pkg"}
    assert imports(ast.parse(code), "lrl.pkg", True, known) == {"lrl.x", "lrl.pkg.y", "lrl.samplers.base"}
    # by name, through importlib: the strings that are a module's whole name, not the docstrings
    code = '"""lrl.pkg.y"""\nfrom importlib import import_module\nLAZY = {"f": "lrl.x", "g": "x"}\nimport_module(LAZY["f"])\n'
    assert imports(ast.parse(code), "lrl.pkg", True, known) == {"lrl.x"}
    assert imports(ast.parse('NAMES = ("lrl.x",)\n'), "lrl.pkg", True, known) == set()  # no import by name


def test_no_module_or_function_is_too_long():
    """Past 450 lines a module, or past 120 a function, holds more than one thing a reader keeps in mind."""
    long_modules, long_functions = [], []
    for name, path in sources().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append((name, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append((name, node.name, length))
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_samplers_and_callbacks_are_imported_under_lrl():
    """They are installed as lrl.samplers and lrl.callbacks; a top-level `samplers` exists only in a checkout, and
    importing both would register every built-in sampler twice."""
    files = [
        p
        for top in ("lrl", "samplers", "callbacks", "tests", "bench", "examples")
        for p in (ROOT / top).rglob("*.py")
    ]
    files.append(ROOT / "train.py")
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [
                (str(path.relative_to(ROOT)), n)
                for n in names
                if n.split(".")[0] in ("samplers", "callbacks")
            ]
    assert not found, f"import lrl.samplers / lrl.callbacks instead: {found}"
    assert (ROOT / "lrl" / "samplers").resolve() == (ROOT / "samplers").resolve()  # one home for the code
    assert (ROOT / "lrl" / "callbacks").resolve() == (ROOT / "callbacks").resolve()
