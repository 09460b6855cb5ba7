"""The run configuration: one typed dataclass, the single source of defaults for the CLI, YAML and code.

Every field is a ``--flag`` (underscores become dashes) and a YAML key. Values are validated once, before
anything is built, and every problem raises :class:`ConfigError` naming the key, the value and what is
allowed.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration key or flag with a value that is not allowed."""


def _f(default, help: str, choices: tuple | None = None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class Config:
    # run
    seed: int = _f(0, "seed of every random stream (sampling, shuffling, initialisation)")
    max_steps: int = _f(40, "training steps; one step is one sampled batch and its updates")
    log_dir: str = _f("runs", "TensorBoard log directory; each run gets its own version_N folder")
    run_name: str = _f("lrl", "name of the run's folder under log_dir")
    threads: int = _f(1, "torch CPU threads (1 is fastest for the tiny policy, and robust on a shared machine)")
    progress: bool = _f(True, "show Lightning's progress bar")
    checkpoint_every: int = _f(0, "write <checkpoint_dir>/last.ckpt (atomically) every N steps; 0: no checkpoints")
    checkpoint_dir: str | None = _f(None, "checkpoint folder; default: <log_dir>/<run_name>/checkpoints")
    resume: str | None = _f(None, "continue from this checkpoint; 'last': <checkpoint_dir>/last.ckpt if it exists")
    history_file: str | None = _f(None, "append every step's logged metrics to this JSONL file, flushed each step")
    # policy
    model: str | None = _f(None, "local save_pretrained directory of a causal LM; default: the TinyAgent RL base")
    # processes
    accelerator: str = _f("cpu", "Lightning accelerator", ("cpu", "gpu", "auto"))
    devices: int = _f(1, "processes (CPU) or accelerators per node; the batch is split over all of them")
    num_nodes: int = _f(1, "machines; the world size is devices x num_nodes")
    strategy: str = _f("auto", "Lightning strategy; auto is ddp when the world size is above 1", ("auto", "ddp"))
    # batch
    tasks_per_step: int = _f(8, "distinct train tasks per step")
    episodes_per_task: int = _f(8, "episodes per task per step (the group for advantage normalisation)")
    max_turns: int = _f(3, "turn limit of an episode")
    env_failure_rate: float = _f(0.0, "injected environment-worker failures: probability per turn (0: off)")
    env_failure_hazard: float = _f(0.0, "injected failures: extra hazard per episode token, so long episodes fail more")
    temperature: float = _f(1.0, "sampling and training temperature")
    # update
    lr: float = _f(5e-4, "Adam learning rate")
    minibatches: int = _f(4, "shuffled minibatch updates per sampled batch")
    eps_low: float = _f(0.2, "lower clip of the ratio pi/pi_old (1 - eps_low)")
    eps_high: float = _f(0.28, "upper clip of the ratio pi/pi_old (1 + eps_high)")
    max_grad_norm: float = _f(1.0, "gradient-norm clip")
    # behavior sampler
    sampler: str = _f("onpolicy", "behavior sampler preset", ("onpolicy", "lagged", "fp8", "engine"))
    lag: int = _f(0, "updates the behavior weights lag the trainer (lagged/fp8 samplers)")
    fp8_scale: str = _f("none", "FP8 rounding: plain cast, or per-tensor absmax scaling (fp8 sampler)",
                        ("none", "tensor"))  # fmt: skip
    engine_dtype: str = _f("float32", "dtype of the engine sampler's weight copy (engine sampler)",
                           ("float32", "bfloat16", "float16"))  # fmt: skip
    engine_fp8: bool = _f(False, "round the engine's weights to FP8 at each sync, as --fp8-scale says (engine sampler)")
    top_p: float = _f(1.0, "nucleus sampling: keep the most likely tokens up to this mass (engine sampler; 1: off)")
    top_k: int = _f(0, "sample among the k most likely tokens (engine sampler; 0: off)")
    # correction
    correction: str = _f("none", "behavior-policy correction in the decoupled loss", ("none", "tis", "mis"))
    level: str = _f("token", "ratio the correction acts on", ("token", "sequence", "geometric"))
    cap: float = _f(2.0, "TIS cap C: weights are min(pi_old/mu, C)")
    low: float = _f(0.5, "MIS band lower edge")
    high: float = _f(5.0, "MIS band upper edge")
    veto: float = _f(0.0, "zero the episode if any token has pi_old/mu below this (0: off)")
    # evaluation
    eval_every: int = _f(10, "held-out evaluation every N steps (and at the end)")
    eval_episodes: int = _f(16, "episodes per held-out task in an evaluation")
    # monitoring
    monitor_mismatch: bool = _f(True, "log mismatch/* (raw pi_old/mu statistics) and its histogram every step")
    monitor_staleness: bool = _f(True, "log staleness/* (per token and episode, from the version tags) and histograms")
    monitor_timing: bool = _f(True, "log time/step and each phase's share of it")
    health_check: bool = _f(True, "check at the first step that the same-weights sampler agrees with the trainer")
    health_threshold: float = _f(0.05, "health check: largest allowed step-0 mean |log pi_old - log mu| (nats)")
    health_threshold_p99: float = _f(0.5, "health check: largest allowed step-0 p99 of |log pi_old - log mu| (nats)")
    health_strict: bool = _f(False, "health check: stop the run instead of warning when a threshold is exceeded")
    histogram_every: int = _f(1, "write the TensorBoard histograms every N steps (over the tokens of those steps)")

    def __post_init__(self):
        self.validate()

    def validate(self) -> Config:
        """Check every field's type and range; raise ConfigError on the first problem."""
        for f in fields(self):
            value = getattr(self, f.name)
            _check_type(f.name, value, f.type)
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise ConfigError(f"{f.name}: {value!r} is not allowed; choose one of {', '.join(choices)}")
        positive = ("max_steps", "threads", "tasks_per_step", "episodes_per_task", "max_turns", "minibatches",
                    "eval_every", "eval_episodes", "lr", "temperature", "max_grad_norm", "cap", "low", "high")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not allowed; it must be > 0")
        for name in ("eps_low", "eps_high"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not allowed; it must be in [0, 1)")
        if self.lag < 0:
            raise ConfigError(f"lag: {self.lag} is not allowed; it must be >= 0")
        if self.sampler == "onpolicy" and self.lag != 0:
            raise ConfigError(f"lag: {self.lag} needs a stale sampler; use --sampler lagged (onpolicy is lag 0)")
        if self.fp8_scale != "none" and self.sampler != "fp8" and not self.engine_fp8:
            raise ConfigError(f"fp8_scale: {self.fp8_scale!r} applies to the fp8 sampler only (or to --engine-fp8), not {self.sampler!r}")
        for name, off in (("engine_dtype", "float32"), ("engine_fp8", False), ("top_p", 1.0), ("top_k", 0)):
            if self.sampler != "engine" and getattr(self, name) != off:
                raise ConfigError(f"{name}: {getattr(self, name)!r} applies to the engine sampler only, not {self.sampler!r}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: {self.top_p!r} is not allowed; it must be in (0, 1]")
        if self.top_k < 0:
            raise ConfigError(f"top_k: {self.top_k!r} is not allowed; it must be >= 0 (0 turns it off)")
        if self.low > self.high:
            raise ConfigError(f"low/high: the MIS band [{self.low}, {self.high}] is empty; need low <= high")
        if self.veto < 0 or self.veto >= 1:
            raise ConfigError(f"veto: {self.veto} is not allowed; it must be in [0, 1) (0 turns it off)")
        if self.minibatches > self.tasks_per_step * self.episodes_per_task:
            raise ConfigError(f"minibatches: {self.minibatches} is more than the {self.tasks_per_step * self.episodes_per_task} episodes of a step")
        if self.model is not None and not _exists(self.model):
            raise ConfigError(f"model: {self.model!r} does not exist; give a local save_pretrained directory")
        self._validate_robustness()
        return self

    def _validate_robustness(self) -> None:
        """Ranges of the resume, failure-injection and process keys, and of the seed and thread count."""
        if not 0 <= self.seed < 2**31:
            raise ConfigError(f"seed: {self.seed!r} is not allowed; it must be in [0, 2**31)")
        if self.threads > 1024:
            raise ConfigError(f"threads: {self.threads!r} is not allowed; it must be in [1, 1024]")
        if not 0.01 <= self.temperature <= 100:
            raise ConfigError(f"temperature: {self.temperature!r} is not allowed; it must be in [0.01, 100]")
        if not 0 <= self.env_failure_rate < 1:
            raise ConfigError(f"env_failure_rate: {self.env_failure_rate!r} is not allowed; it must be in [0, 1)")
        if self.env_failure_hazard < 0:
            raise ConfigError(f"env_failure_hazard: {self.env_failure_hazard!r} is not allowed; it must be >= 0")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every: {self.checkpoint_every!r} is not allowed; it must be >= 0 (0: off)")
        for name in ("checkpoint_dir", "history_file", "resume"):
            if getattr(self, name) == "":
                raise ConfigError(f"{name}: an empty path is not allowed; give a path or leave it unset")
        if self.resume is not None and self.resume != "last" and not _exists(self.resume):
            raise ConfigError(f"resume: {self.resume!r} does not exist; give a checkpoint file or 'last'")
        for name in ("devices", "num_nodes"):
            if not 1 <= getattr(self, name) <= 4096:
                raise ConfigError(f"{name}: {getattr(self, name)!r} is not allowed; it must be in [1, 4096]")
        world = self.devices * self.num_nodes
        if self.tasks_per_step % world:
            raise ConfigError(f"tasks_per_step: {self.tasks_per_step} does not split over {world} processes "
                              f"(devices x num_nodes); make it a multiple of {world}")  # fmt: skip

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _exists(path: str) -> bool:
    """Path(path).exists(), False (not an exception) for names the OS cannot even look up."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # an embedded NUL byte, a name too long
        return False


def _check_type(name: str, value, annotation: str) -> None:
    kinds = {"int": int, "float": (int, float), "str": str, "bool": bool, "str | None": (str, type(None))}
    expected = kinds[annotation]
    ok = isinstance(value, expected) and not (annotation in ("int", "float") and isinstance(value, bool))
    if ok and annotation == "float" and not (abs(value) < 1e308 and math.isfinite(value)):
        ok = False
    if not ok:
        raise ConfigError(f"{name}: {value!r} is not allowed; it must be {annotation.replace('str | None', 'a path or null')}")


def _field_types() -> dict[str, str]:
    return {f.name: f.type for f in fields(Config)}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file -> dict; unknown keys and non-mapping files are refused."""
    if not _exists(path):
        raise ConfigError(f"config: {str(path)!r} does not exist")
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config: {path} is not valid YAML ({err})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config: {str(path)!r} cannot be read as a text file ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def from_dict(data: dict[str, Any]) -> Config:
    """Dict of keys -> validated Config; an unknown key is an error that lists the known ones."""
    known = _field_types()
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    return Config(**{k: _as_float(v) if known[k] == "float" else v for k, v in data.items()})


def _as_float(value):
    """An int, or a string such as YAML 1.1's `1e-3`, as a float for a float key; anything else unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return value
    try:
        return float(value)
    except (ValueError, OverflowError):
        return value


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    """argparse over every Config field; defaults are None so that only given flags override the YAML."""
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train TinyAgent (or a local transformers causal LM) with RL from a behavior sampler.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", help="YAML file of keys below; flags override it")
    for f in fields(Config):
        default = f.default if f.default is not MISSING else None
        kind = {"int": int, "float": float, "bool": _parse_bool, "str": str, "str | None": str}[f.type]
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, help=f"{f.metadata['help']} (default: {default})",
                            choices=f.metadata.get("choices"), metavar=f.name.upper())  # fmt: skip
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    """Command line -> Config: defaults, then the --config YAML, then flags."""
    parser = build_parser()
    try:
        args = vars(parser.parse_args(argv))
    except SystemExit as exit_:
        if exit_.code == 0:
            raise
        raise ConfigError("invalid command line; see the message above and --help") from None
    data = load_yaml(args.pop("config")) if "config" in args else {}
    data.update(args)
    return from_dict(data)
