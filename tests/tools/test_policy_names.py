"""No staleness policy is chosen by its name outside its class and the registry: the pipeline's parts call the
policy's hooks (lrl.pipeline.policies), and a new policy is one class, not a branch in four files.

The test reads every Python file of the library and the programs beside it (not the tests, which name the
policies they test) and finds each comparison with a policy's name as a string literal: ``==``, ``!=``, ``in``,
``not in`` (also against a tuple, list or set of names) and ``match`` cases. No file is exempt but the policies'
own module and the registry. (``none``, the throttle alone, is left out: the word is every option's "off".) A name
read off a policy's class (``Ordered.name``), the built-in names' tuple (``STALE_POLICIES``) or the default's
(``DEFAULT_POLICY``) is a name too: the simulator once chose its policies that way, and the lab asked whether a run
had the default (it asks ``is_default``)."""

from __future__ import annotations

import ast
from pathlib import Path

from lrl.pipeline import policies
from lrl.pipeline.policies import STALE_POLICIES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("lrl", "samplers", "callbacks", "lab", "bench", "examples", "train.py")
HOME = {"lrl/pipeline/policies.py", "lrl/registry.py"}  # the classes, and the registry
CMP = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
# the policies' classes, by the names they are imported as
CLASSES = {
    k for k, v in vars(policies).items() if isinstance(v, type) and getattr(v, "name", None) in STALE_POLICIES
}


def names_in(node: ast.AST) -> list[str]:
    """The policy names `node` is: a string literal, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in STALE_POLICIES else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in names_in(e)]
    if isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Name):
        return [node.value.id + ".name"] if node.value.id in CLASSES else []
    if isinstance(node, ast.Name) and node.id in ("STALE_POLICIES", "DEFAULT_POLICY"):
        return [node.id]
    if isinstance(node, ast.Attribute) and node.attr == "DEFAULT_POLICY":
        return ["DEFAULT_POLICY"]
    return []


def comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every comparison with a policy's name in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, CMP) for op in node.ops):
            for side in (node.left, *node.comparators):
                found += [(node.lineno, n) for n in names_in(side)]
        elif isinstance(node, ast.match_case):
            for sub in ast.walk(node.pattern):
                if isinstance(sub, ast.MatchValue):
                    found += [(sub.lineno, n) for n in names_in(sub.value)]
    return found


def scanned_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_no_policy_name_is_compared_outside_its_class_and_the_registry():
    found: dict[str, list[tuple[int, str]]] = {}
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in HOME:
            continue
        hits = comparisons(ast.parse(path.read_text(), filename=rel))
        if hits:
            found[rel] = hits
    assert not found, f"a staleness policy chosen by name (call its hooks, or ask the registry): {found}"


def test_the_check_finds_what_it_looks_for():
    code = """
if policy == "drop": pass
if "mask" != cfg.stale_policy: pass
if policy in ("abort", "cut"): pass
if p not in {"oldest-first"}: pass
match policy:
    case "ordered": pass
if policy == "sampler" or x == "drops": pass
policy = "drop"
if name in (Ordered.name, OldestFirst.name): pass
if name not in STALE_POLICIES: pass
if sampler.name == x: pass
if args.stale_policy != DEFAULT_POLICY: pass
if is_default(args.stale_policy): pass
"""
    assert sorted(n for _, n in comparisons(ast.parse(code))) == [
        "DEFAULT_POLICY",
        "OldestFirst.name",
        "Ordered.name",
        "STALE_POLICIES",
        "abort",
        "cut",
        "drop",
        "mask",
        "oldest-first",
        "ordered",
    ]
    assert {p.relative_to(ROOT).as_posix() for p in scanned_files()} >= {
        "lrl/pipeline/source.py",
        "lab/lrl_lab/experiments/designs.py",
        "train.py",
    }
