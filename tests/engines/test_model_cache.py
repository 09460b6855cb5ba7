"""The cache of converted models (lrl/models.py): what a killed conversion leaves is removed by the next run,
whatever kind of conversion it was, and never while another process is still writing it. Every test uses a cache
of its own (LRL_CACHE), never the real one."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import in_process

import lrl.models as models

ROOT = Path(__file__).resolve().parents[2]
# every test here converts the model or finds the wheel's file: skipped without the wheel (conftest)
pytestmark = pytest.mark.smollm2


def dead_pid() -> int:
    """The pid of a process that has ended (its number is free until the system wraps around)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of its own holding a complete (fake) conversion of smollm2-135m; -> its models folder's entry."""
    monkeypatch.setenv("LRL_CACHE", str(tmp_path))
    gguf = models.locate(models.NAMED_MODELS["smollm2-135m"])
    folder = tmp_path / "models" / f"smollm2-135m-{models.file_hash(gguf)}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / models.SOURCE_FILE).write_text("{}")
    return folder


def test_what_a_killed_conversion_of_any_kind_left_is_removed_by_the_next_run(cache):
    pid = dead_pid()
    cut = cache.with_name(f"{cache.name}-layers2.tmp{pid}")  # a cut-down copy killed while it was written
    cut.mkdir()
    (cut / "model.safetensors").write_bytes(b"x" * 1000)
    cache.with_name(f"{cache.name}-layers2.lock").touch()  # its lock, which nobody holds any more
    index = cache.parent / f"hashes.json.tmp{pid}"  # the hash index, killed while it was replaced
    index.write_text("{")
    assert models.resolve_model("smollm2-135m", verbose=False) == cache
    assert not cut.exists() and not index.exists()
    assert models.complete(cache)  # what is complete stays


def test_a_conversion_still_being_written_is_left_alone(cache):
    other = cache.with_name(f"{cache.name}-layers3")
    busy = other.with_name(f"{other.name}.tmp{dead_pid()}")
    busy.mkdir()
    with open(other.with_name(f"{other.name}.lock"), "w") as held:  # another process converting it now
        fcntl.flock(held, fcntl.LOCK_EX)
        models.resolve_model("smollm2-135m", verbose=False)
        assert busy.exists()
        index = cache.parent / f"hashes.json.tmp{os.getpid()}"  # a live writer's
        index.write_text("{")
        models.resolve_model("smollm2-135m", verbose=False)
        assert index.exists()
        index.unlink()
    models.resolve_model("smollm2-135m", verbose=False)
    assert not busy.exists()


@pytest.mark.slow  # the real cut of SmolLM2 killed part-way, then the next run: about a minute on 2 cores
def test_the_cut_down_copy_killed_with_sigkill_leaves_nothing_after_the_next_run(tmp_path):
    real = models.resolve_model("smollm2-135m", verbose=False)  # the real cache's conversion, only read
    own = tmp_path / "models" / real.name
    own.parent.mkdir()
    own.symlink_to(real)  # the full conversion, found in the test's own cache
    env = {**os.environ, "LRL_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "lrl.models", "smollm2-135m", "--layers", "2"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and not list(own.parent.glob("*-layers2.tmp*/*.safetensors")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(own.parent.glob("*-layers2.tmp*")), "the kill came after the copy was complete"
    again = subprocess.run(
        [sys.executable, "-m", "lrl.models", "smollm2-135m"], env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert not list(own.parent.glob("*.tmp*")), sorted(p.name for p in own.parent.iterdir())
    cut = subprocess.run([*command], env=env, capture_output=True, text=True)  # the copy made whole at last
    assert cut.returncode == 0 and "-layers2" in cut.stdout, cut.stderr
    assert "Writing model shards" not in cut.stderr and "%|" not in cut.stderr, cut.stderr  # no library bars


@pytest.mark.parametrize("layers", ["0", "-1", "31"])
def test_a_cut_that_cannot_be_made_leaves_nothing_in_the_cache(tmp_path, monkeypatch, layers):
    real = models.resolve_model("smollm2-135m", verbose=False)  # the real cache's conversion, only read
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / real.name).symlink_to(real)
    monkeypatch.setenv("LRL_CACHE", str(tmp_path))
    listing = lambda: sorted(p.name for p in (tmp_path / "models").iterdir() if p.name != "hashes.json")  # noqa: E731
    before = listing()
    out = in_process(models.main, ["smollm2-135m", "--layers", layers])
    assert out.returncode == 2 and "layers" in out.stderr, out.stderr
    assert listing() == before  # not even a lock file (the hash index is the cache's own)
