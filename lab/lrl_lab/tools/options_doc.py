"""docs/options.md from the options' own declarations: every option, section by section, with its type, default,
what it allows, where it applies and whether a resumed run may change it; then the checks of both phases, from their
docstrings.

    python -m lrl_lab.tools.options_doc > docs/options.md

tests/tools/test_options_doc.py keeps the file equal to what this prints.
"""

from __future__ import annotations

import argparse
import inspect
import sys

HEADER = """# Options

Every option is a `--flag` of `train.py` (underscores become dashes), a key of a `--config` YAML file and an
attribute of `lrl.config.Config`, by its flat name (`cfg.lr`) or in its section (`cfg.update.lr`). This page is
generated from the declarations in `lrl/sections/` (`python -m lrl_lab.tools.options_doc > docs/options.md`); a test
keeps it current. `train.py --help` lists the same, section by section.

A config is checked in two phases, and every problem is one line naming the key, the value and what is allowed
(`train.py` prints it and exits with status 2, no traceback):

1. **static**, once, when the config is made: each option's type, bounds and choices (the tables below), then the
   rules between options and each chosen entry's own (listed after the tables). This is all that making a config
   does, from the command line, YAML or Python: it writes nothing, starts no process and converts no model (a named
   model such as `smollm2-135m` stays a name);
2. **preflight**, once, in the process that starts the run, when the run is built: named models resolved to their
   cached folders (converted the first time), then the config against the file system, what each chosen entry
   needs of the machine (the rollout workers' memory, a sandbox level, a package), the environment, the machine's
   memory, the model and the checkpoint it resumes, each as soon as what it checks exists. Rollout workers are given
   the resolved values and neither check nor resolve them again.

Integers are at most 2^31 - 1 and floats finite (|x| < 1e308); YAML 1.1's `1e-3` (read as a string) is taken as a
float; a bad flag, a missing value or an unknown flag or key is one line, not the usage. A choice that names a
registry (`sampler`, `correction`, `env`, `rollout_backend`, `stale_policy`, `callbacks`) takes whatever is
registered, a plugin's entries included; the tables list the built-in ones. An option that applies to some entries
or modes only is refused elsewhere when it is set away from its default.
"""


def shown(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(value) + "]"
    return "none" if value is None else str(value)


def builtin(registry, names: list[str]) -> list[str]:
    """The names among `names` that lrl itself registers: a plugin's entries (a user's, or the tests') are left
    out, so that the page is the same whatever was loaded before it was made."""
    return [n for n in names if getattr(registry.get(n).factory, "__module__", "").split(".")[0] == "lrl"]


def allowed(opt) -> str:
    from lrl.options import bounds_text, type_name
    from lrl.registry import Registry

    choices = opt.meta.get("choices")
    if isinstance(choices, Registry):
        return "registered: " + ", ".join(builtin(choices, choices.names()))
    if choices:
        return ", ".join(choices)
    bounds = bounds_text(opt.meta)
    return type_name(opt.annotation) + ("" if bounds == "any value" else ", " + bounds)


def applies(opt) -> str:
    from lrl.registry import REGISTRIES

    parts = []
    if opt.meta.get("scope"):
        scope = opt.meta["scope"]
        registry = REGISTRIES[scope]
        parts.append(f"{scope}: {', '.join(builtin(registry, registry.users(opt.name))) or 'none'}")
    if opt.meta.get("when"):
        parts.append(", ".join(f"{k}: {shown(v)}" for k, v in opt.meta["when"].items()))
    return "; ".join(parts)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def tables() -> list[str]:
    from lrl.arguments import HEADINGS
    from lrl.config import OPTIONS, SECTIONS

    lines = []
    for section, kind in SECTIONS.items():
        lines += ["", f"## {HEADINGS[section]}", "", f"`cfg.{section}`: {kind.__doc__.strip()}", ""]
        lines += [
            "| option | default | allowed | only with | resume | what |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for opt in OPTIONS.values():
            if opt.section == section:
                resume = "may change" if opt.resumable else ""
                row = [
                    f"`{opt.name}`",
                    f"`{shown(opt.default)}`",
                    allowed(opt),
                    applies(opt),
                    resume,
                    opt.meta["help"],
                ]
                lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return lines


def first_paragraph(fn) -> str:
    return " ".join(inspect.getdoc(fn).split("\n\n")[0].split())


def checks() -> list[str]:
    from lrl import configfile, preflight
    from lrl.config_rules import RULES

    lines = [
        "",
        "## Static rules",
        "",
        "Made once, when a config is made (`lrl/config_rules.py`), after every option has its type:",
        "",
    ]
    lines += [f"- {first_paragraph(rule)}" for rule in RULES]
    lines += ["", "A `--config` file: " + first_paragraph(configfile), ""]
    lines += ["## Preflight", "", "Made by `lrl.run.build_run` in this order (`lrl/preflight.py`):", ""]
    lines += [f"- `{name}`: {first_paragraph(getattr(preflight, name))}" for name in preflight.__all__]
    lines += ["", "A run that resumes is also refused when its checkpoint was written with other values of the "
              "options that may not change on resume (the tables' resume column).", ""]  # fmt: skip
    return lines


def markdown() -> str:
    from lrl.plugins import load_builtins

    load_builtins()
    return "\n".join([HEADER.rstrip(), *tables(), *checks()]).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m lrl_lab.tools.options_doc",
        description="Print docs/options.md: every option, section by section, and the checks of both phases.",
    ).parse_args(argv)
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
