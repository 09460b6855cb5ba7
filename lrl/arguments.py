"""A Config from the command line and YAML files: defaults, then the entries' defaults, then YAML, then flags.

Every field of :class:`lrl.config.Config` is a ``--flag`` and a YAML key. ``--plugins`` (YAML ``plugins``) is
read first and imported, so that the user's registered samplers, corrections and environments are valid
choices, appear in ``--help`` and get their defaults. An entry's ``defaults`` (say, an environment's turn
limit) apply to the keys that neither the YAML file nor a flag sets.
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import fields
from typing import Any

from lrl.config import REGISTRIES, Config, ConfigError
from lrl.configfile import load_yaml
from lrl.options import accepted_types, bounds_text, default_of, import_plugins
from lrl.registry import Registry, load_builtins


def from_dict(data: dict[str, Any]) -> Config:
    """Dict of keys -> validated Config; plugins first, then entry defaults for unset keys; unknown keys refused."""
    hints = typing.get_type_hints(Config)
    unknown = [k for k in data if k not in hints]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; known keys: {', '.join(sorted(hints))}")
    data = dict(data)
    if isinstance(data.get("plugins"), str):
        data["plugins"] = [p for p in data["plugins"].split(",") if p]
    if isinstance(data.get("plugins"), list):
        problems = import_plugins(data["plugins"])
        if problems:
            raise ConfigError("; ".join(problems))
    load_builtins()
    for scope, registry in REGISTRIES.items():
        name = data.get(scope, _default(scope))
        if name in registry:
            for key, value in registry.get(name).defaults:
                data.setdefault(key, value)
    data = {k: _as_float(v) if float in accepted_types(hints[k]) else v for k, v in data.items()}
    return Config(**data)


def _default(name: str):
    return next(default_of(f) for f in fields(Config) if f.name == name)


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
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_none(kind):
    """A flag type that reads 'none'/'null' as None for optional fields."""

    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)

    return parse


def _flag_type(annotation):
    kinds = accepted_types(annotation)
    base = next(k for k in kinds if k is not type(None))
    if base is list:
        return lambda text: [p for p in text.split(",") if p]
    kind = {int: int, float: float, bool: _parse_bool, str: str}[base]
    return _parse_none(kind) if type(None) in kinds and base is not str else kind


def _help(f) -> str:
    meta = f.metadata
    text = f.metadata["help"]
    choices = meta.get("choices")
    if isinstance(choices, Registry):
        text += f"; one of: {', '.join(choices.names())}"
    elif choices:
        text += f"; one of: {', '.join(choices)}"
    elif any(meta.get(k) is not None for k in ("ge", "gt", "le", "lt")):
        text += f"; {bounds_text(meta)}"
    if meta.get("scope"):
        text += f" (read by {meta['scope']}s: {', '.join(REGISTRIES[meta['scope']].users(f.name)) or 'none'})"
    default = default_of(f)
    return f"{text} (default: {','.join(default) if isinstance(default, list) else default})"


def build_parser() -> argparse.ArgumentParser:
    """argparse over every Config field; defaults are suppressed so that only given flags override the YAML."""
    load_builtins()
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train an agent (TinyAgent by default, or a local transformers causal LM) with RL from a "
        "behavior sampler. Every option is also a YAML key.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="YAML file of the keys below; flags override it")
    hints = typing.get_type_hints(Config)
    for f in fields(Config):
        flag = f"--{f.name.replace('_', '-')}"
        parser.add_argument(flag, type=_flag_type(hints[f.name]), help=_help(f), metavar=f.name.upper())
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """Command line -> Config: plugins imported first, then defaults, entry defaults, the YAML file, the flags."""
    pre = argparse.ArgumentParser(prog="train.py", add_help=False, exit_on_error=False)
    pre.add_argument("--plugins", default=None)
    pre.add_argument("--config", default=None)
    try:
        known, _ = pre.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as err:
        raise ConfigError(f"invalid command line: {err}") from None
    data = load_yaml(known.config) if known.config else {}
    plugins = known.plugins.split(",") if known.plugins is not None else data.get("plugins", [])
    problems = import_plugins([p for p in plugins if p]) if isinstance(plugins, list) else []
    if problems:
        raise ConfigError("; ".join(problems))
    parser = build_parser()
    try:
        args = vars(parser.parse_args(argv))
    except SystemExit as exit_:
        if exit_.code == 0:
            raise
        raise ConfigError("invalid command line; see the message above and --help") from None
    args.pop("config", None)
    data.update(args)
    return from_dict(data)
