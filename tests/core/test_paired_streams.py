"""Paired streams: runs of one seed that differ in what they train with see the same problems in the same order,
and each token's uniform depends on its episode and place alone (common random numbers for paired comparisons)."""

import copy

import pytest
import torch
from conftest import quick_cfg

from lrl.config import ConfigError
from lrl.envs.tinyagent import make_tasks, tinyagent_spec
from lrl.kvcache import KVCacheDecoder
from lrl.policy import make_policy
from lrl.rollout import run_episodes
from lrl.run import build_run, fit
from lrl.streams import KeyedDraws, keyed


def test_a_keyed_number_depends_on_its_key_alone_and_its_uniforms_spread_over_the_unit_interval():
    assert keyed(7, 1, 2, 3) == keyed(7, 1, 2, 3)
    assert len({keyed(7, 1, 2, k) for k in range(1000)} | {keyed(8, 1, 2, 3), keyed(7, 2, 1, 3)}) == 1002
    u = torch.tensor(KeyedDraws(5, 0).uniforms([(e, t, p) for e in range(20) for t in range(5) for p in range(100)]))
    assert ((u >= 0) & (u < 1)).all()
    # the share below each tenth is a binomial count of 10,000 draws at 0.1 each: within 5 standard deviations
    for q in range(1, 10):
        assert abs((u < q / 10).double().mean().item() - q / 10) < 5 * (q / 10 * (1 - q / 10) / len(u)) ** 0.5
    assert KeyedDraws(5, 0).uniforms([(0, 0, 0)]) != KeyedDraws(5, 1).uniforms([(0, 0, 0)])  # another batch


def test_an_episodes_tokens_do_not_depend_on_the_other_episodes_of_its_batch(tok):
    """With keyed draws, episode 0 of [a, b] and of [a, c] is the same episode: its uniforms are its own."""
    spec = tinyagent_spec(tok)
    model = make_policy(tok, seed=0).eval()
    tasks = make_tasks("train")
    out = []
    for other in (tasks[1], tasks[2]):
        episodes = run_episodes(
            KVCacheDecoder(model, tok.pad_id), spec, [tasks[0], other], torch.Generator().manual_seed(0),
            draws=KeyedDraws(3, 0),
        )  # fmt: skip
        out.append(episodes)
    assert out[0][0].ids == out[1][0].ids
    assert out[0][1].ids != out[1][1].ids  # another task: another episode
    # drawn in order, the first episode's draws would depend on the other rows (one stream for the whole batch)
    plain = [
        run_episodes(KVCacheDecoder(model, tok.pad_id), spec, [tasks[0], other], torch.Generator().manual_seed(0))
        for other in (tasks[1], tasks[2])
    ]
    assert plain[0][0].ids != out[0][0].ids or plain[1][0].ids != out[1][0].ids


class Tasks:
    """Every trained batch's task ids."""

    def __init__(self):
        import lightning as L

        outer = self

        class Record(L.Callback):
            def on_train_batch_end(self, trainer, module, *a, **kw):
                outer.ids.append(module.last_step.batch["task_id"].tolist())

        self.ids: list[list[int]] = []
        self.callback = Record()


@pytest.mark.parametrize("paired", [True, False])
def test_paired_runs_of_one_seed_train_on_the_same_problems_in_the_same_order(format_policy, paired):
    """A frozen run and a learning run of one seed: with paired streams their batches hold the same tasks at every
    step; drawn from one stream in order (the default), the tasks part ways once the episodes differ."""
    seen = []
    for frozen in (True, False):
        record = Tasks()
        cfg = quick_cfg(max_steps=6, lr=3e-3, freeze_policy=frozen, paired_streams=paired, eval_at_start=False)
        run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy), callbacks=[record.callback])
        fit(run)
        seen.append(record.ids)
    if paired:
        assert seen[0] == seen[1]
    else:
        assert seen[0] != seen[1]


def test_paired_streams_are_refused_with_the_asynchronous_pipeline():
    with pytest.raises(ConfigError, match="paired_streams"):
        quick_cfg(pipeline="async", paired_streams=True)
