"""Registries: the single source of the choices a run accepts (samplers, corrections, environments, rollout
backends, staleness policies, extra callbacks, rejection masks, and the update's parts: losses, aggregations and
proximal policies).

An entry is registered next to its own code with the config keys it reads (``uses``) and, optionally, a
``check`` of problems specific to it (from the values alone), a ``check_machine`` of what it needs of the machine
(memory, a sandbox, a package, a folder: run once, by the preflight of the process that starts the run) and a
``check_model`` of models it cannot run. The config's validation, ``--help`` and the YAML loader list what is
registered, so a user's own entry, imported as a plugin, is chosen exactly like a built-in one. This module imports
nothing of lrl: the built-in entries register when their packages are imported, and :mod:`lrl.plugins` imports
those and the plugins.

A factory and each check take what they read, by the names of their parameters (:func:`supply`): a section of the
config (``sampling``, ``environment``, ...), one option (``seed``), what the caller hands over (``tok``, ``spec``,
``model``), or, for an entry that passes the config on, all of it (``cfg``), so a signature says what the entry
depends on: ``def mine(sampling, tok)`` reads the sampling section and nothing else.
``supply`` is the one place that picks those pieces out of a whole config: whoever builds or checks an entry calls
``supply(entry.factory, cfg, tok=tok)``, ``supply(entry.check, cfg)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache

_NO_DEFAULT = object()
WHOLE = ("cfg", "config")  # a parameter that takes the whole configuration (an entry that passes it on)


def supply(fn: Callable, cfg, **given):
    """Call `fn` with what its parameters name: a value the caller gives (``tok``, ``spec``, ``model``) by its
    name first, then a section of `cfg` (``sampling``, ``environment``, ``policy``, ...) or one option by its flat
    name (``seed``), then the whole `cfg` for a parameter named ``cfg`` or ``config``. A parameter that names none
    of these keeps its default; one without a default is a TypeError that says so."""
    args, kwargs = [], {}
    try:
        parameters = _parameters(fn)
    except TypeError:  # a callable that cannot be hashed: read its signature each time
        parameters = tuple(inspect.signature(fn).parameters.values())
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in given:
            value = given[p.name]
        elif p.name in WHOLE:
            value = cfg
        else:
            value = getattr(cfg, p.name, _NO_DEFAULT) if not p.name.startswith("_") else _NO_DEFAULT
            if callable(value) or value is _NO_DEFAULT:  # a method of the config is no section
                if p.default is not p.empty:
                    continue
                where = getattr(fn, "__qualname__", repr(fn))
                raise TypeError(
                    f"{where}: parameter {p.name!r} names no section or option of the config"
                    f"{', nor one of ' + ', '.join(given) if given else ''} (cfg: the whole config)"
                )
        if p.kind == p.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[p.name] = value
    return fn(*args, **kwargs)


@cache
def _parameters(fn: Callable) -> tuple[inspect.Parameter, ...]:
    return tuple(inspect.signature(fn).parameters.values())


class RegistryError(ValueError, KeyError):
    """A name registered twice, or a name that is not registered (a KeyError too, for ``registry[name]``)."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry:
    """One registered choice: its factory (or function), the config keys it reads, its own checks."""

    name: str
    factory: Callable  # called with what its parameters name (supply); corrections and masks: their own call
    uses: tuple[str, ...] = ()
    check: Callable | None = None
    help: str = ""
    defaults: tuple[tuple[str, object], ...] = ()  # config values this entry sets where the user set none
    check_model: Callable | None = None  # (..., spec, model) -> problems: a model the entry cannot run
    instructions: str = ""  # environments: a chat model's system message, unless --system-prompt replaces it
    # corrections and masks: a row's weights depend on that row's log-probs alone, so a step may make them piece
    # by piece from its update's own forward (lrl.module); False (a plugin's default) scores the whole batch first
    per_row: bool = False
    # what an entry declares of itself, read without building it (taking what its parameters name, as a factory):
    # samplers, the Traits of the sampler the factory would build (the mismatch split of an asynchronous run reads
    # them; its samplers live in the workers); losses, proximal policies and masks, what the rules on how they
    # combine read (lrl.losses.LossTraits, lrl.proximal.ProximalTraits, lrl.masks.MaskTraits)
    traits: Callable | None = None
    check_machine: Callable | None = None  # problems: what it needs of this machine (preflight)


class Registry(Mapping):
    """A read-only mapping of name -> Entry for one kind of choice (``sampler``, ``correction``, ``env``).

    ``SAMPLERS["onpolicy"]``, ``len(SAMPLERS)``, ``"lagged" in SAMPLERS`` and ``dict(SAMPLERS.items())`` work as
    for any mapping; an unknown name raises :class:`RegistryError` (a KeyError) listing what is registered.
    Entries are added only through :meth:`register`. Two registries are equal only when they are the same one.
    """

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(self, kind: str):
        self.kind = kind
        self.entries: dict[str, Entry] = {}

    def register(
        self,
        name: str,
        *,
        uses=(),
        check: Callable | None = None,
        help: str = "",
        defaults=None,
        check_model: Callable | None = None,
        instructions: str = "",
        per_row: bool = False,
        traits: Callable | None = None,
        check_machine: Callable | None = None,
    ):
        """Decorator: make `fn` available under `name`; a name registered twice is an error.

        `fn` and each check below take what their parameters name (:func:`supply`: sections, options, ``tok``).
        ``uses``: the config keys the entry reads; ``check(...) -> list[str]``: its own rules, as problems, from
        the values alone (it runs whenever a config is made: it writes nothing, starts nothing, looks at no path of the machine);
        ``check_machine(...) -> list[str]``: what it needs of this machine (memory, a sandbox, a package, a
        folder), checked once by the preflight of the process that starts the run (:func:`lrl.preflight.resolve`);
        ``defaults``: config values it wants where the user gave none (e.g. an environment's turn limit);
        ``check_model(..., spec, model) -> list[str]``: models it cannot run (checked before the run starts);
        ``instructions``: an environment's instructions to a chat model, its system message;
        ``per_row``: a correction or mask whose decision for a row reads that row's log-probs alone (see
        :class:`Entry`); one that reads the whole batch (a batch mean, a batch's second moment) leaves it False;
        ``traits(...)``: what the entry is, known without building it (a sampler's ``lrl.samplers.Traits``; a
        loss's, proximal policy's or mask's traits, which the rules on their combinations read).
        """
        if not isinstance(name, str) or not _is_name(name):
            raise RegistryError(
                f"{self.kind} name {name!r} must be an identifier (letters, digits, _), or words joined by - "
                "(oldest-first)"
            )

        def add(fn):
            if name in self.entries and self.entries[name].factory is not fn:
                where = getattr(self.entries[name].factory, "__module__", "?")
                raise RegistryError(f"{self.kind} {name!r} is registered twice (first by {where})")
            doc = help or (fn.__doc__ or "").strip().split("\n")[0]
            defaults_ = tuple((defaults or {}).items())
            self.entries[name] = Entry(
                name, fn, tuple(uses), check, doc, defaults_, check_model, instructions, per_row, traits, check_machine
            )
            return fn

        return add

    def names(self) -> list[str]:
        return list(self.entries)

    def chosen(self, value) -> list[Entry]:
        """The entries a config value names: one name (``correction: tis``) or a list (``masks: [kl, opsm]``)."""
        return [self.get(name) for name in (value if isinstance(value, list) else [value])]

    def get(self, name: str, default=_NO_DEFAULT) -> Entry:
        """The entry of `name`; an unknown name is a RegistryError listing the registered ones, unless a
        `default` is given (then that is returned, as for any mapping)."""
        if name in self:
            return self.entries[name]
        if default is not _NO_DEFAULT:
            return default
        raise RegistryError(
            f"{self.kind} {name!r} is not registered; choose one of {', '.join(self.entries)}"
        )

    def __getitem__(self, name: str) -> Entry:
        return self.get(name)

    def users(self, key: str) -> list[str]:
        """Names of the entries that read config key `key`."""
        return [e.name for e in self.entries.values() if key in e.uses]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.entries))

    def __len__(self) -> int:
        return len(self.entries)


SAMPLERS = Registry("sampler")
CORRECTIONS = Registry("correction")
MASKS = Registry(
    "mask"
)  # rejection masks: tokens or episodes left out of the loss, by a rule on pi_old and mu
ENVS = Registry("env")
CALLBACKS = Registry("callback")  # extra monitoring callbacks, chosen by name in the config's `callbacks`
BACKENDS = Registry("rollout_backend")  # where the asynchronous pipeline's rollout workers run
STALENESS = Registry("stale_policy")  # what the asynchronous pipeline does with work past its staleness bound
LOSSES = Registry("loss")  # the policy losses: each action token's term (lrl.losses)
AGGREGATIONS = Registry("aggregation")  # how the terms become the step's loss (lrl.aggregations)
PROXIMALS = Registry("proximal")  # pi_prox, the policy a loss's ratio is taken against (lrl.proximal)
# the registries a config option can be scoped to (option(..., scope=...)), by the config key that names the entry
REGISTRIES: dict[str, Registry] = {
    "sampler": SAMPLERS,
    "correction": CORRECTIONS,
    "masks": MASKS,
    "env": ENVS,
    "rollout_backend": BACKENDS,
    "stale_policy": STALENESS,
    "loss": LOSSES,
    "aggregation": AGGREGATIONS,
    "proximal": PROXIMALS,
}


def _is_name(name: str) -> bool:
    """An identifier, or identifiers joined by single hyphens (a name a flag or a YAML value can carry)."""
    return all(part.isidentifier() for part in name.split("-"))
