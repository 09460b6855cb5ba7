"""Reading a YAML config file that nobody has checked: a bounded size, bounded aliases, no key given twice.

A config is a few dozen keys, so anything far larger is a mistake or an attack. The file is read whole only
below :data:`MAX_BYTES`. YAML aliases (``*name``) share one node, so a file of a few hundred bytes can
describe billions of values (the "billion laughs"): the document is composed into its node graph first, which
is as large as the text, and the number of values it stands for once every alias is expanded is counted in
linear time (each node once, memoised) before anything is built from it. A key given twice in one mapping
is refused: YAML would keep the last one silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lrl.config import ConfigError
from lrl.options import exists

MAX_BYTES = 2**20  # 1 MiB: the shipped configs are under 1 KiB
MAX_NODES = 10_000  # values a document may stand for with its aliases expanded


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden, by design
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    twice = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the constructor refuses it below
                    continue
                if twice:
                    line = key_node.start_mark.line + 1
                    raise ConfigError(f"key {key!r} is given twice (again on line {line}); give it once")
        return super().construct_mapping(node, deep=deep)


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def expanded_size(root) -> int | None:
    """Nodes of a composed document with every alias expanded (None: an alias inside its own anchor).

    Each distinct node is visited once and its expanded size memoised, so the count takes time linear in the
    text however large the expansion is; an explicit stack, so deep nesting does not hit Python's recursion.
    """
    size: dict[int, int] = {}
    visiting: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            visiting.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
        elif key in visiting:  # reached again below itself: a recursive anchor
            return None
        elif key not in size:
            visiting.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return size[id(root)]


def _distinct(root) -> int:
    """Distinct nodes of a composed document (each alias counted once, where it is anchored)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(_children(node))
    return len(seen)


def parse_yaml(text: str, where: str) -> Any:
    """YAML text -> Python data, refusing alias expansions beyond MAX_NODES and keys given twice."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        total = expanded_size(root)
        if total is None:
            raise ConfigError(f"config: {where} has an alias inside its own anchor (a recursive value)")
        if total > MAX_NODES and total > _distinct(root):
            raise ConfigError(
                f"config: {where} stands for {total:,} values once its aliases are expanded; "
                f"at most {MAX_NODES:,} are allowed"
            )
        return loader.construct_document(root)
    except ConfigError as err:
        raise ConfigError(str(err) if str(err).startswith("config:") else f"config: {where}: {err}") from None
    except RecursionError:  # nesting deeper than PyYAML's recursive composer can follow
        raise ConfigError(f"config: {where} is nested too deeply to be a config") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file -> dict; missing, huge, non-text and non-mapping files are refused."""
    if not exists(path):
        raise ConfigError(f"config: {str(path)!r} does not exist")
    path = Path(path)
    if not path.is_file():  # a folder, a pipe (which would block the read), a device
        raise ConfigError(f"config: {str(path)!r} is not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)  # never more, even of a file that grows while it is read
        if len(raw) > MAX_BYTES:
            raise ConfigError(
                f"config: {str(path)!r} is larger than {MAX_BYTES // 2**20} MiB "
                f"({path.stat().st_size / 2**20:.1f} MiB); a config file holds a few keys"
            )
        data = parse_yaml(raw.decode("utf-8"), str(path)) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config: {path} is not valid YAML ({err})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config: {str(path)!r} cannot be read as a text file ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of keys to values, not {type(data).__name__}")
    return data
