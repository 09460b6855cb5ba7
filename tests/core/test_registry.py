"""A registry is a read-only mapping of name -> Entry: indexing, len, membership and items work as for a dict,
and an unknown name is refused with the same message by [] and by get; an entry is built and checked with the
pieces of the config its parameters name."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from lrl.errors import ConfigError
from lrl.plugins import load_builtins
from lrl.registry import CORRECTIONS, ENVS, SAMPLERS, Entry, Registry, RegistryError

load_builtins()


def test_a_registry_is_a_mapping_of_names_to_entries():
    assert isinstance(SAMPLERS, Mapping)
    assert SAMPLERS["onpolicy"] is SAMPLERS.get("onpolicy") and isinstance(SAMPLERS["onpolicy"], Entry)
    assert len(SAMPLERS) == len(SAMPLERS.names()) >= 4
    assert "lagged" in SAMPLERS and "nope" not in SAMPLERS and 3 not in SAMPLERS
    assert list(SAMPLERS) == SAMPLERS.names()
    items = dict(SAMPLERS.items())
    assert items["engine"].uses == SAMPLERS["engine"].uses and set(items) == set(SAMPLERS.keys())
    assert {"none", "tis", "mis"} <= set(CORRECTIONS) and {"tinyagent", "review"} <= set(ENVS)


def test_an_unknown_name_is_a_key_error_with_the_message_of_get():
    with pytest.raises(RegistryError) as by_get:
        SAMPLERS.get("nope")
    with pytest.raises(KeyError) as by_index:
        SAMPLERS["nope"]
    assert isinstance(by_index.value, ValueError)  # old callers catch ValueError; mapping callers KeyError
    assert str(by_index.value) == str(by_get.value)
    assert str(by_get.value).startswith("sampler 'nope' is not registered; choose one of onpolicy, lagged")
    assert SAMPLERS.get("nope", None) is None  # with a default, get behaves as any mapping's


def test_a_registry_is_read_only_and_compared_by_identity():
    with pytest.raises(TypeError):
        SAMPLERS["mine"] = SAMPLERS["onpolicy"]
    with pytest.raises(TypeError):
        del SAMPLERS["onpolicy"]
    assert Registry("x") != Registry("x") and SAMPLERS == SAMPLERS
    assert {SAMPLERS: 1}[SAMPLERS] == 1  # hashable, as the option metadata that names it needs


def test_a_plugin_entry_can_wrap_a_built_in_one():
    registry = Registry("sampler")

    @registry.register("base", uses=("lag",))
    def base(cfg, tok):
        return ["built", cfg, tok]

    @registry.register("wrapped", uses=registry["base"].uses)
    def wrapped(cfg, tok):
        return ["wrapped", *registry["base"].factory(cfg, tok)]

    assert registry["wrapped"].factory("cfg", "tok") == ["wrapped", "built", "cfg", "tok"]
    assert registry["wrapped"].uses == ("lag",) and len(registry) == 2


def test_a_factory_gets_the_sections_options_and_values_its_parameters_name():
    from lrl.config import Config
    from lrl.registry import supply

    cfg = Config(sampler="lagged", lag=2, seed=7)
    seen = supply(lambda sampling, seed, tok, cfg, spare=None: (sampling, seed, tok, cfg, spare), cfg, tok="t")
    assert seen == (cfg.sampling, 7, "t", cfg, None)  # a section, an option, a given value, the whole config
    assert supply(lambda model=None: model, cfg, model="loaded") == "loaded"  # what the caller gives comes first
    with pytest.raises(TypeError, match=r"parameter 'nothing' names no section or option of the config, nor one of tok"):
        supply(lambda nothing: nothing, cfg, tok="t")
    with pytest.raises(TypeError, match="names no section or option"):
        supply(lambda replace: replace, cfg)  # a method of the config is not a piece of it


def test_an_entry_is_built_and_checked_with_what_it_names():
    from lrl.config import Config
    from lrl.registry import supply

    registry = Registry("sampler")

    @registry.register("mine", check=lambda sampling: [f"lag {sampling.lag}"], check_machine=lambda: ["none here"])
    def mine(sampling, tok):
        return sampling.lag, tok

    @registry.register("wrapper")
    def wrapper(cfg, tok):  # the whole config, passed on to the entry it wraps
        return ["wrapped", *supply(registry["mine"].factory, cfg, tok=tok)]

    cfg = Config(sampler="lagged", lag=3)
    entry = registry["mine"]
    assert supply(entry.factory, cfg, tok="t") == (3, "t") and supply(entry.check, cfg) == ["lag 3"]
    assert supply(entry.check_machine, cfg) == ["none here"]
    assert supply(registry["wrapper"].factory, cfg, tok="t") == ["wrapped", 3, "t"]


def test_a_step_with_more_tasks_than_the_environment_has_is_refused_where_it_is_made():
    from lrl.config import Config
    from lrl.envs import make_env

    assert len(make_env(Config(tasks_per_step=20)).train_tasks) == 20
    with pytest.raises(ConfigError, match="tasks_per_step: 21 is more than the 20 train tasks of tinyagent"):
        make_env(Config(tasks_per_step=21))


def test_a_lazy_package_name_loads_on_first_use_and_an_unknown_one_is_an_attribute_error():
    import lrl
    from lrl.lazy import lazy_names

    assert lrl.make_env.__module__ == "lrl.envs"
    getattr_ = lazy_names("pkg", {"dumps": "json"})
    assert getattr_("dumps").__module__ == "json"
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        getattr_("nope")
