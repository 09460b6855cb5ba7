"""What a checkpoint keeps of the trainer module (lrl.module.OffPolicyModule) beyond Lightning's own state, and how
a resumed run puts it back (lrl.checkpoint says what a whole checkpoint holds and how it is written)."""

from __future__ import annotations

import random

import torch

from lrl.distributed import Ranks


def module_state(module) -> dict:
    """What a checkpoint keeps of an ``OffPolicyModule`` beyond Lightning's own: its version counter, skipped-batch
    count, shuffle generator, history, the source's kept weight versions, every rank's torch and Python RNG states,
    its config, run folder and fp16 loss scale."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    return {
        "version": module.version,
        "skipped": module.skipped,
        "shuffle": module.shuffle.get_state(),
        "history": list(module.history),
        "weights": module.source.weights_state(),
        "rng": Ranks.of(module).gather_objects(rng),
        "config": module.cfg.to_dict(),
        "run_dir": module.run_dir,
        "loss_scale": module.loss_scale.scale,
    }


def restore_module_state(module, checkpoint: dict) -> None:
    """Put :func:`module_state` back (the source's weights are applied in ``on_fit_start``, by its setup); a finished
    run resumed with a larger ``max_steps`` continues."""
    state = checkpoint["lrl"]
    module.version = state["version"]
    module.skipped = state["skipped"]
    module.shuffle.set_state(state["shuffle"])
    module.history = list(state["history"])
    module.loss_scale.scale = state.get("loss_scale", module.loss_scale.scale)  # older checkpoints have none
    module.source.load_weights_state(state["weights"])
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
    if progress.get("is_last_batch") and checkpoint.get("global_step", 0) < module.cfg.run.max_steps:
        progress["is_last_batch"] = False
    rng = state["rng"][module.global_rank if module._trainer is not None else 0]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
