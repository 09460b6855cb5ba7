"""Supervised warm starts on demonstrations, and the on-disk cache of the policies they build.

An environment that ships an RL base (TinyAgent: ``lrl.envs.tinyagent.base``) declares it as a :class:`WarmStart`:
how it draws a step's demonstrations, each a token list and a per-token loss flag, and its hyper-parameters;
:func:`fit_demonstrations` trains a fresh policy on them, and the result is kept in :func:`cache_dir` under a key of
everything that determines it, written atomically.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from lrl.batch import pad_right
from lrl.policy import DEFAULT_SIZE, load_policy, make_policy, save_policy

Demo = tuple[list[int], list[bool]]  # token ids and a loss flag per token


def cache_dir() -> Path:
    """Where built bases are kept: $LRL_CACHE, else $XDG_CACHE_HOME/lrl, else ~/.cache/lrl."""
    if os.environ.get("LRL_CACHE"):
        return Path(os.environ["LRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lrl"


def source_fingerprint(*objects) -> str:
    """A hash of the source code of modules or functions, for cache keys: a change to the code that draws the
    demonstrations or trains on them changes the key, so a cached or shipped policy is never stale."""
    import inspect

    return hashlib.sha256("".join(inspect.getsource(o) for o in objects).encode()).hexdigest()[:16]


def tokenizer_fingerprint(tok) -> list:
    """What identifies a tokenizer's ids, for cache keys: the word list, or the transformers vocabulary."""
    if hasattr(tok, "vocab") and isinstance(tok.vocab, list):
        return tok.vocab
    hf = tok.hf
    return sorted(hf.get_vocab().items()) + [getattr(hf, "chat_template", None) or ""]


@contextmanager
def fixed_threads(n: int):
    """Run the block on exactly `n` torch threads: float reduction order depends on the thread count, so a
    cached policy must not depend on the run's own --threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def fit_demonstrations(
    model: torch.nn.Module,
    draw: Callable[[int], list[Demo]],
    steps: int,
    lr: float,
    pad_id: int,
    log_every: int = 0,
) -> torch.nn.Module:
    """Adam on the flagged tokens' cross-entropy, `steps` batches of `draw(step)` -> the model in eval mode."""
    model.train()
    adam = torch.optim.Adam(model.parameters(), lr)
    start = time.time()
    for step in range(steps):
        demos = draw(step)
        ids, attention = pad_right([d[0] for d in demos], pad_id)  # [B, T]
        loss_mask, _ = pad_right([[float(x) for x in d[1]] for d in demos], 0)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # [B, T-1, V]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        weight = loss_mask[:, 1:].float()
        loss = (nll * weight).sum() / weight.sum()
        adam.zero_grad()
        loss.backward()
        adam.step()
        if log_every and step % log_every == 0:
            print(
                f"warm start step {step:4d} | loss {loss.item():.4f} | {time.time() - start:.1f} s",
                flush=True,
            )
    return model.eval()


SHIPPED = Path(__file__).parent / "shipped"  # warm starts that ship with the package, one folder per key


def cached_policy(
    name: str,
    tok,
    build: Callable[[], torch.nn.Module],
    cache: bool = True,
    verbose: bool = False,
    cache_root: Path | None = None,
    shipped: Path = SHIPPED,
) -> torch.nn.Module:
    """The policy cached as `name` in `cache_root` (cache_dir()), else the copy shipped under the same name in
    `shipped` (the package's), else `build()` once and save it in the cache atomically. `name` holds the key of
    everything that determines the policy, so a shipped copy is used only for exactly the warm start that made it."""
    path = (cache_root if cache_root is not None else cache_dir()) / name
    if cache and (path / "config.json").exists():
        return load_policy(path, tok)[0]
    if cache and (shipped / name / "config.json").exists():
        return load_policy(shipped / name, tok)[0]
    if not cache:
        return build()

    def announced() -> torch.nn.Module:
        if verbose:
            print(f"building the RL base (one time, cached in {path})", flush=True)
        return build()

    return saved_once(path, tok, announced)


def saved_once(path: Path, tok, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The policy saved at `path`, else `build()` saved there atomically, under a lock beside it: processes that ask
    at once (runs started together on an empty cache) build it once, and the others wait and load it."""
    with folder_lock(path):
        if (path / "config.json").exists():
            return load_policy(path, tok)[0]
        model = build()
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        save_policy(model, tok, tmp)
        try:
            tmp.rename(path)
        except OSError:  # a folder of that name appeared meanwhile (a process that took no lock): keep it
            shutil.rmtree(tmp, ignore_errors=True)
    return model


@contextmanager
def folder_lock(folder: Path):
    """An exclusive lock beside `folder` (``<folder>.lock``): one process writes the folder, the others wait."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class WarmStartOptions:
    """A warm start's hyper-parameters, every one part of its cache key; an environment's add their own."""

    rule_steps: int = 600
    """first phase: optimizer steps on the demonstrations that teach the rule"""
    steps: int = 150
    """second phase: optimizer steps on the demonstrations the RL base is left with"""
    batch_size: int = 64
    """demonstrations per step"""
    lr: float = 3e-3
    """Adam learning rate"""
    seed: int = 0
    """initialisation and demonstration-order seed"""
    threads: int = 2
    """torch threads used while training: float reduction order depends on it, so it is fixed here"""


@dataclass(frozen=True)
class WarmStart:
    """An environment's RL base: a fresh policy trained on the demonstrations the environment draws, cached (or
    shipped) under a key of everything that determines it, so the same warm start is trained once.

    ``options`` are its default hyper-parameters (:class:`WarmStartOptions`, with the environment's own), all of
    them in the key. ``draw(tok, rng, options, step)`` gives a step's demonstrations (the first phase's while
    ``step < options.rule_steps``) from the generator ``rng``, seeded with ``seed + options.seed``. ``code``: the modules whose source draws them (in the key); ``extra``: anything else
    that determines the policy (in the key); ``size``: the policy's size beyond the default (``make_policy``'s).
    """

    name: str  # the cache folder's prefix
    options: WarmStartOptions
    draw: Callable[..., list[Demo]]
    seed: int
    code: tuple[ModuleType, ...] = ()
    extra: tuple = ()
    size: dict = field(default_factory=dict)
    log_every: int = 100  # training steps between two printed losses, when verbose

    def train(self, tok, options: WarmStartOptions | None = None, log_every: int = 0) -> torch.nn.Module:
        """The warm start from scratch -> the RL base (deterministic for given options)."""
        options = options if options is not None else self.options
        rng = random.Random(self.seed + options.seed)
        with fixed_threads(options.threads):
            model = make_policy(tok, seed=options.seed, **self.size)
            return fit_demonstrations(
                model, lambda step: self.draw(tok, rng, options, step), options.rule_steps + options.steps,
                options.lr, tok.pad_id, log_every,
            )  # fmt: skip

    def key(self, tok, options=None) -> str:
        """The cache key: the options, the vocabulary, the model's size, what else the warm start names, and the
        code that draws the demonstrations and trains on them."""
        options = options if options is not None else self.options
        code = source_fingerprint(*self.code, WarmStart.train, fit_demonstrations, make_policy)
        blob = [self.name, asdict(options), tokenizer_fingerprint(tok), DEFAULT_SIZE, self.size, self.extra, code]
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]

    def folder(self, tok, options=None) -> str:
        """The name of its folder in the cache (and in the package, where it is shipped)."""
        return f"{self.name}-{self.key(tok, options)}"

    def policy(self, tok, options=None, cache: bool = True, verbose: bool = False) -> torch.nn.Module:
        """The RL base, loaded from the cache (or the package) or trained once and saved in the cache."""
        build = lambda: self.train(tok, options, self.log_every if verbose else 0)  # noqa: E731
        return cached_policy(self.folder(tok, options), tok, build, cache, verbose)
