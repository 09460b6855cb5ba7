"""The structure the rollout side promises: no import circle through lrl.run, a trainer that never reaches into
where its batches come from, a worker process that imports nothing before its parent-death signal, and staleness
policies that the simulator and the config can import without the pipeline's weight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_pipeline_does_not_import_the_run_builder():
    modules = imported_by(
        "import lrl.pipeline, lrl.pipeline.source, lrl.pipeline.worker, lrl.pipeline.schedule, lrl.sources"
    )
    assert "lrl.run" not in modules
    assert "lrl.pipeline.source" in modules  # the check looked at what it meant to


def test_the_spawn_entry_imports_nothing_heavy():
    modules = imported_by("import lrl.pipeline.backends.spawn")
    assert not {"torch", "transformers", "lightning", "numpy"} & modules, sorted(modules)


def test_the_staleness_policies_import_nothing_heavy():
    modules = imported_by("import lrl.pipeline.policies")
    assert "lrl.pipeline.policies" in modules
    assert not {"torch", "numpy", "lrl.pipeline.schedule", "lrl.pipeline.source", "lrl.config"} & modules


def test_the_controller_asks_its_schedule_and_policy_not_what_they_are():
    for path in ("lrl/pipeline/source.py", "lrl/pipeline/schedule.py", "lrl/pipeline/worker/free.py"):
        text = (ROOT / path).read_text()
        assert "hasattr(" not in text and "stale_policy ==" not in text, path


def test_the_module_never_touches_the_pipeline_or_the_stream():
    text = (ROOT / "lrl" / "module.py").read_text()
    for needle in ("stream.pipeline", "datamodule.stream", "lrl.pipeline", "AsyncSource", "datamodule."):
        assert needle not in text, needle


def test_the_datamodule_only_forwards_to_its_source():
    text = (ROOT / "lrl" / "data.py").read_text()
    assert "lrl.pipeline" not in text and "sampler" not in text
