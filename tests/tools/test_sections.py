"""Parts read their section: a function of the library (``lrl/``, ``samplers/``, ``callbacks/``; the lab is a package of its own)
takes the section(s) of the configuration it uses (``UpdateOptions``, ``RolloutOptions``, ...) or the few values it
needs, so that its signature says what it depends on. Only entry points, the preflight, the checkpoint and the
configuration's own validation take the whole configuration, each named in :data:`WHOLE_CONFIG` with the reason.

Both figures are read from the source (``ast``), never by importing it:

- a function or method takes the whole configuration when one of its parameters is named ``cfg`` or ``config`` or
  is annotated with ``Config``;
- an option read is an attribute load ``X.<name>`` whose ``<name>`` is an option's flat name (:data:`lrl.sections.
  OPTIONS`). It is *flat* when ``X`` is a name or attribute spelled ``cfg`` or ``config`` (``cfg.lr``,
  ``self.cfg.lr``, ``pl_module.cfg.temperature``): the option looked up by its flat name on the whole
  configuration. It is *through a section* when ``X`` is a section of a name spelled so (``cfg.update.lr``,
  ``self.cfg.rollout.slots``), or is a name that the same module binds to a section: a parameter annotated with a
  section's class (``def f(update: UpdateOptions)``) or the target of an assignment from a section
  (``opts = self.cfg.update``, ``self.batch_options = cfg.batch``, ``s = opts``). Every other read
  (``getattr(cfg, name)``, a name bound to nothing the module shows, such as an unannotated parameter) is counted as
  neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

from lrl.sections import OPTIONS, SECTIONS

ROOT = Path(__file__).resolve().parents[2]
WHOLE = ("cfg", "config")
SECTION_CLASSES = {kind.__name__ for kind in SECTIONS.values()}
MOST_WHOLE_CONFIG = 20

# the functions that take the whole configuration, and why each must
WHOLE_CONFIG = {
    "lrl/config_rules.py:_registry_rules": "the config's own validation: every option scoped to a registry, and "
    "each chosen entry's check, given the sections that check names",
    "lrl/config_rules.py:_mode_rules": "the config's own validation: every option that belongs to a mode",
    "lrl/preflight.py:resolve": "the preflight: resolves the config's named models in place and runs each chosen "
    "entry's check_machine",
    "lrl/preflight.py:check_environment": "the preflight: the tokenizer, the context and the memory plan, which "
    "together read most sections",
    "lrl/preflight.py:check_model": "the preflight: each chosen entry's check_model, given the sections it names",
    "lrl/checkpoint.py:check_resume": "the checkpoint: compares every option a checkpoint recorded with this run's",
    "lrl/run.py:build_run": "the entry point that builds every part of a run, each from its sections",
    "lrl/run.py:plan_run": "the part of build_run that checks a run before its model loads (the preflight, the "
    "environment, the sampler, the memory plan), for a caller that checks many configs first",
    "lrl/module.py:OffPolicyModule.__init__": "the checkpoint: the trainer writes the run's whole configuration "
    "into each checkpoint, and the callbacks read it from the module",
    "lrl/pipeline/source.py:AsyncSource.__init__": "an entry point: a rollout worker process is set up with the "
    "whole configuration, from which it builds its environment and sampler",
    "lrl/registry.py:supply": "hands a registry entry's factory or check, or a cross-key rule, the sections and "
    "options its parameters name: the one place that picks pieces out of the whole config",
    "lrl/envs/__init__.py:make_env": "builds the environment a config names, its factory given what it names "
    "(through supply)",
    "samplers/__init__.py:make_sampler": "builds the sampler a config names, its factory given what it names "
    "(through supply)",
    "samplers/__init__.py:sampler_traits": "the traits of the sampler a config names, declared by its class from "
    "what it names (through supply)",
    "callbacks/__init__.py:build_callbacks": "builds the callbacks a config asks for, each factory given what it "
    "names (through supply)",
    "lrl/objective.py:Objective.__init__": "builds the update's parts a config names (loss, aggregation, proximal "
    "policy), each factory given what it names (through supply); the objective reads the update and weighting "
    "sections of the same config",
    "samplers/__init__.py:built.add.factory": "a sampler entry's factory: the entry's arguments function reads the "
    "sections it names (sampling, policy, seed), and the factory hands it the config it was given",
    "samplers/__init__.py:built.add.traits": "a sampler entry's traits, from the same arguments function as its "
    "factory, given the config as the factory is",
}


def library_files() -> list[Path]:
    files = []
    for top in ("lrl", "samplers", "callbacks"):
        for path in sorted((ROOT / top).rglob("*.py")):  # rglob does not follow lrl/samplers, the link
            files.append(path)  # the lab is a package of its own (lab/lrl_lab), not under lrl/
    return files


def takes_whole_config(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = node.args
    for p in a.posonlyargs + a.args + a.kwonlyargs:
        annotation = ast.unparse(p.annotation) if p.annotation is not None else ""
        if p.arg in WHOLE or "Config" in _words(annotation):
            return True
    return False


def _words(text: str) -> set[str]:
    return set("".join(c if c.isalnum() or c == "_" else " " for c in text).split())


def whole_config_functions(files: list[Path] | None = None) -> list[str]:
    """``path:Qualified.name`` of every function or method that takes the whole configuration."""
    found = []
    for path in files if files is not None else library_files():
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        found += [f"{rel}:{name}" for name in _whole_in(ast.parse(path.read_text()))]
    return found


def _whole_in(tree: ast.AST, prefix: str = "") -> list[str]:
    out = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if takes_whole_config(node):
                out.append(prefix + node.name)
            out += _whole_in(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            out += _whole_in(node, f"{prefix}{node.name}.")
        else:
            out += _whole_in(node, prefix)
    return out


def _last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_section(node: ast.AST, bound: set[str]) -> bool:
    """`node` is a section: ``<cfg or config>.<section>``, or a name (or attribute) the module binds to one."""
    if isinstance(node, ast.Attribute) and node.attr in SECTIONS and _last_name(node.value) in WHOLE:
        return True
    return _last_name(node) in bound


def _section_bound(tree: ast.AST) -> set[str]:
    """The names a module binds to a section: parameters annotated with a section's class, and the targets of
    assignments from a section (:func:`_is_section`)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            if _words(ast.unparse(node.annotation)) & SECTION_CLASSES:
                bound.add(node.arg)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _is_section(node.value, bound):
                for target in node.targets:
                    for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                        name = _last_name(one)
                        if name is not None and name not in bound and name not in WHOLE:
                            bound.add(name)
                            changed = True
    return bound


def option_reads(files: list[Path] | None = None) -> tuple[int, int]:
    """(flat reads, reads through a section) of the options, by the rule in the module's docstring."""
    flat = section = 0
    for path in files if files is not None else library_files():
        tree = ast.parse(path.read_text())
        bound = _section_bound(tree)
        for node in ast.walk(tree):
            read = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            if not read or node.attr not in OPTIONS:
                continue
            if _last_name(node.value) in WHOLE:
                flat += 1
            elif _is_section(node.value, bound):
                section += 1
    return flat, section


def test_few_functions_take_the_whole_config():
    found = whole_config_functions()
    assert len(found) <= MOST_WHOLE_CONFIG, (
        f"{len(found)} functions take the whole configuration (at most {MOST_WHOLE_CONFIG}): {', '.join(found)}"
    )


def test_each_function_that_takes_the_whole_config_says_why():
    found = set(whole_config_functions())
    unexplained = sorted(found - set(WHOLE_CONFIG))
    stale = sorted(set(WHOLE_CONFIG) - found)
    assert not unexplained, f"take the whole configuration, not in WHOLE_CONFIG: {', '.join(unexplained)}"
    assert not stale, f"in WHOLE_CONFIG, no longer take the whole configuration: {', '.join(stale)}"


def test_options_are_read_through_their_sections_more_than_by_flat_name():
    flat, section = option_reads()
    assert section > flat, f"{flat} flat option reads and {section} through a section"


def test_the_counts_follow_their_rules(tmp_path):
    """The two readers on a small module: what each counts and what it leaves out."""
    code = tmp_path / "part.py"
    code.write_text(
        "def whole(cfg):\n    return cfg.lr + cfg.update.lr\n"
        "def typed(c: Config):\n    return getattr(c, 'lr')\n"
        "class Part:\n"
        "    def __init__(self, update: UpdateOptions, rollout):\n"
        "        self.opts = update\n        self.slots = rollout.slots\n"
        "    def step(self):\n        return self.opts.lr + self.cfg.minibatches + self.other.lr\n"
        "def unknown(sampling, engine):\n    return sampling.lag + engine.slots\n"
        "def known(s: SamplingOptions):\n    t = s\n    return t.lag\n"
    )
    assert whole_config_functions([code]) == ["part.py:whole", "part.py:typed"]
    # flat: cfg.lr, self.cfg.minibatches; section: cfg.update.lr, self.opts.lr, t.lag; neither: rollout.slots
    # and sampling.lag and engine.slots (unannotated parameters), self.other.lr
    assert option_reads([code]) == (2, 3)
