import torch
from conftest import rollout

from lrl.batch import collate
from lrl.envs.tinyagent import make_tasks


def test_collate_shapes_and_masks(tok, tiny_policy, spec):
    tasks = make_tasks("train")[:6]
    episodes = rollout(tiny_policy, tasks, spec, seed=0, version=7)
    batch = collate(episodes, tok.pad_id, ("reads",))
    B, T = batch["ids"].shape
    assert B == 6 and T == max(len(e.ids) for e in episodes)
    for key in ("action_mask", "sample_logp", "version"):
        assert batch[key].shape == (B, T - 1)
    for row, ep in enumerate(episodes):
        n = len(ep.ids)
        assert batch["attention_mask"][row].sum() == n
        assert (batch["ids"][row, n:] == tok.pad_id).all()
        gen = torch.tensor(ep.generated[1:], dtype=torch.float32)
        assert torch.equal(batch["action_mask"][row, : n - 1], gen)
        assert batch["action_mask"][row, n - 1 :].sum() == 0
        on = batch["action_mask"][row].bool()
        assert (batch["version"][row][on] == 7).all() and (batch["version"][row][~on] == -1).all()
        assert (batch["sample_logp"][row][on] <= 0).all() and (batch["sample_logp"][row][~on] == 0).all()
        assert not ep.generated[0]  # the prompt is never an action
    assert batch["reward"].shape == (B,) and batch["task_id"].tolist() == [t.task_id for t in tasks]
    assert batch["env_metrics"]["reads"].tolist() == [e.metrics.get("reads", 0.0) for e in episodes]


def test_rollouts_are_reproducible(tiny_policy, spec):
    tasks = make_tasks("train")[:4]
    a = rollout(tiny_policy, tasks, spec, seed=3)
    b = rollout(tiny_policy, tasks, spec, seed=3)
    assert [e.ids for e in a] == [e.ids for e in b]
