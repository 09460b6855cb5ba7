"""Mismatch statistics by hand, and `python -m lrl_lab.mismatch` end to end on a small saved policy."""

import json
import math

import pytest
import torch

from lrl.envs.tinyagent import build_tokenizer, make_tasks
from lrl.policy import make_policy, save_policy
from lrl.stats import abs_diff_stats, cdf_points, probability_bins, quantile, ratio_ranges
from lrl_lab.tools import mismatch


def test_quantile_is_a_nearest_rank_by_kthvalue():
    x = torch.arange(1, 101).float()[torch.randperm(100)]
    assert quantile(x, 0.5) == 50 and quantile(x, 0.99) == 99 and quantile(x, 1.0) == 100
    assert quantile(x, 0.0) == 1
    big = torch.rand(50_000, generator=torch.Generator().manual_seed(0))
    assert abs(quantile(big, 0.99, max_sample=5_000) - 0.99) < 0.01  # bounded subsample
    assert math.isnan(quantile(torch.empty(0), 0.5))


def test_abs_diff_stats_by_hand():
    d = torch.tensor([[0.1, -0.2, 5.0], [0.3, 0.0, -5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]]).bool()  # the +-5 are off the mask and must not count
    s = abs_diff_stats(d, mask)
    assert s["mean"] == pytest.approx(0.15) and s["max"] == pytest.approx(0.3)
    assert s["median"] == pytest.approx(0.1) and s["p99"] == pytest.approx(0.3)
    assert s["max_seq_sum"] == pytest.approx(0.3)  # row sums: -0.1 and 0.3


def test_probability_bins_and_ratio_ranges_by_hand():
    logp = torch.tensor([[0.05, 0.3, 0.7, 1.0]]).log()
    d = torch.tensor([[0.4, 0.2, -0.1, 0.0]])
    bins = probability_bins(logp, d)
    assert [b["count"] for b in bins] == [1, 1, 1, 1]  # probability 1 lands in the last, closed bin
    assert [b["mean_abs"] for b in bins] == pytest.approx([0.4, 0.2, 0.1, 0.0])
    r = ratio_ranges(d)
    assert r["token_min"] == pytest.approx(math.exp(-0.1)) and r["token_max"] == pytest.approx(math.exp(0.4))
    assert r["seq_min"] == pytest.approx(math.exp(0.5)) == pytest.approx(r["seq_max"])
    long = torch.full(
        (1, 1000), math.log(0.7)
    )  # a product of 1,000 ratios of 0.7 underflows; its log does not
    assert ratio_ranges(long)["seq_log_min"] == pytest.approx(1000 * math.log(0.7), rel=1e-4)
    x, f = cdf_points(d, max_points=3)
    assert len(x) == 3 and f[-1] == 1 and (x[1:] >= x[:-1]).all()


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    tok = build_tokenizer(make_tasks("all"))
    return save_policy(make_policy(tok, seed=1), tok, tmp_path_factory.mktemp("policy"))


def test_tool_writes_the_table_json_and_plot(saved_policy, tmp_path, capsys):
    out = tmp_path / "mm.json"
    argv = [
        "--model",
        str(saved_policy),
        "--new-tokens",
        "4",
        "--engine-batch",
        "1",
        "10",
        "30",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "figs"),
    ]
    assert mismatch.main(argv) == 0
    text = capsys.readouterr().out
    assert "bf16 trainer batch 1 vs engine" in text and "p in [0.9, 1.0]" in text
    res = json.loads(out.read_text())
    names = set(res["comparisons"])
    assert {
        "bf16 trainer batch 1 vs engine",
        "bf16 trainer batch 30 vs engine",
        "fp32 trainer batch 1 vs engine",
        "bf16 trainer batch 1 vs batch 30",
        "fp32 trainer batch 1 vs batch 30",
        "engine batch 1 vs batch 30",
        "engine batch 10 vs batch 30",
    } <= names
    for stats in res["comparisons"].values():  # the TIS over-cap and MIS out-of-band shares beside the sizes
        assert set(stats) == {"mean", "median", "p99", "max", "max_seq_sum", "over_cap", "outside_band"}
        assert 0 <= stats["over_cap"] <= 1 and 0 <= stats["outside_band"] <= 1
    assert res["comparisons"]["fp32 trainer batch 1 vs batch 30"]["max"] < 1e-5
    assert res["comparisons"]["fp32 trainer batch 1 vs engine"]["max"] > 1e-4  # the engine is bf16
    assert sum(b["count"] for b in res["bins"]) == res["tokens"] == 30 * 4
    assert (tmp_path / "figs" / "mismatch.png").stat().st_size > 10_000


def test_fp32_engine_agrees_with_the_fp32_trainer(saved_policy, tmp_path):
    out = tmp_path / "mm.json"
    assert (
        mismatch.main(
            [
                "--model",
                str(saved_policy),
                "--new-tokens",
                "4",
                "--engine-dtype",
                "float32",
                "--top-p",
                "1.0",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["comparisons"]["fp32 trainer batch 1 vs engine"]["max"] < 1e-4


def test_fp32_head_and_top_p_change_the_numbers(saved_policy, tmp_path):
    runs = {}
    for name, extra in {"plain": [], "head": ["--fp32-head"], "top_p": ["--top-p", "0.5"]}.items():
        out = tmp_path / f"{name}.json"
        assert (
            mismatch.main(["--model", str(saved_policy), "--new-tokens", "3", "--json", str(out), *extra])
            == 0
        )
        runs[name] = json.loads(out.read_text())["comparisons"]["fp32 trainer batch 1 vs engine"]["mean"]
    assert runs["head"] != runs["plain"]
    assert runs["top_p"] > runs["plain"]  # mu is the truncated distribution, pi is not


def test_arms_put_each_choice_of_numerics_side_by_side(saved_policy, tmp_path, capsys):
    out = tmp_path / "arms.json"
    argv = [
        "--model",
        str(saved_policy),
        "--new-tokens",
        "4",
        "--json",
        str(out),
        "--arms",
        "fp32",
        "bf16",
        "fp16",
    ]
    assert mismatch.main([*argv, "bf16-head", "fp8"]) == 0
    assert "fp16 engine vs fp16 trainer" in capsys.readouterr().out
    arms = json.loads(out.read_text())["arms"]
    assert list(arms) == ["fp32", "bf16", "fp16", "bf16-head", "fp8"]
    for arm in arms.values():
        assert arm["tokens"] == 30 * 4 and arm["nonfinite"] == 0
        assert {"mean", "p99", "max", "over_cap", "outside_band", "kl_k3"} <= set(arm)
    assert arms["fp32"]["max"] < 1e-4  # the same weights in fp32: the decode path costs nothing measurable
    assert arms["bf16"]["mean"] > 10 * arms["fp32"]["mean"]
    assert arms["fp16"]["mean"] < arms["bf16"]["mean"]  # three more mantissa bits
    assert arms["fp8"]["mean"] > arms["fp32"]["mean"]


def test_tool_errors_are_clear(saved_policy, tmp_path, capsys):
    from transformers import DistilBertConfig, DistilBertModel

    assert mismatch.main(["--model", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    bert = tmp_path / "bert"
    DistilBertModel(
        DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    ).save_pretrained(bert)
    assert mismatch.main(["--model", str(bert)]) == 2
    assert "not a causal LM" in capsys.readouterr().err
    assert mismatch.main(["--model", str(saved_policy), "--new-tokens", "500"]) == 2
    assert "max_position_embeddings" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert mismatch.main(["--model", str(saved_policy), "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
