"""The engine sampler: engine-style log-probs match trainer-style ones in fp32, not in bf16; one position per
decode step; top-k/top-p record the truncated distribution; lag x FP8 x engine compose; clear errors."""

import copy

import pytest
import torch

from lrl.batch import collate, pad_right
from lrl.config import Config, ConfigError
from lrl.decoding import Sampling, truncated_log_probs
from lrl.envs.tinyagent import build_tokenizer, make_tasks, tinyagent_spec
from lrl.kvcache import KVCacheDecoder, engine_generate, engine_score
from lrl.logprobs import token_log_probs
from lrl.policy import ModelLoadError, load_policy, make_policy
from lrl.rollout import run_episodes
from lrl.samplers import make_sampler
from lrl.samplers.engine import EngineSampler
from lrl.samplers.fp8 import round_fp8


@pytest.fixture(scope="module")
def gym_tok():
    return build_tokenizer(make_tasks("all"))


@pytest.fixture(scope="module")
def spec(gym_tok):
    return tinyagent_spec(gym_tok)


def engine_rollout(model, tasks, spec, generator, reuse_cache=True, sampling=None):
    """Episodes decoded engine-style (KV cache) by the one episode loop."""
    return run_episodes(KVCacheDecoder(model, spec.tok.pad_id, reuse_cache), spec, tasks, generator, sampling)


def reads(episode) -> float:
    return episode.metrics.get("reads", 0.0)


def reading_policy(tok, seed=0, **size):
    """A fresh tiny policy nudged (by a hook on its logits) towards `read <eos>`, so episodes run several turns."""
    model = make_policy(tok, seed=seed, **size)
    bias = torch.zeros(len(tok), len(tok))  # [previous token, next token]
    bias[:, tok.id("read")], bias[:, tok.id("answer")] = 5.0, 2.0
    bias[tok.id("read"), tok.eos_id] = 9.0

    def nudge(module, args, kwargs, out):
        ids = kwargs["input_ids"][:, -out.logits.shape[1] :]  # the positions whose logits were kept
        out.logits = out.logits + bias[ids].to(out.logits.dtype)
        return out

    model.register_forward_hook(nudge, with_kwargs=True)
    return model


def trainer_logp(model, batch, batch_size):
    """Trainer-style log-probs of the collated batch, scoring `batch_size` episodes per forward: [B, T-1]."""
    rows = []
    with torch.no_grad():
        for start in range(0, len(batch["ids"]), batch_size):
            ids = batch["ids"][start : start + batch_size]
            attn = batch["attention_mask"][start : start + batch_size]
            width = int(attn.sum(-1).max())  # a batch of one has no padding at all
            out = token_log_probs(model, ids[:, :width], attn[:, :width])
            rows.append(torch.nn.functional.pad(out, (0, ids.shape[1] - width)))
    return torch.cat(rows)


@pytest.mark.parametrize("reuse_cache", [True, False])
def test_fp32_engine_matches_trainer_on_every_action_token(gym_tok, spec, reuse_cache):
    model = reading_policy(gym_tok)
    tasks = make_tasks("train")[:12]
    episodes = engine_rollout(model, tasks, spec, torch.Generator().manual_seed(0), reuse_cache=reuse_cache)
    assert max(reads(e) for e in episodes) >= 2  # multi-turn episodes: the cache is carried across turns
    batch = collate(episodes, gym_tok.pad_id)
    on = batch["action_mask"].bool()
    full, single = trainer_logp(model, batch, len(tasks)), trainer_logp(model, batch, 1)
    assert (full - batch["sample_logp"])[on].abs().max().item() < 1e-4
    assert (single - full)[on].abs().max().item() < 1e-5
    assert (batch["version"][on] == 0).all() and (batch["version"][~on] == -1).all()


def test_cache_reuse_across_turns_gives_the_same_episodes(gym_tok, spec):
    model = reading_policy(gym_tok)
    tasks = make_tasks("train")[:8]
    a = engine_rollout(model, tasks, spec, torch.Generator().manual_seed(3), reuse_cache=True)
    b = engine_rollout(model, tasks, spec, torch.Generator().manual_seed(3), reuse_cache=False)
    assert [e.ids for e in a] == [e.ids for e in b]
    gap = max(abs(x - y) for e, f in zip(a, b) for x, y in zip(e.logp, f.logp))
    assert gap < 1e-5


def test_bf16_engine_does_not_match_fp32_trainer(gym_tok, spec):
    policy = reading_policy(gym_tok)
    sampler = EngineSampler(gym_tok, dtype="bfloat16")
    sampler.setup(policy)
    assert next(sampler.behavior.parameters()).dtype == torch.bfloat16
    batch = collate(
        sampler.sample(make_tasks("train")[:8], torch.Generator().manual_seed(0), spec), gym_tok.pad_id
    )
    on = batch["action_mask"].bool()
    gap = (trainer_logp(policy, batch, 8) - batch["sample_logp"])[on].abs()
    assert gap.max().item() > 1e-4  # bf16 rounding is visible, unlike fp32's ~1e-7
    assert gap.max().item() < 0.5


class PositionCounter:
    """Records the shape of input_ids of every forward of a model (a forward pre-hook)."""

    def __init__(self, model):
        self.shapes = []
        self.handle = model.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))


def test_generate_is_one_prefill_then_one_position_per_sequence_per_token(gym_tok):
    model = make_policy(gym_tok)
    counter = PositionCounter(model)
    prompts = [[gym_tok.bos_id] + gym_tok.encode(t.prompt) for t in make_tasks("all")[:5]]
    ids, logp = engine_generate(model, prompts, 6, torch.Generator().manual_seed(0), gym_tok.pad_id)
    assert ids.shape == logp.shape == (5, 6)
    assert counter.shapes[0] == (5, max(len(p) for p in prompts))  # the prefill
    assert counter.shapes[1:] == [(5, 1)] * 5  # the last token needs no forward


def test_rollout_decode_steps_see_one_position_per_generated_token(gym_tok, spec):
    model = reading_policy(gym_tok)
    counter = PositionCounter(model)
    tasks = make_tasks("train")[:10]
    episodes = engine_rollout(model, tasks, spec, torch.Generator().manual_seed(1))
    turns = sum(reads(e) + (not e.truncated) for e in episodes)  # an action per turn
    generated = sum(sum(e.generated) for e in episodes)
    decode = [s for s in counter.shapes if s[1] == 1]
    prefills = [s for s in counter.shapes if s[1] > 1]
    assert all(rows <= len(tasks) for rows, _ in counter.shapes)
    # every generated token but each action's last is fed back once, as one position of its own row
    assert sum(rows for rows, _ in decode) == generated - turns
    assert len(prefills) == max(reads(e) + (not e.truncated) for e in episodes)  # one prefill per turn


def test_truncated_log_probs_by_hand():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert torch.allclose(truncated_log_probs(logits).exp(), probs)
    top_p = truncated_log_probs(logits, top_p=0.7).exp()
    assert torch.allclose(top_p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_k = truncated_log_probs(logits, top_k=3).exp()
    assert torch.allclose(top_k, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    hot = truncated_log_probs(logits, temperature=2.0).exp()
    assert torch.allclose(hot, probs.sqrt() / probs.sqrt().sum())
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        Sampling(top_k=-1)


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (5, 1.0), (5, 0.8), (20, 0.5), (3, 0.99)])
def test_top_k_and_top_p_keep_the_set_transformers_keeps(top_k, top_p):
    """Top-p measures the nucleus on the distribution renormalised over the top-k set, as transformers' warpers
    (and vLLM) do; measuring it on the full distribution keeps a different set when both are on."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(top_k)) * 2.0
    scores = logits.clone()
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    expected = torch.log_softmax(scores, -1)
    ours = truncated_log_probs(logits, 1.0, top_p, top_k)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))  # the same kept set in every row
    kept = ~torch.isinf(expected)
    assert (ours[kept] - expected[kept]).abs().max().item() < 1e-5


def test_top_k_one_records_the_greedy_distribution(gym_tok, spec):
    sampler = EngineSampler(gym_tok, sampling=Sampling(top_k=1))
    sampler.setup(make_policy(gym_tok))
    batch = collate(
        sampler.sample(make_tasks("train")[:4], torch.Generator().manual_seed(0), spec), gym_tok.pad_id
    )
    on = batch["action_mask"].bool()
    assert (batch["sample_logp"][on] == 0).all()  # mu is the truncated distribution: probability 1


def test_engine_score_reproduces_the_sampled_log_probs(gym_tok):
    model = make_policy(gym_tok).to(torch.bfloat16)
    prompts = [[gym_tok.bos_id] + gym_tok.encode(t.prompt) for t in make_tasks("all")[:6]]
    ids, logp = engine_generate(
        model, prompts, 5, torch.Generator().manual_seed(0), gym_tok.pad_id, top_p=0.9
    )
    assert torch.equal(engine_score(model, prompts, ids, gym_tok.pad_id, top_p=0.9), logp)
    by_two = engine_score(model, prompts, ids, gym_tok.pad_id, top_p=0.9, batch_size=2)
    assert (by_two - logp).abs().max().item() < 0.1


def test_lag_fp8_and_engine_compose(gym_tok, spec):
    cfg = Config(sampler="engine", lag=2, engine_fp8=True, fp8_scale="tensor", engine_dtype="bfloat16")
    sampler = make_sampler(cfg, gym_tok)
    assert isinstance(sampler, EngineSampler) and sampler.name == "engine"
    policy = make_policy(gym_tok)
    sampler.setup(policy, 0)
    states = [copy.deepcopy(policy.state_dict())]
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.01 * version)
        states.append(copy.deepcopy(policy.state_dict()))
        sampler.sync(policy, version)
    assert sampler.kept_versions == [1, 2, 3] and sampler.behavior_version == 1
    weight = sampler.behavior.model.layers[0].mlp.up_proj.weight
    expected = round_fp8(states[1]["model.layers.0.mlp.up_proj.weight"].to(torch.bfloat16), "tensor")
    assert weight.dtype == torch.bfloat16 and torch.equal(weight, expected)
    episodes = sampler.sample(make_tasks("train")[:4], torch.Generator().manual_seed(0), spec)
    assert {v for e in episodes for v, g in zip(e.version, e.generated) if g} == {1}


def test_config_fields_and_their_errors():
    assert Config(sampler="engine", engine_dtype="bfloat16", top_p=0.9, top_k=5).top_k == 5
    for bad in (
        dict(sampler="lagged", top_p=0.9),
        dict(sampler="fp8", engine_dtype="bfloat16"),
        dict(sampler="engine", top_p=0.0),
        dict(sampler="engine", top_k=-1),
        dict(sampler="engine", engine_dtype="float64"),
        dict(sampler="engine", fp8_scale="tensor"),
    ):
        with pytest.raises(ConfigError):
            Config(**bad)


def test_not_a_causal_lm_is_a_clear_error(gym_tok, tmp_path):
    from transformers import BertConfig, BertModel

    bert = BertModel(
        BertConfig(
            vocab_size=len(gym_tok),
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    with pytest.raises(ValueError, match="causal LM"):
        EngineSampler(gym_tok).setup(bert)
    with pytest.raises(ValueError, match="causal LM"):
        engine_generate(bert, [[1, 2]], 2, torch.Generator(), gym_tok.pad_id)
    from transformers import DistilBertConfig, DistilBertModel

    DistilBertModel(
        DistilBertConfig(vocab_size=len(gym_tok), dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    ).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="not a causal LM"):
        load_policy(tmp_path, gym_tok)  # what `python -m lrl_lab.mismatch --model PATH` calls


def test_dtype_or_device_that_cannot_run_is_a_clear_error(gym_tok):
    with pytest.raises(ValueError, match="engine dtype"):
        EngineSampler(gym_tok, dtype="float64")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            EngineSampler(gym_tok, device="cuda")

    class NoHalf(torch.nn.Module):  # a stand-in for a kernel the device lacks in this dtype
        def forward(self, x):
            if x.dtype != torch.float32:
                raise RuntimeError(f'"addmm" not implemented for {x.dtype}')
            return x

    policy = make_policy(gym_tok)
    policy.model.norm = torch.nn.Sequential(policy.model.norm, NoHalf())
    with pytest.raises(ValueError, match="cannot run in torch.float16 on cpu"):
        EngineSampler(gym_tok, dtype="float16").setup(policy)


def test_prompt_longer_than_the_context_is_a_clear_error(gym_tok, spec):
    model = make_policy(gym_tok, max_position_embeddings=16)
    long_prompt = [[gym_tok.bos_id] + gym_tok.encode(make_tasks("all")[0].source)]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine_generate(model, long_prompt, 4, torch.Generator(), gym_tok.pad_id)
    with pytest.raises(ValueError, match="context is 16"):
        engine_rollout(model, make_tasks("train")[:2], spec, torch.Generator())


def test_left_padding_does_not_change_a_sequence(gym_tok):
    model = make_policy(gym_tok)
    short = [gym_tok.bos_id] + gym_tok.encode(make_tasks("all")[0].prompt)
    long = short + [gym_tok.id("read"), gym_tok.eos_id] + gym_tok.encode(make_tasks("all")[0].source)
    forced = torch.randint(3, len(gym_tok), (2, 4), generator=torch.Generator().manual_seed(0))
    together = engine_score(model, [short, long], forced, gym_tok.pad_id)
    alone = torch.cat(
        [engine_score(model, [s], forced[i : i + 1], gym_tok.pad_id) for i, s in enumerate([short, long])]
    )
    assert (together - alone).abs().max().item() < 1e-5
    ids, mask = pad_right([short + forced[0].tolist()], gym_tok.pad_id)
    with torch.no_grad():
        trainer = token_log_probs(model, ids, mask)[0, -forced.shape[1] :]
    assert (trainer - together[0]).abs().max().item() < 1e-5


def test_trainer_runs_on_a_lagged_bf16_engine(gym_tok):
    from lrl.run import build_run, fit

    cfg = Config(
        sampler="engine",
        engine_dtype="bfloat16",
        lag=1,
        correction="tis",
        max_steps=3,
        tasks_per_step=2,
        episodes_per_task=4,
        minibatches=2,
        eval_every=1000,
        eval_episodes=1,
        progress=False,
        threads=1,
    )
    run = build_run(cfg, logger=False, policy=reading_policy(gym_tok))
    fit(run)
    history = run.module.history
    assert [h["staleness/token_mean"] for h in history] == [0.0, 1.0, 1.0]  # measured from the version tags
    assert all(0 < h["mismatch/abs_mean"] < 0.5 for h in history)  # bf16 engine vs fp32 trainer


def test_rows_that_share_a_prompt_prefill_it_once_and_then_decode_apart(gym_tok):
    """Three prompts, four rows each: the first forward holds the three distinct prompts; every row's logits (and
    the steps after, each row feeding its own token) are those of rows prefilled one by one."""
    model = make_policy(gym_tok).eval()
    counter = PositionCounter(model)
    prompts = [[gym_tok.bos_id] + gym_tok.encode(t.prompt) for t in make_tasks("all")[:3]]
    rows = [(key, prompts[key // 4]) for key in range(12)]
    shared = KVCacheDecoder(model, gym_tok.pad_id)
    alone = KVCacheDecoder(model, gym_tok.pad_id, reuse_cache=False)  # every call a forward of one whole row
    with torch.no_grad():
        got = [shared.decode(rows)]
        assert counter.shapes[0] == (3, max(len(p) for p in prompts))
        want = [torch.cat([alone.decode([row]) for row in rows])]
        for _ in range(3):
            feed = [(key, [int(got[-1][key].argsort()[-1 - (key % 3)])]) for key in range(12)]  # rows part ways
            got.append(shared.decode(feed))
            want.append(torch.cat([alone.decode([f]) for f in feed]))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
