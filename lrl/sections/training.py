"""What a step trains on and how: the batch, the behavior sampler that draws it, the correction that weights
its tokens, and the update; four sections of :class:`lrl.config.Config`."""

from __future__ import annotations

from dataclasses import dataclass

from lrl.options import MAX_INT, option
from lrl.registry import AGGREGATIONS, CORRECTIONS, LOSSES, MASKS, PROXIMALS, SAMPLERS

LEVELS = ("token", "sequence", "geometric")  # the ratio a correction acts on (lrl.weights.level_log_ratio)
KL_LEVELS = ("token", "seq_sum", "seq_mean", "seq_max")  # what the kl mask bounds (lrl.masks.divergence)
ESTIMATORS = ("k1", "k2", "k3")  # the kl mask's estimates of KL(mu || pi_old) (lrl.masks.token_divergence)


@dataclass
class BatchOptions:
    """The batch of one step: its tasks, the group of episodes of each, the advantage's penalty."""

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
    advantage_norm: str = option(
        "std",
        "a group's advantages: std (reward minus the group's mean, divided by the group's standard deviation) or "
        "mean (minus the mean only: a group with one success among many is not scaled up)",
        choices=("std", "mean"),
    )
    redraw_flat: int = option(
        0,
        "when a sampled batch has nothing to learn (no group of differing rewards: every advantage 0), sample up to "
        "N more batches in the same step, with the same weights, and train on the first that has something "
        "(dynamic sampling by whole batches); the draws are logged as train/redrawn",
        ge=0,
        le=64,
        when={"pipeline": "sync"},
    )


@dataclass
class UpdateOptions:
    """The update of one step: the clipped loss, Adam, the learning-rate schedule and the KL guards."""

    lr: float = option(1e-3, "Adam learning rate (the peak of the schedule)", gt=0)
    minibatches: int = option(4, "shuffled minibatch updates per sampled batch", gt=0, le=MAX_INT)
    eps_low: float = option(
        0.2, "lower clip of the ratio pi/pi_prox (1 - eps_low; gmpo: e^-eps_low)", ge=0, lt=1, scope="loss"
    )
    eps_high: float = option(
        0.28, "upper clip of the ratio pi/pi_prox (1 + eps_high; gmpo: e^eps_high)", ge=0, lt=1, scope="loss"
    )
    dual_clip: float = option(
        0.0,
        "the clipped loss's dual clip: a negative-advantage token whose ratio pi/pi_prox is above this loses its "
        "gradient (its loss capped at dual_clip * |A|); 0: off, else above 1 + eps_high (verl's clip_ratio_c: 3)",
        ge=0,
        scope="loss",
    )
    tau_pos: float = option(
        1.0, "sapo: the soft gate's temperature where the advantage is positive", gt=0, le=1000, scope="loss"
    )
    tau_neg: float = option(
        1.05, "sapo: the soft gate's temperature where the advantage is negative", gt=0, le=1000, scope="loss"
    )
    aggregation: str = option(
        "token-mean",
        "how the loss's per-token terms make the step's loss (a registered name): token-mean (DAPO: each action "
        "token the same), seq-mean-token-mean (GRPO: each episode the same), seq-mean-token-sum, "
        "seq-mean-token-sum-norm (Dr. GRPO: a constant denominator), bnpo (each rank's token mean)",
        choices=AGGREGATIONS,
    )
    norm_tokens: int = option(
        1024,
        "seq-mean-token-sum-norm: the constant L of its denominator, episodes x L (TRL's max_completion_length)",
        ge=1,
        le=MAX_INT,
        scope="aggregation",
    )
    drop_truncated: bool = option(
        False,
        "leave the episodes the environment marked truncated (out of turns) out of the loss and its denominator "
        "(DAPO's filter of overlong episodes, TRL's mask_truncated_completions); their advantages still count in "
        "their group's",
    )
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
        True,
        "measure KL(pi_old || pi_new) on each step's batch after its updates (one forward)",
        resumable=True,
    )
    monitor_rows: int | None = option(
        8,
        "of a step's rows that do not train (no advantage: the update's forward skips them; every row of a skipped "
        "step), how many, drawn at random, have pi_old scored for the mismatch metrics alone (null: all; 0: none; "
        "all where step_kl measures the step on every row); mismatch/rows_share says on what share of the batch's "
        "rows those metrics stand",
        ge=0,
        le=MAX_INT,
        resumable=True,
    )
    loss: str = option(
        "clipped",
        "the policy loss (a registered name): clipped (the decoupled clipped loss w * min(rho A, clip(rho) A)), pg "
        "(the plain policy gradient: every token's w * A * grad log pi, w detached, no clip), cispo (w * min(rho, "
        "1 + eps_high) * A * grad log pi, the truncated ratio detached), gspo (one clipped ratio an episode), sapo "
        "(a soft gate in place of the clip), gmpo (an episode's geometric mean); rho = pi / pi_prox "
        "(docs/offpolicy.md)",
        choices=LOSSES,
    )
    proximal: str = option(
        "recompute",
        "pi_prox, the policy the loss's ratio rho = pi / pi_prox is taken against: recompute (the trainer's pi_old, "
        "scored before the update), rollout (the sampler's own log-probs mu: no pi_old forward; corrections and "
        "masks then act on the update forward's own log-probs), interpolate (between mu and the update forward's "
        "log-probs, log-linear in the token's version distance: no pi_old forward)",
        choices=PROXIMALS,
    )
    freeze_policy: bool = option(
        False,
        "compute every step as usual but apply no update (learning rate 0): a fixed workload, so that a "
        "comparison of pipelines is not also one between policies that learned differently",
    )


@dataclass
class SamplingOptions:
    """The behavior sampler: which one, the distribution it draws from, and its own settings."""

    sampler: str = option("onpolicy", "behavior sampler (a registered name)", choices=SAMPLERS)
    temperature: float = option(1.0, "sampling and training temperature", ge=0.01, le=100)
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
    top_k: int = option(
        0, "sample among the k most likely tokens (0: off)", ge=0, le=MAX_INT, scope="sampler"
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
    decode: str = option(
        "auto",
        "how the samplers that use the trainer's weights (onpolicy, lagged, fp8) decode: trainer (a full forward "
        "per token, the trainer's own computation), kvcache (a KV cache, one position per step: ~1e-6 nats from "
        "the fp32 trainer), auto (kvcache for models of more than 10M parameters, whose full forwards per token "
        "would cost minutes a step)",
        choices=("auto", "trainer", "kvcache"),
        scope="sampler",
    )


@dataclass
class WeightingOptions:
    """The behavior-policy correction: how each trained token is weighted by pi_old / mu."""

    correction: str = option(
        "none", "behavior-policy correction in the decoupled loss (a registered name)", choices=CORRECTIONS
    )
    level: str = option("token", "ratio the correction acts on", choices=LEVELS)
    cap: float = option(
        2.0, "TIS cap C: weights are min(pi_old/mu, C); also the over-cap threshold monitored", gt=0
    )
    low: float = option(0.5, "MIS band lower edge", gt=0)
    high: float = option(5.0, "MIS band upper edge", gt=0)
    veto: float = option(0.0, "zero the episode if any token has pi_old/mu below this (0: off)", ge=0, lt=1)
    normalize: bool = option(
        False,
        "divide the correction's weights by their batch mean (over action tokens; over episodes at the sequence "
        "and geometric levels), so they average 1",
    )
    masks: list[str] = option(
        [],
        "rejection masks (registered names, all applied): tokens or episodes left out of the loss by a rule on "
        "pi_old and mu (kl: a divergence estimate past kl_threshold; opsm: negative-advantage episodes past "
        "opsm_threshold; m2po: the tokens that push the batch's second moment past m2_threshold)",
        choices=MASKS,
    )
    kl_estimator: str = option(
        "k3",
        "kl mask: the per-token estimate of KL(mu || pi_old) from log r = log pi_old - log mu: k1 = -log r, k2 = "
        "(log r)^2 / 2, k3 = r - 1 - log r",
        choices=ESTIMATORS,
        scope="masks",
    )
    kl_level: str = option(
        "seq_mean",
        "kl mask: token (each token's estimate), or per episode its seq_sum, seq_mean or seq_max",
        choices=KL_LEVELS,
        scope="masks",
    )
    kl_threshold: float = option(
        0.05,
        "kl mask: drop where the estimate is above this (k1, which is signed: where its magnitude is)",
        gt=0,
        scope="masks",
    )
    opsm_threshold: float = option(
        0.5,
        "opsm mask: drop an episode whose advantage is negative and whose mean log(mu / pi_old) is above this",
        gt=0,
        scope="masks",
    )
    m2_threshold: float = option(
        0.04,
        "m2po mask: drop the tokens of largest (log pi_old - log mu)^2 until the rest's mean is at most this",
        gt=0,
        scope="masks",
    )
