"""The sampler contract (samplers/base.py's ``Sampler`` Protocol): the mismatch split and the memory plan ask
a sampler for its ``traits``, never its name or class, so a user's sampler gets both by declaring them (the
``rounded_bf16`` sampler of examples/my_plugin.py, docs/extending.md); the built-in ones keep their figures.
"""

from __future__ import annotations

import ast
import dataclasses
import types
from pathlib import Path

import pytest
import torch
from conftest import quick_cfg
from test_real_model import PLUGINS, real_cfg

from lrl import budget, samplers
from lrl.callbacks.mismatch_split import MismatchSplit
from lrl.config import Config
from lrl.policy import make_policy
from lrl.run import build_run, fit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TOK = types.SimpleNamespace(pad_id=0, eos_id=1)  # the samplers keep it; nothing here decodes
PARTS = ("staleness", "quantization", "engine", "rest")
PROBES = ("getattr", "hasattr")


@pytest.fixture
def plugins(monkeypatch):
    """The coin environment (tests/plugins) and the user's plugin of examples/, importable by name."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(EXAMPLES))


BUILT_IN = [
    dict(),
    dict(decode="kvcache", precision="bf16"),
    dict(sampler="lagged", lag=3),
    dict(sampler="fp8", lag=1, fp8_scale="tensor"),
    dict(sampler="engine", lag=2, engine_dtype="bfloat16", top_k=5),
    dict(sampler="engine", engine_dtype="float16", engine_fp8=True, temperature=0.7),
]


@pytest.mark.parametrize("options", BUILT_IN)
def test_a_built_in_entry_declares_the_traits_its_sampler_has(options):
    cfg = Config(**options)
    declared, built = samplers.sampler_traits(cfg, TOK), samplers.make_sampler(cfg, TOK).traits
    assert (declared.transform is None) == (built.transform is None)  # each build makes its own rounding
    fields = ("sampling", "staleness", "decode", "dtype", "precision", "bytes_per_parameter", "extra_bytes")
    assert [getattr(declared, f) for f in fields] == [getattr(built, f) for f in fields]


def test_the_vllm_sampler_declares_its_push_interval_and_its_cache():
    sampler = samplers.VLLMSampler(TOK, lag=2, dtype="bfloat16", kv_cache_mib=128, sync_every=3)
    traits = sampler.traits  # known before the engine starts (setup starts it)
    assert (traits.staleness, traits.dtype, traits.decode) == (4, torch.bfloat16, "kvcache")
    assert traits.kept_bytes(1000) == 4 * 1000 * (2 + 2) + 128 * 2**20


@pytest.mark.parametrize(
    "options, copies",
    [
        (dict(), 0),
        (dict(sampler="lagged", lag=3), 4 * (3 + 2)),  # the kept versions and the behavior model
        (dict(sampler="fp8", lag=1), 4 * (1 + 2)),
        (dict(sampler="engine", lag=1), 4 * (1 + 1) + 4),  # the kept versions and the engine's fp32 copy
        (dict(sampler="engine", lag=1, engine_dtype="bfloat16"), 4 * (1 + 1) + 2),
    ],
)
def test_the_memory_plan_counts_the_built_in_samplers_copies_as_before(options, copies):
    params = 1000
    cfg = Config(**options)
    sampler = samplers.make_sampler(cfg, TOK)
    trainer = budget.static_bytes(cfg.update, params)  # an asynchronous run's: its samplers are in its workers
    assert trainer == (16 + 12) * params  # weights, gradients, Adam; the update guard's copy (max_step_kl)
    assert budget.static_bytes(cfg.update, params, sampler) == trainer + copies * params


def test_an_entry_without_a_declaration_is_asked_through_its_sampler(plugins, monkeypatch):
    cfg = Config(plugins=["my_plugin"], sampler="rounded_bf16", temperature=0.5)  # imports the plugin
    import my_plugin

    entry = samplers.SAMPLERS["rounded_bf16"]
    for declared in (entry, dataclasses.replace(entry, traits=None)):
        monkeypatch.setitem(samplers.SAMPLERS.entries, entry.name, declared)
        traits = samplers.sampler_traits(cfg, TOK)
        assert traits.transform is my_plugin.round_bf16 and traits.sampling.temperature == 0.5
        assert traits.kept_bytes(10) == 40 + my_plugin.BUFFER


@pytest.mark.parametrize("options", BUILT_IN)
def test_a_built_in_samplers_traits_are_known_without_building_one(monkeypatch, options):
    from lrl.pipeline.source import AsyncSource

    def refuse(cfg, tok):
        raise AssertionError("a sampler was built to read its traits")

    cfg = Config(**options)
    monkeypatch.setattr(samplers, "make_sampler", refuse)
    entry = samplers.SAMPLERS[cfg.sampler]
    monkeypatch.setitem(samplers.SAMPLERS.entries, entry.name, dataclasses.replace(entry, factory=refuse))
    source = types.SimpleNamespace(cfg=cfg, spec=types.SimpleNamespace(tok=TOK))  # what the method reads
    assert AsyncSource.sampler_traits(source).sampling.temperature == cfg.temperature


def test_the_split_of_an_asynchronous_run_reads_the_declared_traits(tok):
    """The workers (threads here) hold the samplers; the split takes the FP8 rounding and the window from the
    registry entry and the pipeline's bound, and its parts still add up to the total."""
    split = MismatchSplit(every=1, rows=4)
    cfg = quick_cfg(
        pipeline="async",
        rollout_backend="thread",
        rollout_workers=1,
        sampler="fp8",
        max_staleness=1,
        max_steps=3,
    )
    run = build_run(cfg, callbacks=[split], logger=False, policy=make_policy(tok, seed=0))
    fit(run)
    assert split.traits.transform is not None and split.window == 2
    assert run.sampler is None  # no sampler in the trainer's process
    for h in run.module.history:
        assert "mismatch/part/total" in h, h.keys()
        parts = sum(h[f"mismatch/part/{p}"] for p in PARTS)
        assert parts == pytest.approx(h["mismatch/part/total"], abs=1e-5)


@pytest.mark.early
def test_the_split_and_the_memory_plan_of_a_plugin_sampler(smollm2_cut, plugins):
    """A sampler of the Protocol alone, rounding the trainer's weights to bfloat16: the memory plan adds the
    copy and the buffer it declares, and the split puts its mismatch in the quantization part (its declared
    transform), none in staleness; the parts add up to the total."""
    split = MismatchSplit(every=1, rows=4)
    plugin = dict(plugins=["coin_env", "my_plugin"], sampler="rounded_bf16")
    cfg = real_cfg(smollm2_cut, **plugin, tasks_per_step=4, memory_budget=4)  # 16 episodes: a chunked plan
    run = build_run(cfg, logger=False, callbacks=[split])
    import my_plugin

    params = budget.parameter_count(cfg.policy)
    plan = run.module.memory
    assert plan.chunked and params > 0
    assert plan.static == budget.PROCESS_BYTES + 16 * params + 4 * params + my_plugin.BUFFER
    fit(run)
    assert split.traits.transform is my_plugin.round_bf16 and split.traits.decode == "trainer"
    assert split.window == 1  # no staleness declared: only the split steps' own weights are kept
    for h in run.module.history:  # measured: quantization 0.008 and 0.017; staleness 0 and 3e-6 (rescoring)
        assert h["mismatch/part/staleness_abs"] < 1e-5  # sampled with the weights of the step that trains it
        assert h["mismatch/part/quantization_abs"] > 1e-3  # bfloat16 rounding of every weight
        assert h["mismatch/part/engine_abs"] < 1e-6  # the same full forwards on the same rounded weights
        assert h["mismatch/part/explained"] > 0.99
        parts = sum(h[f"mismatch/part/{p}"] for p in PARTS)
        assert parts == pytest.approx(h["mismatch/part/total"], abs=1e-6)


def test_the_split_and_the_budget_ask_the_sampler_not_what_it_is():
    """Neither reads the configured sampler's name, compares anything with a sampler's name or probes a
    sampler's attributes; no class is told by its name in the run or the synchronous source."""
    names = set(samplers.SAMPLERS)
    for path in ("callbacks/mismatch_split.py", "lrl/budget.py"):
        tree = ast.parse((ROOT / path).read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "sampler"], path
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES:
                assert "sampler" not in ast.unparse(node.args[0]), (path, ast.unparse(node))
            if isinstance(node, ast.Compare):
                compared = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                assert not names & compared, (path, ast.unparse(node))
    for path in ("lrl/run.py", "lrl/sources/sync.py"):
        assert "__name__ ==" not in (ROOT / path).read_text(), path
