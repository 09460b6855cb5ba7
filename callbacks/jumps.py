"""JumpMonitor: warns when one step moves the policy far more than recent steps, or malformed actions jump."""

from __future__ import annotations

import statistics

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from callbacks._common import log_scalars, log_step, published, tensorboard

ZERO_LEVEL = 1e-12  # a median below this is reported as 0, without a ratio
WATCHED = {"train/step_kl": "KL(pi_old || pi_new) of the step", "train/invalid": "malformed-action rate"}


class JumpMonitor(L.Callback):
    """Flags sudden policy jumps from the step's metrics: ``train/step_kl`` (the KL between the policy before and
    after all of a step's updates, measured on its batch) and ``train/invalid``.

    A value jumps when it exceeds ``factor`` times the median of the previous ``window`` steps and is above
    its floor (``kl_floor`` for the KL, ``invalid_floor`` for the malformed-action rate). Each event warns once,
    on the console and as a TensorBoard text under ``monitor/jumps``, however many steps it lasts; the scalars
    ``monitor/jump_step_kl`` and ``monitor/jump_invalid`` are 1 on the steps of an event, 0 otherwise. A jump
    warns; it does not stop the run (see docs/stability.md for what to do about one).
    """

    def __init__(
        self, factor: float = 5.0, window: int = 10, kl_floor: float = 0.05, invalid_floor: float = 0.1
    ):
        super().__init__()
        if not factor > 1 or window < 1 or kl_floor < 0 or invalid_floor < 0:
            raise ValueError("need factor > 1, window >= 1 and floors >= 0")
        self.factor, self.window = factor, window
        self.floors = {"train/step_kl": kl_floor, "train/invalid": invalid_floor}
        self.recent: dict[str, list[float]] = {k: [] for k in WATCHED}
        self.active: dict[str, bool] = {k: False for k in WATCHED}
        self.events: list[dict] = []
        self.last: dict[str, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        record = published(pl_module, "JumpMonitor")
        if record is None:
            return
        flags = {}
        for key, what in WATCHED.items():
            value = record.metrics.get(key)
            if value is None:
                continue
            recent = self.recent[key]
            level = statistics.median(recent) if recent else None
            jump = level is not None and value > self.floors[key] and value > self.factor * level
            if jump and not self.active[key]:
                self._warn(trainer, record.version, key, what, value, level)
            self.active[key] = jump
            flags[f"monitor/jump_{key.split('/')[1]}"] = float(jump)
            if not jump:  # the recent level is that of ordinary steps
                recent.append(value)
                del recent[: -self.window]
        self.last = flags
        log_scalars(trainer, pl_module, flags)

    def describe(self, version: int, key: str, what: str, value: float, level: float) -> str:
        """The warning's text: the value, and its ratio to the recent median (no ratio to a median of 0)."""
        over = f"over the previous {len(self.recent.get(key, ()))} steps"
        if level < ZERO_LEVEL:  # a ratio to 0 is a meaningless huge number
            jumped = f"jumped to {value:.4g} from its median 0 {over}"
        else:
            jumped = f"jumped to {value:.4g}, {value / level:.1f}x its median {level:.4g} {over}"
        return (
            f"JumpMonitor: at step {version} the {what} ({key}) {jumped}. A single destructive update is the usual "
            f"cause; see docs/stability.md."
        )

    def _warn(self, trainer, version: int, key: str, what: str, value: float, level: float) -> None:
        message = self.describe(version, key, what, value, level)
        self.events.append({"step": version, "key": key, "value": value, "level": level})
        rank_zero_warn(message)
        writer = tensorboard(trainer)
        if writer is not None:
            writer.add_text("monitor/jumps", message, log_step(trainer))

    def state_dict(self) -> dict:
        return {"recent": self.recent, "active": self.active, "events": self.events}

    def load_state_dict(self, state: dict) -> None:
        self.recent, self.active, self.events = state["recent"], state["active"], state["events"]
