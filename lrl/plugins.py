"""Loading what registers entries: lrl's built-in samplers, corrections, environments, rollout backends, staleness
policies and callbacks, then a run's ``plugins``; every module once per process.

The built-ins are loaded as a plugin is, by module name, so this loader sits above the registry (:mod:`lrl.registry`)
and above every module that registers an entry: those import the registry, never this loader, and the registry
imports none of them. The config loads through here before it checks a choice (:meth:`lrl.config.Config.validate`),
and so do ``--help`` and the YAML loader (:mod:`lrl.arguments`), so that a plugin's entries are valid choices, are
listed, and bring their defaults.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from lrl.registry import RegistryError
from lrl.stopping import StoppedBeforeTraining

# the packages whose entries register themselves when they are imported
BUILTINS = (
    "lrl.callbacks",
    "lrl.envs",
    "lrl.pipeline.backends",
    "lrl.pipeline.policies",
    "lrl.weights",
    "lrl.masks",
    "lrl.losses",
    "lrl.aggregations",
    "lrl.proximal",
    "lrl.samplers",
)

_loaded: set[str] = set()  # the modules this loader imported (or found imported) already


def load_builtins() -> None:
    """Import the packages of lrl's own entries (once)."""
    for name in BUILTINS:
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)


def import_file(path: Path) -> None:
    """Import the Python file `path` as the module ``lrl_plugin_<its stem>`` (a plugin kept outside any package)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    module_name = f"lrl_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise


def load(plugins: Sequence[str] = ()) -> list[str]:
    """lrl's own entries, then each plugin module (once) -> the problems, as messages (an import error, a name
    registered twice)."""
    load_builtins()
    problems = []
    for name in plugins:
        if not isinstance(name, str) or not name:
            problems.append(f"plugins: {name!r} is not a module name")
            continue
        if name in _loaded or (name in sys.modules and not name.endswith(".py")):
            continue
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # `python train.py` from a folder holding the plugin
        try:
            if name.endswith(".py"):  # a file anywhere: imported as a module named after it
                import_file(Path(name))
            else:
                importlib.import_module(name)
        except StoppedBeforeTraining:
            sys.modules.pop(name, None)  # a stop signal during the import: the run stops, not a bad plugin
            raise
        except RegistryError as err:
            sys.modules.pop(name, None)
            problems.append(f"plugins: {name!r}: {err}")
            continue
        except BaseException as err:  # noqa: B036
            # any way user code ends its import (an exception, exit(), a KeyboardInterrupt it raises) is a
            # config error that names it, never a traceback or a silent exit of train.py
            sys.modules.pop(name, None)
            detail = f": {err}" if str(err) else ""
            problems.append(f"plugins: cannot import {name!r} ({type(err).__name__}{detail})")
            continue
        _loaded.add(name)
    return problems
