"""A simulator of the pipeline as lrl runs it (``--pipeline async`` and the synchronous stream with slots).

:func:`lrl_lab.sim.simulate_pipeline` follows the reference rules: one trainer, one pool of slots, and a weight sync
that is a barrier for everyone (the trainer waits for it, and in drain mode for every episode in flight). lrl's
pipeline differs in ways that matter for a prediction of its throughput and staleness, so this module models
it as it is:

- **a weight board**: the trainer publishes a version and goes on with its next step at once; each worker loads
  the newest version on its own, pausing its decoding for ``switch_time``: at once with partial rollouts
  (``interrupt``), or, with ``drain``, only once its episodes in flight have finished, starting none meanwhile;
- **groups**: the trainer takes whole groups (``group_size`` episodes of one task), the oldest finished first;
  a group is finished when its last episode is;
- **issuing**: a batch's groups go out round robin to the workers, as units, while the throttle allows
  (``(v + 1 + max_staleness)`` batches by the time the trainer is at version ``v``) and while a worker holds no
  more than its slots plus one unit. A worker holds an episode from its issue until its *group* has finished
  (the controller hears of a group, not of an episode), so the finished episodes of a group with a straggler
  keep room that the slots could use; the controller issues while the trainer waits for data and when it
  publishes, not during a training step;
- **the consumer-side bound** (``drop``): an episode that started on a version more than ``max_staleness``
  behind the trainer is dropped when its group is taken; a batch with nothing left is taken again. The
  staleness policy (``policy``, lrl's ``--stale-policy``) is the pipeline's own object, built from the registry
  (a plugin's too) and called where the pipeline calls it (:mod:`lrl_lab.sim.policy`); the built-in ones, as the
  simulator plays them: ``drop`` as above; ``mask`` trains such an episode, its tokens older
  than the bound counted as masked; ``oldest-first`` takes the finished groups whose oldest episode started
  earliest, then drops; ``abort`` stops an episode in flight once the worker sees a version that puts it past
  the bound, and starts its task again first in the worker's queue; ``cut``, once a worker sees the last version
  a group can be trained on (``eta`` after the one its oldest episode started on), sends it without its
  unfinished episodes if at least half of it has finished; ``ordered`` takes the earliest issued finished groups
  once no group issued before them is unfinished; once it has waited ``patience`` seconds since a batch's worth
  had finished, it sends every earlier group with at least half finished without its unfinished episodes (as
  ``cut`` does) and takes without the others (then drops). The throttle and a worker's capacity are the
  pipeline's own too (:mod:`lrl.pipeline.policies`);
- **token staleness**: in the duration model, an episode's tokens are spread over its duration, so an episode
  interrupted by weight switches contributes to each version it ran on in proportion to the time it ran on it
  (an approximation: real tokens come in bursts between tool calls); the load model counts the tokens.

Two models of an episode: the **duration model** takes each episode's wall time (consumed in start order, as
the reference simulator does); the **load model** (:mod:`lrl_lab.sim.load`) takes its turns and an engine's step
cost, so that decoding shares the engine and a weight load pauses decoding but not tools. One design at a
time: :func:`simulate_board` checks its arguments and runs :class:`lrl_lab.sim.event.EventModel`, event by event.
"""

from __future__ import annotations

import math

from lrl.pipeline.policies import DEFAULT_POLICY
from lrl_lab.sim.event import EventModel
from lrl_lab.sim.load import EngineCurve, parse_turns
from lrl_lab.sim.policy import make_policy

WAIT_SLICE = 0.1  # lrl.envs.workers.WAIT_SLICE: a rollout worker's longest blocking wait for tool answers


class Steps(float):
    """A patience in trainer steps (lrl's --take-patience-steps), where a plain float is one in seconds."""


def simulate_board(
    durations,
    n_slots: int,
    group_size: int,
    groups_per_batch: int,
    train_time: float,
    switch_time: float,
    max_staleness: int = 1,
    interrupt: bool = True,
    steps: int = 10,
    *,
    workers: int = 1,
    drop: bool = True,
    sync_before: bool = False,
    turns=None,
    engine: EngineCurve | None = None,
    co_run: float = 1.0,
    trace: list | None = None,
    release: str = "group",
    wait_slice: float | None = None,
    policy: str = DEFAULT_POLICY,
    tool_servers: int | None = None,
    patience: float = math.inf,
    patience_steps: float | None = None,
) -> dict:
    """Simulate `steps` training steps of lrl's pipeline -> dict.

    The duration model: ``durations`` are episodes' wall times (seconds, in start order). The load model
    (:mod:`lrl_lab.sim.load`): ``durations=None``, ``turns`` the episodes as turns (``[[tokens, tool s], ...]`` each,
    in start order, reused cyclically) and ``engine`` the engine's step cost; ``co_run`` multiplies the engine's
    step while the trainer trains (its share of the cores). ``train_time`` is the trainer's seconds a step.

    ``n_slots`` is the slots of each of ``workers`` workers. ``sync_before`` models the synchronous stream: the
    trainer publishes, then generates its next batch itself (a bound of 0, no overlap, no issuing lag).
    ``release``: when a worker's held episode stops counting against its capacity: ``"group"`` (when its group
    has finished, as lrl's controller counts) or ``"episode"`` (when it ends: this simulator before it modelled
    that, kept to measure what the rule is worth).
    ``wait_slice`` (the load model, asynchronous designs): a worker whose episodes all wait for tools sees new
    work and new weights only when an answer comes or a wait of this many seconds ends (default
    ``WAIT_SLICE``, lrl's own; 0: at once).
    ``policy``: what the bound does to work past it (lrl's ``--stale-policy``: ``drop``, ``mask``, ``abort``,
    ``oldest-first``, ``cut``, ``ordered``, ``none`` or a plugin's registered name; with ``drop=True``, see the
    module's notes).
    ``patience``: with ``policy="ordered"``, the seconds the trainer waits for an earlier issued group (lrl's
    ``--take-patience``; ``inf``: until it is back); ``patience_steps``, instead, that many of the trainer's steps
    (lrl's ``--take-patience-steps``: ``patience_steps * train_time`` here, where every step takes that long).
    ``tool_servers`` (the load model): each worker's tool calls are served by that many servers, first come first
    served, a turn's tool seconds being its service time (a sandbox pool: lrl's ``--env-workers``); None: all at
    once.
    ``trace``: a list to append ``[time, decoding, tool, in flight, paused in flight]`` (all workers) at every
    event of the load model.
    Keys: ``time``, ``episodes_per_s`` (trained per second), ``step_ends`` (seconds), ``step_trained``
    (episodes each step trained), ``slot_util``,
    ``staleness_mean`` / ``staleness_max`` / ``staleness_hist`` (per token; the duration model spreads an
    episode's tokens evenly over its time; the max is over episodes' oldest tokens), ``episode_staleness_hist``
    (oldest token per trained episode), ``trained``, ``dropped``, ``aborted``, ``trained_duration``,
    ``launched_duration``, ``decoded_tokens``, ``wasted_tokens`` (decoded by dropped or aborted episodes, or
    masked) and ``masked_tokens``: the load model counts tokens; the duration model counts an episode as one
    unit of work spread evenly over its time.
    """
    load = durations is None
    if load:
        if turns is None or engine is None:
            raise ValueError("the load model needs turns and an engine curve (or give durations)")
        episodes = parse_turns(turns)
        durs = None
    else:
        if turns is not None:
            raise ValueError("give durations or turns, not both")
        episodes = None
        durs = [float(d) for d in durations]
        if not durs or any(not math.isfinite(d) or d < 0 for d in durs):
            raise ValueError("durations: need a non-empty list of finite seconds >= 0")
    if patience_steps is not None:
        if not (patience_steps >= 0 and math.isfinite(patience_steps)):
            raise ValueError("patience_steps: trainer steps >= 0")
        patience = patience_steps * train_time
    slice_s = WAIT_SLICE if wait_slice is None else float(wait_slice)
    if slice_s < 0 or not math.isfinite(slice_s):
        raise ValueError("wait_slice: seconds >= 0")
    if sync_before or not load:
        slice_s = 0.0  # the synchronous stream starts its episodes itself; durations have no tool waits
    if release not in ("group", "episode"):
        raise ValueError("release: 'group' or 'episode'")
    if co_run < 1.0 or not math.isfinite(co_run):
        raise ValueError("co_run: a slowdown >= 1")
    make_policy(policy)  # a name not registered is refused here, before anything runs
    return EventModel(
        durs, episodes, n_slots, group_size, groups_per_batch, train_time,
        switch_time, max_staleness, interrupt, steps, workers=workers, drop=drop, sync_before=sync_before,
        engine=engine, co_run=co_run, trace=trace, release=release, slice_s=slice_s, policy=policy,
        tool_servers=tool_servers, patience=patience,
    ).run()  # fmt: skip
