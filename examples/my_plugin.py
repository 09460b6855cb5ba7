"""A user's own samplers, correction, rejection mask, environment, metric and staleness policy, outside lrl:
``--plugins my_plugin``.

Each registers itself with lrl when this module is imported; docs/extending.md explains them one by one. A factory
takes what its parameters name: a section of the config (``sampling``, ``environment``, ``monitoring``, ...), one
option (``seed``), what the run hands over (``tok``), or the whole config (``cfg``) where it passes it on.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass

import lightning as L
import torch

import lrl.envs
import lrl.masks
import lrl.weights
from lrl import callbacks, samplers
from lrl.decoding import Sampling, TrainerStyleDecoder
from lrl.envs import EnvSpec, StepResult
from lrl.pipeline.policies import Drop, register_stale_policy
from lrl.policy import make_policy
from lrl.registry import supply
from lrl.rollout import run_episodes
from lrl.tokenizers import WordTokenizer
from lrl.warmstart import fit_demonstrations


# -- a sampler: the weights `lag` updates old, drawing only among the `top_k` most likely tokens ----------
@samplers.register("lagged_topk", uses=("lag", "top_k"))
def lagged_topk(sampling, tok):
    """the weights `lag` updates old, sampled among the top_k most likely tokens (trainer-style decoding)"""
    # sampling: the sampler's section of the config (lrl.sections.SamplingOptions)
    return samplers.BehaviorSampler(tok, sampling.lag, sampling=Sampling(sampling.temperature, top_k=sampling.top_k or 5))


# -- a wrapped built-in sampler: the on-policy one, counting its weight syncs ----------------------------
@samplers.register("onpolicy_counted", uses=samplers.SAMPLERS["onpolicy"].uses)
def onpolicy_counted(cfg, tok):
    """the built-in on-policy sampler, counting the weight syncs it receives in `syncs`"""
    sampler = supply(samplers.SAMPLERS["onpolicy"].factory, cfg, tok=tok)  # the whole config, passed on
    sampler.syncs = 0
    sync = sampler.sync

    def counted_sync(policy, version):
        sampler.syncs += 1
        sync(policy, version)

    sampler.sync = counted_sync
    return sampler


# -- a sampler of the Protocol alone: the trainer's weights rounded to bfloat16, and the traits it declares --
BUFFER = 3 * 2**20  # bytes it keeps whatever the model (where an engine would keep its cache)


@torch.no_grad()
def round_bf16(model):
    """round every weight of `model` to bfloat16 and back, in place"""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).to(p.dtype))


class RoundedSampler:
    """The trainer's weights of the last weight sync, rounded to bfloat16, decoded with full forwards."""

    name = "rounded_bf16"

    def __init__(self, tok, sampling):
        self.tok, self.sampling, self.behavior, self.version = tok, sampling, None, 0

    @property
    def traits(self):  # what the mismatch split and the memory plan read
        return declare_rounded(self.sampling)

    def setup(self, policy, version=0):
        self.behavior = copy.deepcopy(policy).to("cpu").eval()  # its one copy of the weights
        self.sync(policy, version)

    def sync(self, policy, version):
        self.behavior.load_state_dict(policy.state_dict())
        round_bf16(self.behavior)
        self.version = version

    def decoder(self):
        return TrainerStyleDecoder(self.behavior, self.tok.pad_id)

    def sample(self, tasks, generator, spec, **engine):
        return run_episodes(self.decoder(), spec, tasks, generator, self.sampling, self.version, **engine)

    behavior_version = property(lambda self: self.version)
    kept_versions = property(lambda self: [self.version])

    def close(self):
        pass

    def state_dict(self):
        return {"version": self.version}

    def load_state_dict(self, state):
        self.version = state["version"]


def declare_rounded(sampling):
    """no staleness, weights rounded to bfloat16, the trainer's decode path; one fp32 copy and the buffer"""
    return samplers.Traits(sampling, transform=round_bf16, bytes_per_parameter=4, extra_bytes=BUFFER)


@samplers.register("rounded_bf16", traits=lambda sampling: declare_rounded(Sampling(sampling.temperature)))
def rounded_bf16(sampling, tok):
    """the trainer's weights rounded to bfloat16 and back, decoded trainer-style"""
    return RoundedSampler(tok, Sampling(sampling.temperature))


# -- a correction: truncate the ratio on both sides, into [1/cap, cap] -------------------------------------
@lrl.weights.register_correction("tis_both", uses=("cap",))
def tis_both(logp_trainer, logp_sampler, mask, options):
    """importance weights pi_old/mu clamped into [1/cap, cap]: [B, T] -> [B, T], 0 off the mask"""
    gap = logp_trainer.detach() - logp_sampler  # log of the importance ratio, no gradient
    return gap.clamp(-math.log(options.cap), math.log(options.cap)).exp() * mask


# -- a rejection mask: leave out every episode that holds one token far above mu ----------------------------
@lrl.masks.register_mask("spike", uses=("high",), per_row=True)
def spike(logp_trainer, logp_sampler, mask, advantage, options):
    """drop an episode holding a token whose ratio pi_old/mu is above `high`: [B, T] -> keep [B, T] (bool)"""
    over = (logp_trainer - logp_sampler > math.log(options.high)) & mask.bool()  # [B, T]
    return mask.bool() & ~over.any(-1, keepdim=True)


# -- an environment: repeat the word you are shown --------------------------------------------------------
WORDS = ("apple", "river", "stone", "cloud", "ember", "field", "glass", "honey", "ivory", "jewel")


@dataclass(frozen=True)
class EchoTask:
    task_id: int
    word: str


def echo_base(tok):
    """A few seconds of supervised warm start: say a word, the right one half of the time."""
    rng = random.Random(0)

    def draw(step):
        demos = []
        for _ in range(16):
            shown = rng.choice(WORDS)
            said = shown if rng.random() < 0.5 else rng.choice(WORDS)
            prompt = tok.prompt(f"say {shown}")
            demos.append((prompt + tok.encode(said) + [tok.eos_id], [False] * len(prompt) + [True, True]))
        return demos

    return fit_demonstrations(make_policy(tok, seed=0), draw, steps=40, lr=3e-3, pad_id=tok.pad_id)


class EchoEnv:
    """Shows a word; the action must be that word and eos (reward 1), else 0. One turn."""

    def __init__(self, tok):
        self.tok = tok
        self.task = None

    def reset(self, task: EchoTask) -> list[int]:
        self.task = task
        return self.tok.prompt(f"say {task.word}")

    def step(self, action: list[int]) -> StepResult:
        well_formed = bool(action) and action[-1] == self.tok.eos_id
        said = self.tok.decode(action[:-1], skip_special=False) if well_formed else None
        info = {"invalid": said is None, "truncated": False, "metrics": {"said_a_word": float(said in WORDS)}}
        return StepResult([], float(said == self.task.word), True, info)


@lrl.envs.register_env("echo", defaults={"max_turns": 1, "tasks_per_step": 4})
def echo(tok=None) -> EnvSpec:
    """repeat the shown word (one turn; reward 1 for the word itself)"""
    tok = tok if tok is not None else WordTokenizer(["say", *WORDS])
    tasks = [EchoTask(i, w) for i, w in enumerate(WORDS)]
    return EnvSpec(
        name="echo",
        tok=tok,
        make=lambda: EchoEnv(tok),
        train_tasks=tasks[:6],
        heldout_tasks=tasks[6:],
        max_action_tokens=2,
        metrics=("said_a_word",),
        warm_start=lambda: echo_base(tok),
        actions=WORDS,
    )


# -- a metric: the share of episodes whose advantage is not zero (the step's learning signal) -------------
class SignalMonitor(L.Callback):
    """Logs train/with_signal: the share of the step's episodes that carry a non-zero advantage."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = pl_module.last_step
        share = (step.batch["advantage"] != 0).float().mean().item()
        for logger in trainer.loggers:
            logger.log_metrics({"train/with_signal": share}, step=trainer.global_step)
        self.last = share


@callbacks.register("signal")
def signal():
    """train/with_signal: the share of episodes with a non-zero advantage"""
    return SignalMonitor()


# -- a staleness policy: the asynchronous pipeline's take prefers the groups that finished last ------------
@register_stale_policy("newest-first")
class NewestFirst(Drop):
    """take the groups that finished last first (then drop what is past the bound)"""

    def choose(self, schedule):
        ready = schedule.ready  # finished (serial, episodes), in the order they finished
        return list(range(len(ready)))[::-1][: schedule.groups_per_batch]
