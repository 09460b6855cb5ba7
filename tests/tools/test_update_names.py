"""No loss, aggregation or proximal policy is chosen by its name outside its registry: the step and the rules read
what an entry declares (lrl.losses.LossTraits, lrl.proximal.ProximalTraits, lrl.aggregations.Aggregation), so a new
loss is one registered function, not a branch in three files.

The test reads every Python file of the library and the programs beside it (not the tests, which name the entries
they test) and finds each comparison (``==``, ``!=``, ``in``, ``not in``, ``match`` cases) that reads the config's
choice (``.loss``, ``.proximal``, ``.aggregation``, or the same keys of a dict)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("lrl", "samplers", "callbacks", "lab", "bench", "examples", "train.py")
HOME = {"lrl/losses.py", "lrl/proximal.py", "lrl/aggregations.py", "lrl/registry.py"}
CHOICES = ("loss", "proximal", "aggregation")
CMP = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def reads_choice(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in CHOICES) or (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in CHOICES
    )


def comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, CMP) for op in node.ops):
            sides = [node.left, *node.comparators]
            if any(reads_choice(side) for side in sides):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and reads_choice(node.subject):
            found.append((node.lineno, ast.unparse(node.subject)))
    return found


def test_no_update_part_is_chosen_by_its_name_outside_its_registry():
    files = [p for entry in SCANNED for p in ([ROOT / entry] if entry.endswith(".py") else (ROOT / entry).rglob("*.py"))]
    found = []
    for path in files:
        where = path.relative_to(ROOT).as_posix()
        if where in HOME or "/tests/" in where:
            continue
        found += [f"{where}:{line}: {text}" for line, text in comparisons(ast.parse(path.read_text()))]
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    tree = ast.parse('if opts.proximal == "recompute": pass\nok = cfg["loss"] in ("pg",)\nx = y == 1\n')
    assert [line for line, _ in comparisons(tree)] == [1, 2]
