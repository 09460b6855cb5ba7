"""The monitoring callbacks: pure statistics, logged TensorBoard values against a hand computation, the
staleness histogram of a lagged run, the step-0 health check, and the config switches."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import HISTOGRAMS, SCALARS, EventAccumulator

from lrl import samplers
from lrl import stats as S
from lrl.arguments import from_dict, load_yaml
from lrl.callbacks import (
    EnvironmentMonitor,
    HealthCheck,
    HealthCheckError,
    JumpMonitor,
    MismatchMonitor,
    StalenessMonitor,
    TimingMonitor,
    build_callbacks,
)
from lrl.config import Config, ConfigError
from lrl.decoding import Sampling
from lrl.run import build_run
from lrl.samplers import OnPolicySampler

ROOT = Path(__file__).resolve().parents[2]
BINS = ("p000_010", "p010_050", "p050_090", "p090_100")
MISMATCH_TAGS = [
    f"mismatch/{k}"
    for k in (
        "abs_mean",
        "abs_max",
        "abs_median",
        "abs_p99",
        "seq_abs_sum_max",
        "kl_k1",
        "kl_k3",
        "over_cap",
        "below_band",
        "above_band",
        "ess_raw",
        "ess_weighted",
        "tokens",
        "abs_mean_run",
        *[f"abs_mean_{b}" for b in BINS],
        *[f"share_{b}" for b in BINS],
        "step0_abs_mean",
        "step0_abs_p99",
        "step0_abs_max",
    )
]
STALENESS_TAGS = [
    f"staleness/{k}"
    for k in (
        "token_mean",
        "token_max",
        "episode_mean",
        "episode_max",
        "token_mean_run",
        "length_trained",
        "length_sampled",
    )
]
TIME_TAGS = [
    "time/step",
    "time/step_mean",
    "time/share_sample",
    "time/share_old_logp",
    "time/share_update",
    "time/share_shift",
    "time/share_sync",
    "time/share_other",
]
HISTOGRAM_TAGS = ["mismatch/log_ratio", "staleness/token", "staleness/episode"]


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    yield


def tiny(**kw) -> Config:
    """A fast config: 4 episodes per step, one minibatch, no logging to disk unless asked."""
    base = dict(
        max_steps=1,
        tasks_per_step=2,
        episodes_per_task=2,
        minibatches=1,
        eval_every=1000,
        eval_episodes=1,
        progress=False,
    )
    return Config(**{**base, **kw})


class HotSampler(OnPolicySampler):
    """A deliberately wrong sampler: the trainer's weights, decoded at temperature 2 (the trainer uses 1)."""

    def __init__(self, tok):
        super().__init__(tok, Sampling(temperature=2.0))


# -- pure statistics ---------------------------------------------------------------------------------


def test_mismatch_stats_on_more_tokens_than_torch_quantile_takes():
    n = 2**24 + 5  # torch.quantile refuses inputs this large; the shared quantile sorts a bounded subsample
    log_ratio = torch.arange(n, dtype=torch.float32) / n
    with pytest.raises(RuntimeError):
        torch.quantile(log_ratio, 0.99)
    stats = S.mismatch_stats(log_ratio, torch.zeros(n), log_ratio[:1])
    assert stats["tokens"] == n
    assert stats["abs_median"] == pytest.approx(0.5, abs=2e-3)
    assert stats["abs_p99"] == pytest.approx(0.99, abs=2e-3)
    assert stats["abs_max"] == pytest.approx(1.0, abs=1e-6)


def test_ess_and_kl_estimates():
    w = torch.tensor([1.0, 1.0, 0.0, 2.0])
    assert S.ess(w).item() == pytest.approx(16 / (4 * 6))
    assert S.ess(torch.zeros(3)).item() == 0.0
    log_w = torch.tensor([800.0, 800.0])  # exp() overflows; the log-space ESS does not
    assert S.ess_from_log_weights(log_w).item() == pytest.approx(1.0)
    lr = torch.tensor([0.3, -0.2])
    assert S.ess_from_log_weights(lr).item() == pytest.approx(S.ess(lr.exp()).item(), rel=1e-6)
    assert S.kl_k1(lr).item() == pytest.approx(-0.05)
    assert S.kl_k3(lr).item() == pytest.approx(
        float(np.mean(np.exp([0.3, -0.2]) - 1 - np.array([0.3, -0.2])))
    )


def test_mismatch_stats_bins_and_shares_on_a_small_batch():
    mu = torch.tensor([0.05, 0.3, 0.7, 0.95, 1.0]).log()  # off the bin edges, but for 1.0
    d = torch.tensor([1.0, -2.0, 3.0, -0.1, 0.5])
    stats = S.mismatch_stats(d, mu, d.sum().reshape(1), torch.ones(5), cap=2.0, low=0.5, high=5.0)
    assert stats["abs_mean_p000_010"] == pytest.approx(1.0)
    assert stats["abs_mean_p010_050"] == pytest.approx(2.0)
    assert stats["abs_mean_p090_100"] == pytest.approx(0.3)  # 0.95 and 1.0 (the last bin includes 1)
    assert stats["share_p090_100"] == pytest.approx(2 / 5)
    assert stats["above_band"] == pytest.approx(1 / 5)  # exp(3) > 5
    assert stats["below_band"] == pytest.approx(1 / 5)  # exp(-2) < 0.5
    assert stats["seq_abs_sum_max"] == pytest.approx(2.4, abs=1e-6)
    assert stats["ess_weighted"] == pytest.approx(1.0)


def test_staleness_of_episode_is_its_oldest_token():
    version = torch.tensor([[-1, 3, 4, -1], [-1, 5, -1, 5], [-1, -1, -1, -1]])
    mask = (version >= 0).float()
    assert S.token_staleness(version, mask, 5).tolist() == [2, 1, 0, 0]
    assert S.episode_staleness(version, mask, 5).tolist() == [2, 0]


# -- a lagged run, read back from TensorBoard ----------------------------------------------------------


def read_events(log_dir: str) -> EventAccumulator:
    acc = EventAccumulator(log_dir, size_guidance={SCALARS: 0, HISTOGRAMS: 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def lagged(tmp_path_factory):
    """`train.py --sampler lagged --lag 4 --max-steps 10` with the default (all on) monitoring. Its tests are one
    group, handed to one worker together (and first, as the long ones): tests of the module spread over workers, or
    split by the order of the long ones, would each run it again."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    cfg = Config(
        sampler="lagged",
        lag=4,
        max_steps=10,
        eval_every=5,
        eval_episodes=2,
        progress=False,
        log_dir=str(tmp_path_factory.mktemp("runs")),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = build_run(cfg)
        run.trainer.fit(run.module, run.datamodule)
    return run, read_events(run.trainer.logger.log_dir)


def last_value(acc: EventAccumulator, tag: str) -> float:
    return acc.Scalars(tag)[-1].value


@pytest.mark.xdist_group("callbacks-lagged")
def test_every_tag_is_logged(lagged):
    run, acc = lagged
    tags = acc.Tags()
    missing = [t for t in MISMATCH_TAGS + STALENESS_TAGS + TIME_TAGS if t not in tags["scalars"]]
    assert not missing
    assert set(HISTOGRAM_TAGS) <= set(tags["histograms"])
    for tag in MISMATCH_TAGS + STALENESS_TAGS + TIME_TAGS:
        n = len(acc.Scalars(tag))
        assert n == (1 if "step0" in tag else 10), tag
    assert {"reward", "val/pass_rate", "mismatch"} <= set(run.trainer.progress_bar_metrics)


@pytest.mark.xdist_group("callbacks-lagged")
def test_logged_mismatch_matches_hand_computation(lagged):
    run, acc = lagged
    m = run.module
    b, old, w = m.last_step.batch, m.last_step.old_logp.double(), m.last_step.weights.double()
    on = b["action_mask"].bool()
    lr = (old - b["sample_logp"].double())[on].numpy()  # raw log ratios of the last batch
    a = np.abs(lr)
    cfg = run.cfg
    per_seq = [abs(float(((old[i] - b["sample_logp"][i].double()) * on[i]).sum())) for i in range(len(old))]
    ratio = np.exp(lr)
    ww = w[on].numpy()
    prob = np.exp(b["sample_logp"].double()[on].numpy())
    hand = {
        "abs_mean": a.mean(),
        "abs_max": a.max(),
        "abs_median": np.percentile(a, 50, method="inverted_cdf"),  # nearest rank
        "abs_p99": np.percentile(a, 99, method="inverted_cdf"),
        "seq_abs_sum_max": max(per_seq),
        "kl_k1": np.mean(-lr),
        "kl_k3": np.mean(ratio - 1 - lr),
        "over_cap": np.mean(ratio > cfg.cap),
        "below_band": np.mean(ratio < cfg.low),
        "above_band": np.mean(ratio > cfg.high),
        "ess_raw": ratio.sum() ** 2 / (len(ratio) * (ratio**2).sum()),
        "ess_weighted": ww.sum() ** 2 / (len(ww) * (ww**2).sum()),
        "tokens": len(lr),
    }
    for name, lo, hi in zip(BINS, (0, 0.1, 0.5, 0.9), (0.1, 0.5, 0.9, 1.0)):
        inside = (prob >= lo) & ((prob <= hi) if hi == 1.0 else (prob < hi))
        hand[f"share_{name}"] = inside.mean()
        if inside.any():
            hand[f"abs_mean_{name}"] = a[inside].mean()
    abs_means = np.array([e.value for e in acc.Scalars("mismatch/abs_mean")])
    tokens = np.array([e.value for e in acc.Scalars("mismatch/tokens")])
    hand["abs_mean_run"] = (abs_means * tokens).sum() / tokens.sum()
    for key, expected in hand.items():
        assert last_value(acc, f"mismatch/{key}") == pytest.approx(expected, rel=1e-5, abs=1e-6), key
    assert hand["abs_mean"] > 0.05  # lag 4: the comparison is not vacuous
    assert acc.Scalars("mismatch/step0_abs_mean")[0].step == 0
    assert last_value(acc, "mismatch/step0_abs_mean") < 1e-5  # version-0 weights on both sides


@pytest.mark.xdist_group("callbacks-lagged")
def test_logged_staleness_and_timing_match_hand_computation(lagged):
    run, acc = lagged
    m = run.module
    b, version = m.last_step.batch, m.last_step.version
    on = b["action_mask"].bool()
    token = (version - b["version"])[on].double()
    oldest = [int(b["version"][i][on[i]].min()) for i in range(len(on)) if on[i].any()]
    episode = np.array([version - v for v in oldest], dtype=float)
    hand = {
        "token_mean": token.mean().item(),
        "token_max": token.max().item(),
        "episode_mean": episode.mean(),
        "episode_max": episode.max(),
        "length_sampled": b["length"].double().mean().item(),
        "length_trained": b["length"].double().mean().item(),  # no correction: every episode is trained
    }
    for key, expected in hand.items():
        assert last_value(acc, f"staleness/{key}") == pytest.approx(expected, rel=1e-6), key
    means = np.array([e.value for e in acc.Scalars("staleness/token_mean")])
    tokens = np.array([e.value for e in acc.Scalars("mismatch/tokens")])
    assert last_value(acc, "staleness/token_mean_run") == pytest.approx(
        (means * tokens).sum() / tokens.sum(), rel=1e-5
    )
    # timing: shares are the module's phase times over the step's wall time, and add up to 1 with "other"
    step = last_value(acc, "time/step")
    shares = 0.0
    for phase in ("sample", "old_logp", "update", "shift", "sync"):
        share = last_value(acc, f"time/share_{phase}")
        assert share == pytest.approx(last_value(acc, f"time/{phase}") / step, rel=1e-4)
        shares += share
    assert shares + last_value(acc, "time/share_other") == pytest.approx(1.0, abs=1e-4)
    steps = np.array([e.value for e in acc.Scalars("time/step")])
    assert last_value(acc, "time/step_mean") == pytest.approx(steps.mean(), rel=1e-5)


@pytest.mark.xdist_group("callbacks-lagged")
def test_staleness_histogram_has_all_mass_at_the_lag_after_warmup(lagged):
    _, acc = lagged
    for tag in ("staleness/token", "staleness/episode"):
        events = acc.Histograms(tag)
        assert [e.step for e in events] == list(range(10))
        for e in events:
            h = e.histogram_value
            expected = min(e.step, 4)  # warm-up: step s samples with version 0, so staleness s
            assert (h.min, h.max) == (expected, expected), (tag, e.step)
            assert h.sum == pytest.approx(expected * h.num)
            assert sum(h.bucket) == h.num


# -- the step-0 health check ---------------------------------------------------------------------------


def test_health_check_silent_with_the_onpolicy_sampler():
    check = HealthCheck(strict=True)
    run = build_run(tiny(), callbacks=[check], logger=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.trainer.fit(run.module, run.datamodule)
    assert check.measured["abs_mean"] < 1e-5 and check.measured["abs_p99"] < 1e-5
    assert not [w for w in caught if "HealthCheck" in str(w.message)]


def test_health_check_strict_stops_a_wrong_sampler(monkeypatch):
    monkeypatch.setattr(samplers, "make_sampler", lambda cfg, tok: HotSampler(tok))
    run = build_run(tiny(max_steps=3, health_strict=True), logger=False)
    check = next(c for c in run.trainer.callbacks if isinstance(c, HealthCheck))
    with pytest.raises(HealthCheckError, match=r"mean \|log pi_old - log mu\| = ") as err:
        run.trainer.fit(run.module, run.datamodule)
    mean = check.measured["abs_mean"]
    assert mean > 0.05
    assert f"= {mean:.4g} nats" in str(err.value)
    assert f"p99 = {check.measured['abs_p99']:.4g}" in str(err.value)
    assert len(run.module.history) == 1  # stopped after the first step (trained, or skipped: no signal)


def test_health_check_warns_when_not_strict(monkeypatch):
    monkeypatch.setattr(samplers, "make_sampler", lambda cfg, tok: HotSampler(tok))
    run = build_run(tiny(), callbacks=[HealthCheck()], logger=False)
    with pytest.warns(UserWarning, match="HealthCheck: at the first step"):
        run.trainer.fit(run.module, run.datamodule)


# -- each callback alone, and the config switches ------------------------------------------------------


@pytest.mark.parametrize("make", [MismatchMonitor, StalenessMonitor, TimingMonitor])
def test_each_monitor_works_alone_without_a_logger(make):
    callback = make()
    run = build_run(tiny(), callbacks=[callback], logger=False)
    run.trainer.fit(run.module, run.datamodule)
    assert callback.last and all(np.isfinite(v) or "abs_mean_p" in k for k, v in callback.last.items())
    if isinstance(callback, MismatchMonitor):
        assert callback.last["mismatch/abs_max"] < 1e-5  # on-policy


def test_config_switches_and_the_monitoring_off_yaml():
    assert [type(c) for c in build_callbacks(Config())] == [
        HealthCheck,
        MismatchMonitor,
        StalenessMonitor,
        JumpMonitor,
        EnvironmentMonitor,
        TimingMonitor,
    ]
    off = from_dict(load_yaml(ROOT / "configs" / "monitoring_off.yaml"))
    assert build_callbacks(off) == []
    with pytest.raises(ConfigError, match="health_threshold"):
        build_callbacks(Config(health_threshold=0.0))
    with pytest.raises(ConfigError, match="histogram_every"):
        build_callbacks(Config(histogram_every=0))
