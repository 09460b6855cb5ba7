"""A Config from the command line and YAML files: defaults, then the entries' defaults, then YAML, then flags.

Every option of :class:`lrl.config.Config` is a ``--flag`` and a YAML key under its flat name; ``--help`` lists them
section by section. ``--plugins`` (YAML ``plugins``) is
read first and imported, so that the user's registered samplers, corrections and environments are valid
choices, appear in ``--help`` and get their defaults. An entry's ``defaults`` (say, an environment's turn
limit) apply to the keys that neither the YAML file nor a flag sets.
"""

from __future__ import annotations

import argparse
from typing import Any

from lrl.cli import train_command, train_program
from lrl.config import OPTIONS, SECTIONS, Config, ConfigError
from lrl.configfile import load_yaml
from lrl.options import accepted_types, bounds_text, type_name, unmet_mode
from lrl.plugins import load as load_plugins
from lrl.registry import REGISTRIES, Registry


def from_dict(data: dict[str, Any]) -> Config:
    """Dict of keys -> validated Config; plugins first, then entry defaults for unset keys; unknown keys refused."""
    unknown = [k for k in data if k not in OPTIONS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; known keys: {', '.join(sorted(OPTIONS))}")
    data = dict(data)
    if isinstance(data.get("plugins"), str):
        data["plugins"] = [p for p in data["plugins"].split(",") if p]
    problems = load_plugins(data["plugins"] if isinstance(data.get("plugins"), list) else [])
    if problems:
        raise ConfigError("; ".join(problems))
    for scope, registry in REGISTRIES.items():
        value = data.get(scope, OPTIONS[scope].default)
        for name in value if isinstance(value, list) else [value]:
            if name in registry:
                for key, default in registry.get(name).defaults:
                    if _in_mode(key, data):  # a mode's option (redraw_flat) defaults only in its mode
                        data.setdefault(key, default)
    data = {k: _as_float(v) if float in accepted_types(OPTIONS[k].annotation) else v for k, v in data.items()}
    return Config(**data)


def _in_mode(key: str, data: dict[str, Any]) -> bool:
    """Whether option `key` applies with the options given in `data` (always, unless it belongs to a mode)."""
    return not unmet_mode(OPTIONS[key].meta, lambda other: data.get(other, OPTIONS[other].default))


def _as_float(value):
    """An int, or a string such as YAML 1.1's `1e-3`, as a float for a float key; anything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return value
    try:
        return float(value)
    except (ValueError, OverflowError):
        return value


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not allowed; it must be true or false")


def _flag_type(annotation):
    """The flag's parser: text -> value of the field's type; an ArgumentTypeError in lrl's words otherwise."""
    kinds = accepted_types(annotation)
    base = next(k for k in kinds if k is not type(None))
    if base is list:
        return lambda text: [p for p in text.split(",") if p]
    kind = {int: int, float: float, bool: _parse_bool, str: str}[base]
    optional = type(None) in kinds and base is not str

    def parse(text: str):
        if optional and text.lower() in ("none", "null"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not allowed; it must be {type_name(annotation)}"
            ) from None

    return parse


class BooleanFlag(argparse.Action):
    """A boolean option as ``--flag``, ``--no-flag`` or ``--flag true|false`` (the form a YAML value takes)."""

    def __init__(self, option_strings, dest, **kw):
        name = option_strings[0][2:]
        super().__init__([f"--{name}", f"--no-{name}"], dest, nargs="?", const=None, type=_parse_bool, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string.startswith("--no-"):
            if values is not None:
                raise argparse.ArgumentError(self, f"{option_string} takes no value; it means false")
            values = False
        setattr(namespace, self.dest, True if values is None else values)


class _Formatter(argparse.HelpFormatter):
    def _format_action_invocation(self, action):
        if isinstance(action, BooleanFlag):
            yes, no = action.option_strings
            return f"{yes} [true|false], {no}"
        return super()._format_action_invocation(action)


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one ConfigError line (train.py prints it), not the usage."""

    def error(self, message: str):
        message = message.removeprefix("argument ")
        raise ConfigError(f"invalid command line: {message} ({train_command()} --help lists every option)")


def _help(f) -> str:
    meta = f.meta
    text = meta["help"]
    choices = meta.get("choices")
    if isinstance(choices, Registry):
        text += f"; one of: {', '.join(choices.names())}"
    elif choices:
        text += f"; one of: {', '.join(choices)}"
    elif any(meta.get(k) is not None for k in ("ge", "gt", "le", "lt")):
        text += f"; {bounds_text(meta)}"
    if meta.get("scope"):
        text += f" (read by {meta['scope']}: {', '.join(REGISTRIES[meta['scope']].users(f.name)) or 'none'})"
    if meta.get("when"):
        text += f" (only with {', '.join(f'{k} {_shown(v)}' for k, v in meta['when'].items())})"
    if meta.get("resumable"):
        text += " (may change on resume)"
    default = f.default
    return f"{text} (default: {','.join(default) if isinstance(default, list) else _shown(default)})"


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --help's heading of each section
HEADINGS = {
    "run": "run: its length, files, resume and processes",
    "policy": "policy: the model trained and its arithmetic",
    "environment": "environment: the tasks, turns and tools",
    "batch": "batch: what one step samples",
    "update": "update: the clipped loss, Adam and the guards",
    "sampling": "sampling: the behavior sampler",
    "weighting": "weighting: the behavior-policy correction",
    "rollout": "rollout: the pipeline, its workers and the staleness bound",
    "evaluation": "evaluation: the held-out tasks",
    "monitoring": "monitoring: what is logged and checked during the run",
}


def build_parser() -> argparse.ArgumentParser:
    """argparse over every option, section by section; defaults are suppressed so that only given flags override
    the YAML."""
    load_plugins()
    parser = Parser(
        prog=train_program(),
        description="Train an agent (TinyAgent by default, or a local transformers causal LM) with RL from a "
        "behavior sampler. Every option is also a YAML key.",
        argument_default=argparse.SUPPRESS,
        formatter_class=_Formatter,
    )
    parser.add_argument("--config", help="YAML file of the keys below; flags override it")
    groups = {section: parser.add_argument_group(HEADINGS[section]) for section in SECTIONS}
    for f in OPTIONS.values():
        flag = f"--{f.name.replace('_', '-')}"
        group = groups[f.section]
        if f.annotation is bool:
            group.add_argument(flag, action=BooleanFlag, help=_help(f), metavar="true|false")
        else:
            group.add_argument(flag, type=_flag_type(f.annotation), help=_help(f), metavar=f.name.upper())
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """Command line -> Config: plugins imported first, then defaults, entry defaults, the YAML file, the flags."""
    pre = Parser(prog=train_program(), add_help=False, exit_on_error=False)
    pre.add_argument("--plugins", default=None)
    pre.add_argument("--config", default=None)
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError as err:
        pre.error(str(err))
    data = load_yaml(known.config) if known.config else {}
    plugins = known.plugins.split(",") if known.plugins is not None else data.get("plugins", [])
    problems = load_plugins([p for p in plugins if p] if isinstance(plugins, list) else [])
    if problems:
        raise ConfigError("; ".join(problems))
    parser = build_parser()
    args = vars(parser.parse_args(argv))  # --help prints the help and exits 0; an error is a ConfigError
    args.pop("config", None)
    data.update(args)
    return from_dict(data)
