"""Lightning DDP on CPU (gloo): 2 processes x 3 steps against the same global batch in one process."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lrl.policy import save_policy

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def pad_cat(parts: list[torch.Tensor], fill) -> torch.Tensor:
    """Concatenate [b, T_i] tensors along the batch, right-padding each to the widest T with `fill`."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts])


def global_batch(shards: list[dict], pad_id: int) -> dict:
    """The ranks' local batches as the one batch a single process would train on (rank 0's rows first)."""
    fills = {"ids": pad_id, "attention_mask": 0, "action_mask": 0.0, "sample_logp": 0.0, "version": -1}
    out = {}
    for key, value in shards[0].items():
        if key in fills:
            out[key] = pad_cat([s[key] for s in shards], fills[key])
        elif key == "env_metrics":
            out[key] = {k: torch.cat([s[key][k] for s in shards]) for k in value}
        elif value.dim() == 1:
            out[key] = torch.cat([s[key] for s in shards])
        else:
            out[key] = value  # scalars: index, sample_time
    return out


class Ready:
    """A batch that is already sampled, in the form the module pulls batches (lrl.data.Deferred)."""

    def __init__(self, batch):
        self.batch = batch

    def get(self, version=0):
        return self.batch


class Replay(L.LightningDataModule):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def train_dataloader(self):
        return DataLoader([Ready(b) for b in self.batches], batch_size=None)


class Weights(L.Callback):
    def __init__(self):
        self.after_step = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after_step.append(torch.cat([p.detach().flatten() for p in module.policy.parameters()]))


@pytest.mark.slow  # 41 s on 2 cores: out of the default run (pytest -m slow)
def test_ddp_two_ranks_match_each_other_and_one_process(tmp_path, tok, format_policy):
    save_policy(format_policy, tok, tmp_path / "policy")
    out = tmp_path / "ddp"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "ddp_worker.py"), str(out), str(tmp_path / "policy"), str(STEPS), "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dumps = [
        [torch.load(out / f"rank{r}-step{k}.pt", weights_only=False) for k in range(STEPS)] for r in (0, 1)
    ]
    logged = [row for row in json.loads((out / "logged-rank0.json").read_text()) if "train/reward" in row]
    assert len(logged) == STEPS

    for k in range(STEPS):
        a, b = dumps[0][k], dumps[1][k]
        assert torch.equal(
            a["weights"], b["weights"]
        )  # DDP: every rank holds the same weights after the step
        assert not torch.equal(
            a["batch"]["task_id"], b["batch"]["task_id"]
        )  # ... trained on different episodes
        rewards = torch.cat([a["batch"]["reward"], b["batch"]["reward"]])
        assert abs(logged[k]["train/reward"] - rewards.mean().item()) < 1e-6  # the mean over both ranks
        same = [{k: v for k, v in d["history"].items() if k != "time/end"} for d in (a, b)]  # own clocks
        assert same[0] == same[1]  # every rank reduces to the same logged values

    # the same global batches in one process: the same weights, up to floating-point summation order
    from conftest import quick_cfg

    from lrl.run import build_run

    batches = [global_batch([dumps[0][k]["batch"], dumps[1][k]["batch"]], tok.pad_id) for k in range(STEPS)]
    weights = Weights()
    run = build_run(
        quick_cfg(max_steps=STEPS, threads=1),
        logger=False,
        callbacks=[weights],
        policy=copy.deepcopy(format_policy),
        limit_val_batches=0,
    )
    run.trainer.fit(run.module, Replay(batches))
    for k in range(STEPS):
        gap = (weights.after_step[k] - dumps[0][k]["weights"]).abs().max().item()
        assert gap < 1e-5, (k, gap)
        for key in ("train/reward", "train/loss", "train/clip_frac", "staleness/token_mean"):
            assert abs(run.module.history[k][key] - dumps[0][k]["history"][key]) < 1e-5, (k, key)
