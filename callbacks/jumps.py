"""JumpMonitor: warns when one step moves the policy far more than recent steps, or malformed actions jump.

The two signals are of different kinds, so each has its own test (docs/stability.md, "The jump monitor"):

- ``train/step_kl`` is a continuous measurement: it jumps when it is above ``factor`` times its median over the
  recent steps and above ``kl_floor``.
- ``train/invalid`` is a count, k malformed episodes of the step's n: at a true rate of 0.04, a 64-episode
  batch shows 0.11 or more on about one step in seventy, so a ratio to a median of such counts is mostly noise.
  It jumps when k is improbable under the recent rate, the pooled rate of the recent steps, by a one-sided
  binomial test at level ``alpha``, and k / n is above ``invalid_floor``.

Neither fires before ``min_history`` ordinary steps have set the recent level, and a step that the update
guard took back (``train/reverted``) is not a movement of the policy: the KL test skips it.

The floors come from healthy runs: over the default run's seeds 0-9 (every one ending at 0.938 held-out or
above) no step kept by the guard had a step KL above 0.264 and no step had a malformed rate above 0.469 (the
rate rises for a few steps while the policy learns to read), while a destructive step moves the KL to 2.5-8.5
and the malformed rate to 1 (docs/stability.md). So the floors sit above what learning does and far below
what a destructive step does.
"""

from __future__ import annotations

import math
import statistics

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from lrl.callbacks._common import log_scalars, log_step, published, tensorboard

ZERO_LEVEL = 1e-12  # a median below this is reported as 0, without a ratio
KL, INVALID = "train/step_kl", "train/invalid"
WATCHED = {KL: "KL(pi_old || pi_new) of the step", INVALID: "malformed-action rate"}


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): ints and a rate in [0, 1] -> a probability."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0 or p >= 1.0:
        return float(p >= 1.0)
    terms = (math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
    return min(1.0, math.fsum(terms))


def pooled_rate(counts: list[tuple[int, int]]) -> float:
    """The rate of (k, n) counts pooled over steps, (sum k + 1) / (sum n + 2): never exactly 0 or 1, so that
    a first malformed episode after a clean stretch is improbable, not impossible."""
    k = sum(c[0] for c in counts)
    n = sum(c[1] for c in counts)
    return (k + 1) / (n + 2)


class JumpMonitor(L.Callback):
    """Flags sudden policy jumps from the step's metrics: ``train/step_kl`` (the KL between the policy before and
    after all of a step's updates, measured on its batch) and ``train/invalid`` (see the module docstring for
    the two tests).

    Each event warns once, on the console and as a TensorBoard text under ``monitor/jumps``, however many steps
    it lasts; the scalars ``monitor/jump_step_kl`` and ``monitor/jump_invalid`` are 1 on the steps of an event,
    0 otherwise. A jump warns; it does not stop the run (see docs/stability.md for what to do about one).
    """

    def __init__(
        self,
        factor: float = 5.0,
        window: int = 10,
        kl_floor: float = 0.5,
        invalid_floor: float = 0.6,
        min_history: int = 5,
        alpha: float = 1e-4,
    ):
        super().__init__()
        if not factor > 1 or window < 1 or kl_floor < 0 or invalid_floor < 0:
            raise ValueError("need factor > 1, window >= 1 and floors >= 0")
        if not 1 <= min_history <= window or not 0 < alpha < 1:
            raise ValueError("need 1 <= min_history <= window and 0 < alpha < 1")
        self.factor, self.window, self.min_history, self.alpha = factor, window, min_history, alpha
        self.floors = {KL: kl_floor, INVALID: invalid_floor}
        self.kl_recent: list[float] = []  # step_kl of the recent ordinary steps
        self.invalid_recent: list[tuple[int, int]] = []  # (malformed, episodes) of the recent ordinary steps
        self.active: dict[str, bool] = {k: False for k in WATCHED}
        self.events: list[dict] = []
        self.last: dict[str, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = published(pl_module, "JumpMonitor")
        if record is None:
            return
        flags = {}
        kl = record.metrics.get(KL)
        if kl is not None and not record.metrics.get("train/reverted", 0.0):
            level = statistics.median(self.kl_recent) if self.kl_recent else 0.0
            jump = self._kl_jump(kl, level)
            self._event(trainer, record.version, KL, jump, kl, level)
            flags["monitor/jump_step_kl"] = float(jump)
            if not jump:  # the recent level is that of ordinary steps
                self.kl_recent = (self.kl_recent + [kl])[-self.window :]
        invalid = record.metrics.get(INVALID)
        if invalid is not None:
            n = episodes(record.batch, trainer)
            counts = (round(invalid * n), n)
            rate = pooled_rate(self.invalid_recent)
            tail = binomial_tail(*counts, rate)
            jump = self._invalid_jump(*counts, tail)
            detail = f" ({counts[0]} of {n} episodes, binomial tail {tail:.1g})"
            self._event(trainer, record.version, INVALID, jump, invalid, rate, detail)
            flags["monitor/jump_invalid"] = float(jump)
            if not jump:
                self.invalid_recent = (self.invalid_recent + [counts])[-self.window :]
        self.last = flags
        log_scalars(trainer, pl_module, flags)

    def _kl_jump(self, value: float, level: float) -> bool:
        """Above the floor and above factor x the recent median, once the median rests on min_history steps."""
        if len(self.kl_recent) < self.min_history:
            return False
        return value > self.floors[KL] and value > self.factor * level

    def _invalid_jump(self, k: int, n: int, tail: float) -> bool:
        """k of n malformed is above the floor and improbable (its binomial tail at the recent pooled rate is
        below alpha)."""
        if len(self.invalid_recent) < self.min_history or n == 0:
            return False
        return k / n > self.floors[INVALID] and tail < self.alpha

    def _event(self, trainer, version, key, jump, value, level, detail="") -> None:
        if jump and not self.active[key]:
            self._warn(trainer, version, key, WATCHED[key], value, level, detail)
        self.active[key] = jump

    def describe(
        self, version: int, key: str, what: str, value: float, level: float, detail: str = ""
    ) -> str:
        """The warning's text: the value, and its ratio to the recent level (no ratio to a level of 0)."""
        recent = self.kl_recent if key == KL else self.invalid_recent
        kind = "median" if key == KL else "rate"
        over = f"over the previous {len(recent)} steps"
        if level < ZERO_LEVEL:  # a ratio to 0 is a meaningless huge number
            jumped = f"jumped to {value:.4g}{detail} from its {kind} 0 {over}"
        else:
            jumped = f"jumped to {value:.4g}{detail}, {value / level:.1f}x its {kind} {level:.4g} {over}"
        return (
            f"JumpMonitor: at step {version} the {what} ({key}) {jumped}. A single destructive update is the usual "
            f"cause; see docs/stability.md."
        )

    def _warn(self, trainer, version, key, what, value, level, detail) -> None:
        message = self.describe(version, key, what, value, level, detail)
        self.events.append({"step": version, "key": key, "value": value, "level": level})
        rank_zero_warn(message)
        writer = tensorboard(trainer)
        if writer is not None:
            writer.add_text("monitor/jumps", message, log_step(trainer))

    def state_dict(self) -> dict:
        return {
            "kl_recent": self.kl_recent,
            "invalid_recent": [list(c) for c in self.invalid_recent],
            "active": self.active,
            "events": self.events,
        }

    def load_state_dict(self, state: dict) -> None:
        self.kl_recent = list(state["kl_recent"])
        self.invalid_recent = [tuple(c) for c in state["invalid_recent"]]
        self.active, self.events = state["active"], state["events"]


def episodes(batch, trainer) -> int:
    """Episodes of the step over all processes, env failures left out (they have no malformed-action flag)."""
    valid = int((1.0 - batch["env_failure"]).sum().item()) if "env_failure" in batch else len(batch["reward"])
    return valid * max(int(getattr(trainer, "world_size", 1) or 1), 1)
