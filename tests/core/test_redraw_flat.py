"""--redraw-flat N: a batch with nothing to learn is drawn again, and the batch trained is one of the stream's."""

import pytest
import torch
from conftest import quick_cfg

from lrl.errors import ConfigError
from lrl.run import build_run, fit
from lrl.samplers import OnPolicySampler
from lrl.sources.sync import SyncSource


def source(spec, policy, **kw):
    cfg = quick_cfg(tasks_per_step=1, episodes_per_task=2, paired_streams=True, **kw)
    sections = dict(run=cfg.run, batch=cfg.batch, environment=cfg.environment, rollout=cfg.rollout)
    s = SyncSource(OnPolicySampler(spec.tok), spec, **sections)
    s.setup(policy, 0)
    return s


def has_signal(batch) -> bool:
    return bool((batch["advantage"] != 0).any())


def test_a_flat_batch_is_drawn_again_and_the_trained_one_is_the_streams_next_with_signal(spec, format_policy):
    """Against a source that never redraws, on the same paired streams: the batches the redrawing source set
    aside are the plain stream's flat batches, and the one it returns is the plain stream's first with signal."""
    redrawing, plain = source(spec, format_policy, redraw_flat=6), source(spec, format_policy)
    seen_redraw = 0
    for _ in range(6):
        batch = redrawing.next_batch()
        n = int(batch["redrawn"])
        skipped = [plain.next_batch() for _ in range(n)]
        assert all(not has_signal(b) for b in skipped)
        mine = plain.next_batch()
        assert torch.equal(mine["ids"], batch["ids"]) and torch.equal(mine["reward"], batch["reward"])
        assert has_signal(batch) or n == 6
        assert redrawing.produced == plain.produced
        seen_redraw += n
    assert seen_redraw > 0, "no flat batch in six steps: the test no longer exercises a redraw"


def test_redraws_stop_at_the_bound(spec, tiny_policy):
    """An untrained policy solves nothing: every batch is flat, and N redraws make N + 1 batches a step."""
    s = source(spec, tiny_policy, redraw_flat=3)
    batch = s.next_batch()
    assert not has_signal(batch) and int(batch["redrawn"]) == 3 and s.produced == 4
    plain = source(spec, tiny_policy)
    assert "redrawn" not in plain.next_batch() and plain.produced == 1


def test_a_run_logs_its_redraws(tmp_path):
    run = build_run(quick_cfg(redraw_flat=2, log_dir=str(tmp_path)), logger=False)
    fit(run)
    redrawn = [h["train/redrawn"] for h in run.module.history]
    assert len(redrawn) == 3 and all(r in (0.0, 1.0, 2.0) for r in redrawn)


def test_redraws_belong_to_the_synchronous_pipeline():
    with pytest.raises(ConfigError, match="redraw_flat.*pipeline: async"):
        quick_cfg(redraw_flat=2, pipeline="async")


def test_an_entrys_default_for_a_mode_option_applies_in_that_mode_only():
    """An entry's default for redraw_flat (an option of the synchronous pipeline) would be taken with the
    synchronous pipeline only (lrl.arguments.from_dict asks _in_mode); with the asynchronous one setting it is
    refused."""
    from lrl.arguments import _in_mode, from_dict

    assert _in_mode("redraw_flat", {}) and _in_mode("redraw_flat", {"pipeline": "sync"})
    assert not _in_mode("redraw_flat", {"pipeline": "async"})
    assert _in_mode("lr", {"pipeline": "async"})  # an option of no mode applies in every one
    with pytest.raises(ConfigError, match="redraw_flat"):
        from_dict({"env": "calc", "pipeline": "async", "redraw_flat": 2})
