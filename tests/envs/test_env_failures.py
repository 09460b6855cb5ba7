"""Injected environment-worker failures (docs/robustness.md): no gradient, no score, task kept, logged apart."""

import copy
import math

import lightning as L
import pytest
import torch
from conftest import quick_cfg

from lrl.envs import FailureInjection
from lrl.envs.tinyagent import BugFixEnv, make_tasks
from lrl.logprobs import token_log_probs
from lrl.losses import clipped_policy_loss, group_advantages
from lrl.policy import selected_log_probs
from lrl.run import build_run, fit
from lrl.samplers import OnPolicySampler
from lrl.sources.sync import SyncSource

READ, ANSWER = ["read", "<eos>"], ["answer", "3", "<eos>"]


def failure_rate(tok, action, rate, hazard, n=4000):
    """Share of first turns that fail, over n episodes taking `action` first."""
    gen = torch.Generator().manual_seed(0)
    env, task, fails = FailureInjection(BugFixEnv(tok, 3), rate, hazard, gen), make_tasks("train")[0], 0
    for _ in range(n):
        prompt = env.reset(task)
        result = env.step([tok.id(w) for w in action])
        fails += result.info.get("env_failure", False)
    return fails / n, len(prompt)


def test_env_fails_at_the_injected_rate_and_long_turns_fail_more(tok):
    got, _ = failure_rate(tok, ANSWER, 0.1, 0.0)
    assert abs(got - 0.1) < 4 * math.sqrt(0.1 * 0.9 / 4000)
    hazard = 0.005
    read, prompt_len = failure_rate(tok, READ, 0.0, hazard)
    answer, _ = failure_rate(tok, ANSWER, 0.0, hazard)
    source_len = len(tok.encode(make_tasks("train")[0].source))
    for got, n in ((read, prompt_len + 2 + source_len), (answer, prompt_len + 3)):
        want = 1 - math.exp(-hazard * n)
        assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / 4000), (got, want)
    assert read > answer  # the read turn returns the source: more tokens, more failures


def test_failed_step_ends_the_episode_without_a_score(tok):
    env = FailureInjection(BugFixEnv(tok, 3), 0.999999, 0.0, torch.Generator().manual_seed(0))
    env.reset(make_tasks("train")[0])
    result = env.step([tok.id(w) for w in ANSWER])
    assert result.done and result.info["env_failure"] and env.failed
    assert not result.info["invalid"] and not result.info["truncated"]  # not an agent failure
    with pytest.raises(ValueError, match="failure rate"):
        FailureInjection(BugFixEnv(tok, 3), 1.0, 0.0, torch.Generator())
    with pytest.raises(ValueError, match="Generator"):
        FailureInjection(BugFixEnv(tok, 3), 0.1)


def stream(spec, policy, **kw):
    cfg = quick_cfg(**kw)
    source = SyncSource(OnPolicySampler(spec.tok), spec, cfg)
    source.setup(policy, 0)
    return source


def test_no_injection_draws_nothing_and_changes_nothing(spec, format_policy):
    s = stream(spec, format_policy)
    before = s.env_generator.get_state()
    batch = s.next_batch()
    assert torch.equal(s.env_generator.get_state(), before)
    assert batch["env_failure"].sum() == 0 and not s.picker.carry


def test_failed_episodes_get_no_gradient_and_no_advantage_and_their_tasks_come_back(tok, spec, format_policy):
    s = stream(spec, format_policy, env_failure_rate=0.3, tasks_per_step=8, episodes_per_task=6)
    batch = s.next_batch()
    failed = batch["env_failure"].bool()
    assert 0 < failed.sum() < len(failed)
    assert (batch["action_mask"][failed] == 0).all() and (batch["advantage"][failed] == 0).all()
    valid = ~failed
    assert torch.equal(batch["advantage"], group_advantages(batch["reward"], batch["task_id"], valid.float()))
    # the loss gradient is exactly the gradient of the batch with the failed episodes removed
    policy = copy.deepcopy(format_policy)

    def grads(rows):
        policy.zero_grad()
        ids, attn, mask = batch["ids"][rows], batch["attention_mask"][rows], batch["action_mask"][rows]
        with torch.no_grad():
            old = token_log_probs(policy, ids, attn)
        logp = selected_log_probs(policy(input_ids=ids, attention_mask=attn).logits[:, :-1], ids[:, 1:])
        loss, _ = clipped_policy_loss(logp, old, batch["advantage"][rows][:, None].expand_as(mask), mask)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters()])

    everything, survivors = grads(torch.arange(len(failed))), grads(valid.nonzero().squeeze(1))
    assert torch.allclose(everything, survivors, rtol=1e-5, atol=1e-7) and everything.abs().sum() > 0
    # the failed tasks are drawn first into the next batch
    failed_tasks = list(dict.fromkeys(batch["task_id"][failed].tolist()))
    nxt = s.next_batch()
    first = list(dict.fromkeys(nxt["task_id"].tolist()))
    assert first[: len(failed_tasks)] == failed_tasks[: s.picker.per_step]


class Batches(L.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rows.append((module.last_step.batch, module.history[-1]))


@pytest.mark.parametrize("sampler", ["onpolicy", "engine"])
def test_training_with_failures_logs_them_apart_at_the_injected_rate(format_policy, sampler):
    rate, rec = 0.05, Batches()
    cfg = quick_cfg(
        max_steps=6,
        tasks_per_step=8,
        episodes_per_task=8,
        minibatches=2,
        env_failure_rate=rate,
        sampler=sampler,
    )
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy), callbacks=[rec])
    fit(run)
    fails = turns = 0.0
    for batch, logged in rec.rows:
        failed = batch["env_failure"].bool()
        assert (batch["action_mask"][failed] == 0).all() and (batch["advantage"][failed] == 0).all()
        assert logged["train/reward"] == pytest.approx(
            batch["reward"][~failed].mean().item()
        )  # not scored as 0
        assert logged["env/failures"] == pytest.approx(failed.float().mean().item())
        assert logged["train/invalid"] == pytest.approx(
            batch["invalid"][~failed].mean().item()
        )  # agent failures
        if failed.any():
            assert logged["env/failed_length"] == pytest.approx(batch["length"][failed].mean().item())
        fails += failed.sum().item()
        turns += batch["env_turns"].sum().item()
    se = math.sqrt(rate * (1 - rate) / turns)
    assert fails > 0 and abs(fails / turns - rate) < 4 * se, (fails, turns)
    total = sum(h["env/turn_failures"] * h["env/turns"] for _, h in rec.rows) / sum(
        h["env/turns"] for _, h in rec.rows
    )
    assert total == pytest.approx(fails / turns)


@pytest.mark.slow
def test_default_run_with_failures_reaches_heldout_target():
    """The acceptance run: python train.py --env-failure-rate 0.05 (40 steps from the RL base) >= 0.8 held-out."""
    from lrl.config import Config

    run = build_run(Config(progress=False, log_dir="/tmp/lrl-test-runs", env_failure_rate=0.05), logger=False)
    result = fit(run)
    assert result.pass_rate >= 0.8
    assert sum(h["env/failures"] for h in run.module.history) > 0
