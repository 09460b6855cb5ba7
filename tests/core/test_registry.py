"""A registry is a read-only mapping of name -> Entry: indexing, len, membership and items work as for a dict,
and an unknown name is refused with the same message by [] and by get."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

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
