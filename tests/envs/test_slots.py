"""Engine slots and environment workers: episodes in flight decoded together while their tools run elsewhere,
tool timeouts and errors as environment failures, and the asynchronous pipeline's guarantees with slots."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch
from conftest import quick_cfg
from helpers import Tokens

from lrl.envs import register_env
from lrl.envs.base import EnvSpec, StepResult
from lrl.envs.latency import Latency, parse_latency
from lrl.envs.tinyagent import BugFixEnv, tinyagent_spec
from lrl.envs.workers import LogicalClock, ThreadTools
from lrl.rollout import run_episodes
from lrl.run import build_run, fit
from lrl.samplers import OnPolicySampler
from lrl.sources.sync import SyncSource


class Uniform:
    """A decoder whose every next token is equally likely (the engine's mechanics, not a model's)."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.calls: list[int] = []

    def decode(self, rows):
        self.calls.append(len(rows))
        return torch.zeros(len(rows), self.vocab)

    def release(self, keys):
        pass

    def reset(self):
        pass


class OneTurn:
    """An environment that ends the episode at its first step, after the drawn tool delay."""

    def reset(self, task):
        return [0]

    def step(self, action):
        return StepResult([], 1.0, True, {})


def one_turn_spec(tok) -> EnvSpec:
    tasks = [type("T", (), {"task_id": i})() for i in range(64)]
    return EnvSpec("one", tok, OneTurn, tasks, tasks, max_action_tokens=1)


def test_n_slots_with_latency_l_finish_n_episodes_in_about_l_not_n_times_l(tok):
    latency, n = 0.5, 8
    spec = one_turn_spec(tok)
    tools = ThreadTools(parse_latency(f"lognormal:{latency}:0"), torch.Generator().manual_seed(0))
    decoder = Uniform(len(tok))
    start = time.perf_counter()
    episodes = run_episodes(
        decoder,
        spec,
        spec.train_tasks[:n],
        torch.Generator().manual_seed(0),
        slots=n,
        lockstep=False,
        tools=tools,
    )
    took = time.perf_counter() - start
    assert len(episodes) == n and all(e.done and e.reward == 1.0 for e in episodes)
    assert all(abs(e.tool_seconds - latency) < 0.25 for e in episodes)
    assert latency <= took < 2.5 * latency, took  # concurrent: about L (serial would be N x L = 4 s)
    assert decoder.calls[0] == n  # the first token of every slot came from one batched decode
    # with a single slot the same episodes take N x L: the tools, not the decoding, set the pace
    tools = ThreadTools(parse_latency(f"lognormal:{latency / 4}:0"), torch.Generator().manual_seed(0))
    start = time.perf_counter()
    run_episodes(
        decoder,
        spec,
        spec.train_tasks[:4],
        torch.Generator().manual_seed(0),
        slots=1,
        lockstep=False,
        tools=tools,
    )
    assert time.perf_counter() - start >= 4 * latency / 4


def test_occupancy_and_turns_account_for_every_slot_second(tok):
    # 8 one-turn episodes on 4 slots, tools of 0.2 s: the slot-seconds split into decoding, ready and tool
    # add up to the slot-seconds in flight; each episode's turn has its action's tokens and its tool's time
    from lrl.rollout import Rollout

    spec = one_turn_spec(tok)
    tools = ThreadTools(parse_latency("lognormal:0.2:0"), torch.Generator().manual_seed(0))
    rollout = Rollout(
        Uniform(len(tok)), spec, (), torch.Generator().manual_seed(0), lockstep=False, tools=tools
    )
    rollout.trace = True
    rollout.step_log = []
    todo, done = list(spec.train_tasks[:8]), []
    while todo or not rollout.done:
        room = rollout.room(4)
        if todo and room:
            rollout.add(todo[:room])
            todo = todo[room:]
        done += rollout.advance()
    parts = rollout.phase_seconds
    assert parts["paused"] == 0.0
    assert sum(parts.values()) == pytest.approx(rollout.slot_seconds, rel=1e-6)
    assert parts["tool"] > 0.7 * rollout.slot_seconds  # the tools, 0.2 s each, dominate tiny decode steps
    timeline = rollout.take_timeline()
    assert timeline and all(dec + ready + tool == flight <= 4 for _, dec, ready, tool, flight, _ in timeline)
    assert rollout.take_timeline() == []
    assert rollout.step_log and all(1 <= b <= 4 and s > 0 for b, s in rollout.step_log)
    for e in done:
        turns = e.turns()
        assert [t[0] for t in turns["turns"]] == [len(a) for a in e.actions] == [1]
        assert turns["turns"][0][1] == pytest.approx(0.2, abs=0.15)
        assert turns["prompt"] == 1  # OneTurn's observation is one token


def test_a_logical_clock_answers_in_order_of_due_time_without_sleeping(tok):
    clock = LogicalClock()
    tools = ThreadTools(Latency("lognormal", 100.0, 1.0), torch.Generator().manual_seed(1), None, clock)
    env = OneTurn()
    delays = []
    for key in range(5):
        delay = tools.latency.draw(torch.Generator().manual_seed(key))
        delays.append(delay)
        tools.submit(key, env, [1], delay=delay)
    start = time.perf_counter()
    order = []
    while tools.pending:
        order += [key for key, _, _ in tools.ready(block=True)]
    assert time.perf_counter() - start < 1.0  # hundreds of logical seconds, no real waiting
    assert order == sorted(range(5), key=lambda k: delays[k])
    assert clock.now() == pytest.approx(max(delays))


class Flaky(BugFixEnv):
    """TinyAgent, except that on the first task's episodes the tool hangs (or raises)."""

    mode = "hang"

    def step(self, action):
        if self.task.task_id == Flaky.bad:
            if Flaky.mode == "hang":
                time.sleep(30)
            else:
                raise OSError("the test runner crashed")
        return super().step(action)


@pytest.mark.parametrize("mode", ["hang", "raise"])
def test_a_tool_that_hangs_or_raises_is_an_environment_failure_with_its_task_carried(
    spec, format_policy, mode
):
    Flaky.mode = mode
    cfg = quick_cfg(tool_timeout=0.5, slots=8, episodes_per_task=2, tasks_per_step=4)
    flaky = dataclasses.replace(spec, make=lambda: Flaky(spec.tok, cfg.max_turns))
    sections = dict(run=cfg.run, batch=cfg.batch, environment=cfg.environment, rollout=cfg.rollout)
    source = SyncSource(OnPolicySampler(spec.tok), flaky, **sections)
    source.setup(copy.deepcopy(format_policy), 0)
    first = source.picker.task(source.picker.choose()[0])  # the task the next batch draws first
    source.generator.set_state(torch.Generator().manual_seed(cfg.seed).get_state())
    Flaky.bad = first.task_id
    start = time.perf_counter()
    batch = source.next_batch()
    assert time.perf_counter() - start < 20  # the hung tools were abandoned at the timeout
    bad = batch["task_id"] == first.task_id
    assert bad.any()
    failed = batch["env_failure"].bool()
    assert torch.equal(failed, bad)  # every episode of the bad task failed in its environment, no other did
    assert (batch["action_mask"][bad] == 0).all() and (batch["advantage"][bad] == 0).all()
    assert (batch["reward"][bad] == 0).all()  # not a score: no gradient and no group statistics
    reason = batch["env_timeout"] if mode == "hang" else batch["env_error"]
    assert torch.equal(reason.bool(), bad)
    assert source.picker.carry == [source.picker.position[first.task_id]]  # drawn first into the next batch
    Flaky.bad = -1
    following = source.next_batch()
    assert int(following["task_id"][0]) == first.task_id


def test_timeouts_and_errors_are_logged_apart_from_agent_failures(format_policy):
    Flaky.mode, Flaky.bad = "raise", 0

    @register_env("flaky_for_test", uses=("max_turns",))
    def flaky(cfg, tok=None):
        spec = tinyagent_spec(tok, cfg.max_turns)
        Flaky.bad = spec.train_tasks[0].task_id
        return dataclasses.replace(spec, make=lambda: Flaky(spec.tok, cfg.max_turns), warm_start=None)

    cfg = quick_cfg(
        env="flaky_for_test", tool_timeout=5.0, max_steps=3, tasks_per_step=20, episodes_per_task=2
    )
    run = build_run(cfg, logger=False, callbacks=[], policy=copy.deepcopy(format_policy))
    fit(run)
    first = run.module.history[0]
    assert first["env/errors"] == pytest.approx(2 / 40) and first["env/timeouts"] == 0.0
    assert first["env/failures"] == pytest.approx(2 / 40)


S = pytest.mark.slow  # 12-14 s each: one in the default run


@pytest.mark.parametrize(
    "eta, slots, partial",
    [
        pytest.param(1, 4, "interrupt", marks=S),
        pytest.param(2, 16, "drain", marks=S),
        (0, 8, "interrupt"),
        pytest.param(1, 32, "drain", marks=S),
    ],
)
@pytest.mark.early
def test_no_trained_token_is_staler_than_the_bound_with_slots(format_policy, eta, slots, partial):
    tokens = Tokens()
    cfg = quick_cfg(
        pipeline="async",
        max_steps=5,
        max_staleness=eta,
        slots=slots,
        partial_rollouts=partial,
        tool_latency="lognormal:0.02:1.0",
        eval_at_start=False,
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    assert tokens.staleness and max(tokens.staleness) <= eta
    trained = [i for h in run.module.history for i in h["trained_ids"]]
    assert len(trained) == len(set(trained))
    history = run.module.history
    assert all(0 <= h["pipeline/slot_util"] <= 1.0 + 1e-6 for h in history)
    assert all(h["pipeline/tool_wait"] > 0 for h in history)  # the episodes did wait for their tools


def without_timing(history: list[dict]) -> list[dict]:
    timing = ("time/", "pipeline/")
    return [{k: v for k, v in h.items() if not k.startswith(timing)} for h in history]


# 18 s; by default the deterministic equality with slots and tool waits is checked by the kill test of
# tests/pipeline/test_async_reliability.py (a killed and resumed run equal to an uninterrupted one)
@pytest.mark.slow
def test_deterministic_async_with_slots_and_tool_latency_repeats_exactly(format_policy, tmp_path):
    cfg = quick_cfg(
        pipeline="async",
        deterministic=True,
        max_steps=4,
        max_staleness=1,
        slots=6,
        rollout_workers=2,
        tool_latency="lognormal:0.5:1.0",
        eval_at_start=False,
    )
    runs = []
    for k in range(2):
        run = build_run(
            cfg.replace(log_dir=str(tmp_path / str(k))),
            callbacks=[],
            logger=False,
            policy=copy.deepcopy(format_policy),
        )
        fit(run)
        runs.append(without_timing(run.module.history))
    assert runs[0] == runs[1] and len(runs[0]) == 4
    assert max(h["staleness/token_max"] for h in runs[0]) >= 1  # concurrent and stale, yet repeatable
