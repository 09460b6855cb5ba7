"""Names of a package that load on first use, so that importing the package imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_names(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for `package` (``__getattr__ = lazy_names(__name__, {...})``): each name of
    `where` is imported from the module it maps to when it is first read; any other name is an AttributeError."""

    def __getattr__(name: str):
        if name in where:
            return getattr(import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
