"""Lightning Trainer runs on CPU: the update learns, on-policy is on-policy, same seed gives the same run."""

import copy

import lightning as L
import pytest
import torch
from conftest import quick_cfg

from lrl.run import build_run, fit


def train(policy, **kw):
    run = build_run(quick_cfg(**kw), logger=False, policy=copy.deepcopy(policy))
    before = [p.detach().clone() for p in run.policy.parameters()]
    fit(run)
    return run, before


def test_trainer_run_is_finite_and_changes_parameters(format_policy):
    run, before = train(format_policy, max_steps=3)
    assert len(run.module.history) == 3
    assert run.trainer.global_step == 3 == run.module.version  # one global step per sampled batch
    for h in run.module.history:
        assert torch.isfinite(torch.tensor(h["train/loss"]))
    changed = [not torch.equal(a, b) for a, b in zip(before, run.policy.parameters())]
    assert all(changed)


def test_a_frozen_policy_computes_every_step_and_moves_no_weight(format_policy):
    run, before = train(format_policy, max_steps=2, freeze_policy=True)
    assert len(run.module.history) == 2
    for h in run.module.history:
        assert h["train/lr"] == 0.0 and torch.isfinite(torch.tensor(h["train/loss"]))
        assert h["train/grad_norm"] > 0  # the gradients were computed as usual
    assert all(torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))


def test_fit_reports_its_steps_and_the_final_evaluation(format_policy):
    """fit's record: the steps taken, and the held-out evaluation of the final policy, the module's last one."""
    run = build_run(quick_cfg(max_steps=2), logger=False, policy=copy.deepcopy(format_policy))
    result = fit(run)
    last = run.module.evals[-1]
    assert result.steps == 2 and result.stopped_by is None and result.evaluated_at == 2 == last["step"]
    assert (result.pass_rate, result.invalid, result.episodes) == (
        last["pass_rate"],
        last["invalid"],
        last["episodes"],
    )
    assert result.episodes > 0 and result.metrics == {m: last[m] for m in run.spec.metrics}
    assert set(result.metrics) == set(run.spec.metrics) != set()
    with pytest.raises(AttributeError):
        result.steps = 3  # a record, not a dict to fill in


def test_a_runs_fields_are_what_their_annotations_say(format_policy, tmp_path):
    import typing

    import lrl.data
    import lrl.envs.base
    import lrl.module
    import lrl.run
    import lrl.runs
    import lrl.sources.base

    names = {**vars(lrl.run)}
    for module in (lrl.data, lrl.envs.base, lrl.module, lrl.runs, lrl.sources.base):
        names.update(vars(module))
    hints = typing.get_type_hints(lrl.run.Run, globalns=names)
    assert object not in hints.values()
    cfg = quick_cfg(max_steps=1, checkpoint_every=1, log_dir=str(tmp_path))
    run = build_run(cfg, logger=False, policy=copy.deepcopy(format_policy))
    try:
        for name, hint in hints.items():
            value = getattr(run, name)
            if hint is lrl.sources.base.RolloutSource:  # a Protocol: the source has each of its methods
                missing = [
                    m for m in vars(hint) if not m.startswith("_") and not callable(getattr(value, m, None))
                ]
                assert not missing, missing
            else:
                assert isinstance(value, hint), (name, value, hint)
        assert run.folder is not None  # checkpoints kept in the run's folder: the optional field is set too
    finally:
        run.folder.release()


class Recorder(L.Callback):
    """Keeps every trained batch with the trainer's version and recomputed old_logp."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps.append((module.last_step.version, module.last_step.batch, module.last_step.old_logp))


def test_onpolicy_staleness_is_zero_and_logps_agree(format_policy):
    rec = Recorder()
    run = build_run(
        quick_cfg(max_steps=4), logger=False, policy=copy.deepcopy(format_policy), callbacks=[rec]
    )
    fit(run)
    assert [v for v, _, _ in rec.steps] == [0, 1, 2, 3]
    for version, batch, old_logp in rec.steps:
        on = batch["action_mask"].bool()
        assert (batch["version"][on] == version).all()  # sampled by the weights the step trains
        gap = (batch["sample_logp"] - old_logp)[on].abs().max().item()
        assert gap < 1e-5, gap


def test_same_seed_same_run(format_policy):
    a, _ = train(format_policy, seed=5)
    b, _ = train(format_policy, seed=5)
    c, _ = train(format_policy, seed=6)
    key = ["train/reward", "train/loss"]
    assert [[h[k] for k in key] for h in a.module.history] == [[h[k] for k in key] for h in b.module.history]
    assert [h["train/loss"] for h in a.module.history] != [h["train/loss"] for h in c.module.history]


@pytest.mark.slow
def test_default_run_reaches_heldout_target():
    """The README's main job: 40 on-policy steps from the RL base reach >= 0.8 held-out with reads."""
    from lrl.config import Config

    run = build_run(Config(progress=False, log_dir="/tmp/lrl-test-runs"), logger=False)
    result = fit(run)
    assert result.pass_rate >= 0.8 and result.metrics["reads"] >= 0.8 and result.episodes >= 160


def test_dropout_is_off_for_old_logp_and_the_update(tmp_path, tok, monkeypatch):
    """A loaded model with dropout (gpt2's 0.1) must score old_logp and take its first minibatch without it:
    old_logp equals the (eval-mode) sampler's log-probs at step 0, and the first ratio pi/pi_old is exactly 1."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import lrl.module
    import lrl.sources.base
    from lrl.policy import save_policy

    gpt = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tok),
            n_positions=256,
            n_embd=32,
            n_layer=2,
            n_head=2,
            resid_pdrop=0.1,
            embd_pdrop=0.1,
            attn_pdrop=0.1,
        )
    )
    save_policy(gpt, tok, tmp_path / "gpt")
    first = []

    def recording(logp, old_logp, token_adv, mask):
        terms, stats = real(logp, old_logp, token_adv, mask)
        if not first:
            first.append((((logp - old_logp) * mask).abs().max().item(), stats["approx_kl"].item()))
        return terms, stats

    # an untrained model earns no reward: give every episode an advantage so that the update runs
    monkeypatch.setattr(
        lrl.sources.base, "group_advantages", lambda reward, group, valid, **_: torch.linspace(-1, 1, len(reward))
    )
    run = build_run(quick_cfg(model=str(tmp_path / "gpt"), max_steps=2), logger=False, callbacks=[])
    real, run.module.objective.loss = run.module.objective.loss, recording  # the run's loss, as the objective built it
    fit(run)
    assert run.module.history[0]["mismatch/abs_mean"] < 1e-6
    assert first[0][0] < 1e-6 and abs(first[0][1]) < 1e-9
