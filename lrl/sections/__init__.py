"""The sections of the run configuration, each a typed record of the options one part of lrl reads.

:class:`lrl.config.Config` is made of them (``cfg.update.lr``, ``cfg.sampling.lag``) and still reads every option
by its flat name (``cfg.lr``), the name it has as a ``--flag`` and a YAML key. A part of lrl that needs one section
takes that section: the update its :class:`UpdateOptions`, a correction its :class:`WeightingOptions`, the held-out
evaluation its :class:`EvaluationOptions`.

The option that chooses a registered entry keeps its flat name inside its section (``cfg.sampling.sampler``,
``cfg.weighting.correction``, ``cfg.rollout.pipeline``); the sections are named for what they configure.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields
from typing import Any

from lrl.options import default_of
from lrl.sections.rollout import ASYNC, EnvironmentOptions, RolloutOptions
from lrl.sections.run import EvaluationOptions, MonitoringOptions, PolicyOptions, RunOptions
from lrl.sections.training import BatchOptions, SamplingOptions, UpdateOptions, WeightingOptions

# the sections of a Config, by the attribute that holds each, in the order --help and the docs list them
SECTIONS: dict[str, type] = {
    "run": RunOptions,
    "policy": PolicyOptions,
    "environment": EnvironmentOptions,
    "batch": BatchOptions,
    "update": UpdateOptions,
    "sampling": SamplingOptions,
    "weighting": WeightingOptions,
    "rollout": RolloutOptions,
    "evaluation": EvaluationOptions,
    "monitoring": MonitoringOptions,
}


@dataclass(frozen=True)
class Option:
    """One option as the loaders, ``--help``, the checks and the docs see it: its flat name, its section, its
    declaration."""

    name: str
    section: str
    field: Field
    annotation: Any

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.field.metadata

    @property
    def default(self):
        return default_of(self.field)

    @property
    def resumable(self) -> bool:
        """Whether a resumed run may set it otherwise than the run that wrote the checkpoint."""
        return self.meta["resumable"]


def _options() -> dict[str, Option]:
    found: dict[str, Option] = {}
    for section, kind in SECTIONS.items():
        hints = typing.get_type_hints(kind)
        for f in fields(kind):
            if f.name in found or f.name in SECTIONS:
                raise TypeError(
                    f"option {f.name!r} of section {section!r} is declared twice or names a section"
                )
            found[f.name] = Option(f.name, section, f, hints[f.name])
    return found


OPTIONS: dict[str, Option] = _options()  # every option by its flat name, section by section


def call_with_sections(fn, cfg, *args):
    """``fn`` called with the sections of `cfg` that its leading parameters are named for, then `args`: a registry
    entry's check ``def check(weighting)`` is given ``cfg.weighting``, ``def check(environment, batch)`` both; one
    whose first parameter names no section (``def check(cfg)``) is given the whole config."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a callable without a signature Python can read: the whole config
        names = []
    wanted = []
    for name in names:
        if name not in SECTIONS:
            break
        wanted.append(name)
    if not wanted:
        return fn(cfg, *args)
    return fn(*(getattr(cfg, name) for name in wanted), *args)


__all__ = [
    "ASYNC",
    "OPTIONS",
    "SECTIONS",
    "BatchOptions",
    "EnvironmentOptions",
    "EvaluationOptions",
    "MonitoringOptions",
    "Option",
    "PolicyOptions",
    "RolloutOptions",
    "RunOptions",
    "SamplingOptions",
    "UpdateOptions",
    "WeightingOptions",
    "call_with_sections",
]
