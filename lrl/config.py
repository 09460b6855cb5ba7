"""The run configuration: typed sections of options (:mod:`lrl.sections`), the single source of defaults for the
CLI, YAML and code.

Each option is declared once, in its section, with its type, default, help, bounds and whether a resumed run may
change it (:func:`lrl.options.option`). It is a ``--flag`` (underscores become dashes) and a YAML key under its flat
name, and ``cfg.<name>`` reads (and sets) it as ``cfg.<section>.<name>`` does: ``cfg.lr is cfg.update.lr``.

A config is data: making one (in code, from YAML or from the command line) parses and checks its values and does
nothing else: no file written, no process started, no model converted, no path or memory of the machine looked
at. The static checks are here, once, when a Config is made (:meth:`Config.validate`): every option's type, bounds
and choices, then the cross-key rules (:mod:`lrl.config_rules`) and each chosen entry's own rules, all reported in
one :class:`ConfigError`. The choices of ``sampler``, ``correction``, ``env``, ``rollout_backend`` and
``stale_policy`` are whatever is registered (:mod:`lrl.registry`), built-ins and ``plugins`` loaded first
(:mod:`lrl.plugins`).

What needs the machine runs once, in the preflight of the process that starts the run (:mod:`lrl.preflight`): a
named model resolved to its cached folder (converted the first time), the paths that must exist, each chosen entry's
needs of the machine (memory, a sandbox), then the environment, the model and the memory plan. A rollout worker is
given those resolved values and takes them as they are (:meth:`Config.resolved`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lrl.errors import ConfigError
from lrl.options import MAX_INT, check_field, expand_path, option
from lrl.registry import supply
from lrl.sections import (
    OPTIONS,
    SECTIONS,
    BatchOptions,
    EnvironmentOptions,
    EvaluationOptions,
    MonitoringOptions,
    Option,
    PolicyOptions,
    RolloutOptions,
    RunOptions,
    SamplingOptions,
    UpdateOptions,
    WeightingOptions,
)


class Config:
    """A run's options, in sections; made from flat option names and/or whole sections, checked once when made.

    ``Config(lr=1e-3, sampler="lagged", lag=2)`` and ``Config(update=UpdateOptions(lr=1e-3))`` give the same kind
    of object; what is not given has its default. Paths are expanded (``~``) before the checks; a named model
    stays a name until the run's preflight resolves it (:func:`lrl.preflight.resolve`).
    """

    run: RunOptions
    policy: PolicyOptions
    environment: EnvironmentOptions
    batch: BatchOptions
    update: UpdateOptions
    sampling: SamplingOptions
    weighting: WeightingOptions
    rollout: RolloutOptions
    evaluation: EvaluationOptions
    monitoring: MonitoringOptions

    def __init__(self, **values):
        self._fill(values)
        self.validate()

    @classmethod
    def resolved(cls, values: dict[str, Any]) -> Config:
        """A config that the run's preflight has already checked and resolved (a rollout worker's setup, as
        :meth:`to_dict` gave it): its values taken as they are, the plugins loaded so that their entries can be
        built, and nothing checked or resolved again."""
        from lrl.plugins import load

        cfg = cls.__new__(cls)
        cfg._fill(values)
        problems = load(cfg.run.plugins)
        if problems:  # the trainer's process imported them; a worker that cannot is told why
            raise ConfigError("; ".join(problems))
        return cfg

    def __reduce__(self):
        """A config crosses to another process (a rollout worker's setup) as its values and is rebuilt there as
        the preflight resolved it (:meth:`resolved`): so a worker is handed its config and never builds one."""
        return type(self).resolved, (self.to_dict(),)

    def _fill(self, values: dict[str, Any]) -> None:
        """The sections from flat names and/or whole sections; paths expanded."""
        unknown = [k for k in values if k not in OPTIONS and k not in SECTIONS]
        if unknown:
            raise TypeError(f"Config() got an unexpected keyword argument {unknown[0]!r}")
        for section, kind in SECTIONS.items():
            given = values.get(section, kind())
            if not isinstance(given, kind):
                raise TypeError(f"Config(): {section} must be a {kind.__name__}, not {type(given).__name__}")
            own = {name: value for name, value in values.items() if OPTIONS.get(name, None) is not None
                   and OPTIONS[name].section == section}  # fmt: skip
            setattr(self, section, replace(given, **own))
        for opt in OPTIONS.values():  # paths are expanded here, once, before anything checks or uses them
            if opt.meta.get("path"):
                setattr(self, opt.name, expand_path(getattr(self, opt.name)))

    def validate(self) -> Config:
        """The static checks: every option (type, bounds, choices), then every cross-key rule and each chosen
        entry's own; one ConfigError listing every problem."""
        from lrl.plugins import load  # what registers the choices: lrl's own entries, then the plugins

        problems = load(self.plugins) if isinstance(self.plugins, list) else []
        for opt in OPTIONS.values():
            problems += check_field(opt.name, getattr(self, opt.name), opt.annotation, opt.meta)
        if not problems:  # cross-key rules assume every option has its type
            from lrl.config_rules import RULES  # the cross-key rules, each of the sections it reads

            problems += [p for rule in RULES for p in supply(rule, self)]
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    @property
    def world_size(self) -> int:
        return self.run.world_size

    def to_dict(self) -> dict[str, Any]:
        """Every option by its flat name (the form of a YAML file, a checkpoint's record and a worker's setup)."""
        return {name: _copied(getattr(self, name)) for name in OPTIONS}

    def replace(self, **changes) -> Config:
        return type(self)(**{**self.to_dict(), **changes})

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in SECTIONS)

    __hash__ = None  # type: ignore[assignment]  (a config is mutable)

    def __repr__(self) -> str:
        return f"Config({', '.join(f'{s}={getattr(self, s)!r}' for s in SECTIONS)})"


def _copied(value):
    return list(value) if isinstance(value, list) else value


def _flat(opt: Option) -> property:
    """``cfg.<name>``: the option read and set in its section."""

    def get(self):
        return getattr(getattr(self, opt.section), opt.name)

    def put(self, value):
        setattr(getattr(self, opt.section), opt.name, value)

    return property(get, put, doc=opt.meta["help"])


for _opt in OPTIONS.values():
    setattr(Config, _opt.name, _flat(_opt))
del _opt

__all__ = ["MAX_INT", "OPTIONS", "SECTIONS", "Config", "ConfigError", "Option", "option"]
