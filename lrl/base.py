"""The RL base agent: a short supervised warm start on generated demonstrations, cached on disk.

Two kinds of demonstration teach the action format and the rule without teaching the agent to read:
- *read-then-answer*: ``read`` (no loss on the action), the source, then the right answer (with loss);
- *decision*: from the prompt alone, ``read`` with probability ``read_prob``, else a uniformly random
  answer.
The result answers well after reading but rarely reads, so a blind guess (20%) is what RL starts from.
Demonstrations are drawn from a generator of their own and never coincide with the 30 evaluation tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from lrl.gym import Task, WordTokenizer, make_tasks, random_task
from lrl.policy import load_policy, make_policy, save_policy
from lrl.rollout import pad_right

DEMO_SEED = 31337


@dataclass(frozen=True)
class BaseConfig:
    """Hyper-parameters of the warm start; part of the cache key."""

    rule_steps: int = 600
    """first phase: optimizer steps on read-then-answer demonstrations only (learns the rule)"""
    steps: int = 150
    """second phase: optimizer steps on the mix below (sets how often the agent reads)"""
    batch_size: int = 64
    """demonstrations per step"""
    lr: float = 3e-3
    """Adam learning rate"""
    read_then_answer: float = 0.5
    """share of read-then-answer demonstrations; the rest are decision demonstrations"""
    read_prob: float = 0.1
    """probability that a decision demonstration reads"""
    seed: int = 0
    """initialisation and demonstration-order seed"""
    threads: int = 2
    """torch threads used while training: float reduction order depends on it, so it is fixed here"""


def _demo(
    task: Task, tok: WordTokenizer, rng: random.Random, cfg: BaseConfig
) -> tuple[list[int], list[bool]]:
    """One demonstration -> token ids and a per-token loss flag."""
    read, answer, eos = tok.id("read"), tok.id("answer"), tok.eos_id
    ids = [tok.bos_id] + tok.encode(task.prompt)
    loss = [False] * len(ids)

    def add(tokens, with_loss):
        ids.extend(tokens)
        loss.extend([with_loss] * len(tokens))

    if rng.random() < cfg.read_then_answer:
        add([read, eos], False)
        add(tok.encode(task.source), False)
        rule_only = cfg.read_then_answer == 1.0  # the first phase trains the answer's line number alone
        add([answer], not rule_only)
        add([tok.id(str(task.answer))], True)
        add([eos], not rule_only)
    elif rng.random() < cfg.read_prob:
        add([read, eos], True)
    else:
        add([answer, tok.id(str(rng.choice(task.candidates))), eos], True)
    return ids, loss


def demonstrations(n: int, tok: WordTokenizer, rng: random.Random, cfg: BaseConfig):
    """`n` demonstrations on generated tasks that are never one of the evaluation tasks."""
    held = {t.lines for t in make_tasks("all")}
    out = []
    while len(out) < n:
        task = random_task(rng)
        if task.lines not in held:
            out.append(_demo(task, tok, rng, cfg))
    return out


def train_base(tok: WordTokenizer, cfg: BaseConfig = BaseConfig(), log_every: int = 0) -> torch.nn.Module:
    """Supervised warm start from scratch -> the RL base policy (deterministic for a given cfg)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_base(tok, cfg, log_every)
    finally:
        torch.set_num_threads(previous)


def _train_base(tok: WordTokenizer, cfg: BaseConfig, log_every: int) -> torch.nn.Module:
    model = make_policy(tok, seed=cfg.seed).train()
    rng = random.Random(DEMO_SEED + cfg.seed)
    adam = torch.optim.Adam(model.parameters(), cfg.lr)
    start = time.time()
    rule_only = replace(cfg, read_then_answer=1.0)
    for step in range(cfg.rule_steps + cfg.steps):
        demos = demonstrations(cfg.batch_size, tok, rng, rule_only if step < cfg.rule_steps else cfg)
        ids, attention = pad_right([d[0] for d in demos], tok.pad_id)  # [B, T]
        loss_mask, _ = pad_right([[float(x) for x in d[1]] for d in demos], 0)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # [B, T-1, V]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        weight = loss_mask[:, 1:].float()
        loss = (nll * weight).sum() / weight.sum()
        adam.zero_grad()
        loss.backward()
        adam.step()
        if log_every and step % log_every == 0:
            print(f"base step {step:4d} | loss {loss.item():.4f} | {time.time() - start:.1f} s", flush=True)
    return model.eval()


def cache_dir() -> Path:
    """Where built bases are kept: $LRL_CACHE, else $XDG_CACHE_HOME/lrl, else ~/.cache/lrl."""
    if os.environ.get("LRL_CACHE"):
        return Path(os.environ["LRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lrl"


def base_key(tok: WordTokenizer, cfg: BaseConfig) -> str:
    """Cache key: the warm-start config, the vocabulary, the model size and the package version."""
    import lrl
    from lrl.policy import DEFAULT_SIZE

    blob = json.dumps([asdict(cfg), tok.vocab, DEFAULT_SIZE, lrl.__version__], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_rl_base(
    tok: WordTokenizer, cfg: BaseConfig = BaseConfig(), cache: bool = True, verbose: bool = False
):
    """The RL base policy, loaded from the cache or trained once and saved there (atomically)."""
    path = cache_dir() / f"base-{base_key(tok, cfg)}"
    if cache and (path / "config.json").exists():
        return load_policy(path, tok)[0]
    if verbose:
        print(f"building the RL base (one time, cached in {path})", flush=True)
    model = train_base(tok, cfg, log_every=100 if verbose else 0)
    if cache:
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        save_policy(model, tok, tmp)
        try:
            tmp.rename(path)
        except OSError:  # another process finished first: keep its copy
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return model
