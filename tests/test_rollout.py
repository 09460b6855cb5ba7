import torch

from lrl.gym import make_tasks
from lrl.rollout import collate, run_episodes, trainer_style_decoder


def test_collate_shapes_and_masks(tok, tiny_policy):
    tasks = make_tasks("train")[:6]
    episodes = run_episodes(trainer_style_decoder(tiny_policy, tok.pad_id), tasks, tok, torch.Generator().manual_seed(0),
                            version=7)  # fmt: skip
    batch = collate(episodes, tok.pad_id)
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


def test_rollouts_are_reproducible(tok, tiny_policy):
    tasks = make_tasks("train")[:4]
    dec = trainer_style_decoder(tiny_policy, tok.pad_id)
    a = run_episodes(dec, tasks, tok, torch.Generator().manual_seed(3))
    b = run_episodes(dec, tasks, tok, torch.Generator().manual_seed(3))
    assert [e.ids for e in a] == [e.ids for e in b]
