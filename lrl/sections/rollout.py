"""Where episodes come from: the environment the agent acts in, and the rollout pipeline that plays them (synchronous,
or asynchronous workers beside the trainer); two sections of :class:`lrl.config.Config`."""

from __future__ import annotations

from dataclasses import dataclass

from lrl.options import MAX_INT, option
from lrl.registry import BACKENDS, ENVS, STALENESS

ASYNC = {"pipeline": "async"}  # options of the asynchronous pipeline alone (option(..., when=ASYNC))


@dataclass
class EnvironmentOptions:
    """The environment: which one, its chat framing, its turns, its tools and their failures."""

    env: str = option("tinyagent", "environment (a registered name)", choices=ENVS)
    system_prompt: str | None = option(
        None,
        "a chat model's system message, the first of every episode (none: the environment's own instructions); "
        "refused with a tokenizer without a chat template, and when it holds the template's special tokens",
    )
    observation_role: str = option(
        "user",
        "the chat role of what a tool or the environment answers (user, or a role the model's chat template "
        "renders as its own, such as tool where it has one; any other needs allow_any_role)",
    )
    allow_any_role: bool = option(
        False,
        "accept an observation_role that the model's chat template renders as it would any name (a role the "
        "model was not trained on)",
    )
    max_turns: int = option(3, "turn limit of an episode", gt=0, le=10_000)
    turn_tokens: int | None = option(
        None,
        "the longest reply of one turn in tokens, its end-of-turn token included (none: the environment's own)",
        gt=0,
        le=1_000_000,
    )
    env_failure_rate: float = option(
        0.0, "injected environment-worker failures: probability per turn (0: off)", ge=0, lt=1
    )
    env_failure_hazard: float = option(
        0.0, "injected failures: extra hazard per episode token (long ones fail more)", ge=0
    )
    env_workers: int = option(
        0,
        "environment worker processes per rollout process (0: one per CPU core)",
        ge=0,
        le=4096,
        scope="env",
    )
    env_retries: int = option(
        1,
        "times an infrastructure failure of a tool call is tried again on a fresh worker",
        ge=0,
        le=100,
        scope="env",
    )
    sandbox: str = option(
        "auto",
        "isolation of each tool call: auto (the strongest that works here), namespaces or rlimits",
        choices=("auto", "namespaces", "rlimits"),
        scope="env",
    )
    codefix_tasks: str | None = option(
        None,
        "a folder of code-fixing tasks (docs/sandbox.md); default: the generated ones",
        path=True,
        scope="env",
    )
    test_timeout: float = option(
        1.0,
        "seconds a sandboxed test run may take before it is killed (its verdict: timeout)",
        gt=0,
        le=3600,
        scope="env",
    )
    tool_latency: str = option(
        "none", "delay of every environment step: none, or lognormal:MEDIAN:SIGMA (seconds), seeded"
    )
    tool_timeout: float | None = option(
        None,
        "an environment step that takes longer is an environment failure (seconds; none: no limit)",
        gt=0,
    )


@dataclass
class RolloutOptions:
    """The rollout pipeline: synchronous or asynchronous, its workers, its staleness bound and policy, its engine slots."""

    pipeline: str = option(
        "sync",
        "sync: sample inside the step; async: rollout worker processes beside the trainer",
        choices=("sync", "async"),
    )
    rollout_workers: int = option(
        1, "rollout worker processes (spawned, one torch thread each)", ge=1, le=256, when=ASYNC
    )
    max_staleness: int = option(
        1,
        "no trained token is more than this many versions behind the trainer",
        ge=0,
        le=1000,
        when=ASYNC,
    )
    partial_rollouts: str = option(
        "interrupt",
        "interrupt (switch weights at the next token) or drain (finish on the old ones)",
        choices=("interrupt", "drain"),
        when=ASYNC,
    )
    deterministic: bool = option(
        False, "weights switch on a logical clock, so runs repeat exactly (slower)", when=ASYNC
    )
    switch_tokens: int = option(
        4,
        "decode steps between scheduled weight switches",
        ge=1,
        le=MAX_INT,
        when={**ASYNC, "deterministic": True, "partial_rollouts": "interrupt"},
    )
    worker_timeout: float = option(
        30.0,
        "seconds a rollout worker may go without a heartbeat before it counts as hung",
        gt=0,
        when=ASYNC,
    )
    staleness_drop: bool = option(
        True,
        "drop episodes older than max_staleness when the trainer takes them (false: the throttle alone)",
        when=ASYNC,
    )
    stale_policy: str = option(
        "drop",
        "what happens to work past max_staleness (docs/pipeline.md): drop the episode when the trainer takes it; "
        "mask its over-stale tokens (no gradient) and train the rest; abort it in the worker once it can no "
        "longer be trained within the bound and start its task again; oldest-first: take the finished groups "
        "closest to the bound first (then drop); cut: once the trainer is at the last version a group can be "
        "trained on, send it without its unfinished episodes if at least half of it has finished (then drop); "
        "ordered: take the earliest issued finished groups, waiting up to --take-patience seconds for any group "
        "issued before them (then drop; without a patience nothing is ever past the bound); none: train everything "
        "the throttle let start (as staleness_drop: false); or a policy a plugin registers",
        choices=STALENESS,
        when={**ASYNC, "staleness_drop": True},
    )
    take_patience: float | None = option(
        None,
        "with --stale-policy ordered: seconds the trainer waits for a group issued before those it would take, "
        "once a batch's worth has finished, before it takes them anyway (none: wait for it; 0: never wait)",
        ge=0,
        scope="stale_policy",
        when={**ASYNC, "staleness_drop": True},
    )
    take_patience_steps: float | None = option(
        None,
        "with --stale-policy ordered: the patience in trainer steps instead of seconds: K times the median of the "
        "trainer's last 16 step times (measured from each batch handed to it to its next request; none measured "
        "yet: wait for the earlier group), so the setting carries over between machines and models",
        ge=0,
        scope="stale_policy",
        when={**ASYNC, "staleness_drop": True},
    )
    worker_threads: int = option(
        1,
        "torch CPU threads of each rollout worker that is a process of its own (local or Ray); thread workers "
        "share the trainer's --threads. More than 1 pays where the machine has cores beyond the trainer's",
        gt=0,
        le=1024,
        when=ASYNC,
        resumable=True,
    )
    rollout_backend: str = option(
        "local",
        "where rollout workers run (a registered backend): local processes, threads of this process, or Ray "
        "actors (docs/scaling.md)",
        choices=BACKENDS,
        when=ASYNC,
        resumable=True,
    )
    worker_cpus: float = option(
        1.0,
        "CPUs each rollout actor declares to Ray",
        gt=0,
        le=4096,
        when=ASYNC,
        scope="rollout_backend",
        resumable=True,
    )
    worker_gpus: float = option(
        0.0,
        "GPUs each rollout actor declares to Ray",
        ge=0,
        le=64,
        when=ASYNC,
        scope="rollout_backend",
        resumable=True,
    )
    ray_address: str | None = option(
        None,
        "a running Ray cluster to attach to (HOST:PORT of its head, or auto); none: start one with the run",
        when=ASYNC,
        scope="rollout_backend",
        resumable=True,
    )
    worker_restarts: int = option(
        0,
        "times a rollout actor that dies is replaced (its unfinished groups generated again); 0: the run stops",
        ge=0,
        le=1000,
        when=ASYNC,
        scope="rollout_backend",
        resumable=True,
    )
    slots: int = option(
        0,
        "episodes a rollout engine keeps in flight, decoded together one token per step (continuous "
        "batching); 0: a batch (or a worker's share) in lockstep turns",
        ge=0,
        le=65_536,
    )
