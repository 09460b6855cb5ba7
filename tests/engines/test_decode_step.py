"""The decode step's own attention and cache (lrl.decode_step) compute what transformers' default path computes."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lrl.decode_step import GrowingLayer, decode_attention, growing_cache, one_query_attention


class Attn(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def qkv(rows=5, heads=6, kv_heads=2, length=11, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, 1, dim, generator=g)
    k = torch.randn(rows, kv_heads, length, dim, generator=g)
    v = torch.randn(rows, kv_heads, length, dim, generator=g)
    mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :4] = False  # left padding in two rows
    mask[3, ..., :1] = False
    return q, k, v, mask


def test_one_query_attention_equals_sdpa_with_grouped_heads_and_a_padding_mask():
    q, k, v, mask = qkv()
    want, _ = sdpa_attention_forward(Attn(), q, k, v, mask, scaling=0.25)
    got, _ = one_query_attention(Attn(), q, k, v, mask, scaling=0.25)
    assert got.shape == want.shape == (5, 1, 6, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # a padded position changes nothing: its keys do not matter
    k2 = k.clone()
    k2[1, :, :4] = 100.0
    again, _ = one_query_attention(Attn(), q, k2, v, mask, scaling=0.25)
    torch.testing.assert_close(again[1], got[1])


def test_one_query_attention_in_bf16_is_the_fused_kernel_to_bf16_rounding():
    q, k, v, mask = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in qkv(seed=1))
    want, _ = sdpa_attention_forward(Attn(), q, k, v, mask, scaling=0.25)
    got, _ = one_query_attention(Attn(), q, k, v, mask, scaling=0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_several_queries_a_row_go_to_the_models_own_attention():
    q, k, v, _ = qkv()
    q = torch.cat([q, q], dim=2)  # two queries a row: prefill
    mask = torch.tril(torch.ones(2, 11, dtype=torch.bool), diagonal=9)[None, None].expand(5, 1, 2, 11)
    want, _ = sdpa_attention_forward(Attn(), q, k, v, mask, scaling=0.25)
    got, _ = one_query_attention(Attn(), q, k, v, mask, scaling=0.25)
    assert torch.equal(got, want)


def test_the_growing_layer_holds_what_concatenation_holds_through_growth_and_row_selection():
    g = torch.Generator().manual_seed(0)
    layer = GrowingLayer()
    keys, values = [], []
    for step, width in enumerate([7, 1, 1, 3] + [1] * 70):
        k, v = torch.randn(4, 2, width, 8, generator=g), torch.randn(4, 2, width, 8, generator=g)
        keys.append(k)
        values.append(v)
        got_k, got_v = layer.update(k, v)
        assert torch.equal(got_k, torch.cat(keys, 2)) and torch.equal(got_v, torch.cat(values, 2)), step
    layer.batch_select_indices(torch.tensor([3, 1]))
    keys, values = [torch.cat(keys, 2)[[3, 1]]], [torch.cat(values, 2)[[3, 1]]]
    k, v = torch.randn(2, 2, 1, 8, generator=g), torch.randn(2, 2, 1, 8, generator=g)
    got_k, got_v = layer.update(k, v)
    assert torch.equal(got_k, torch.cat([*keys, k], 2)) and torch.equal(got_v, torch.cat([*values, v], 2))
    assert layer.get_seq_length() == 7 + 1 + 1 + 3 + 70 + 1


def test_a_decoded_continuation_on_a_real_model_shape_matches_one_full_forward(smollm2_cut):
    """SmolLM2's shape (9 query heads on 3 key/value heads), cut to two layers, in fp32: prompt then ten decode
    steps with the growing cache and the one-query attention give the full forward's logits."""
    from lrl.policy import load_policy

    model = load_policy(smollm2_cut)[0].eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]).repeat(3, 1) + torch.arange(3)[:, None]
    with torch.no_grad():
        full = model(input_ids=ids).logits  # [3, 12, V]
        cache = growing_cache(model.config)
        out = model(input_ids=ids[:, :2], past_key_values=cache, use_cache=True)
        steps = [out.logits[:, -1]]
        with decode_attention(model):
            for t in range(2, 12):
                out = model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                steps.append(out.logits[:, -1])
        assert model.config._attn_implementation == "sdpa"  # put back after the steps
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 1:], rtol=1e-4, atol=1e-4)


class TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a = torch.nn.Linear(12, 20)
        self.b = torch.nn.Linear(20, 7, bias=False)
        self.c = torch.nn.Linear(7, 5).to(torch.float64)  # not fp32: left as it is
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g, dtype=p.dtype)

    def forward(self, x):
        return self.c(self.b(self.a(x)).double())


@pytest.mark.parametrize("rows", [1, 8, 24, 48, 64])  # below, within and above FEW_ROWS
def test_few_rows_linears_compute_what_the_layers_compute(rows):
    from lrl.decode_step import few_rows_linears

    net = TwoLinears()
    x = torch.randn(rows, 1, 12, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = net(x)
        with few_rows_linears(net):
            assert "forward" in vars(net.a) and "forward" in vars(net.b) and "forward" not in vars(net.c)
            got = net(x)
        assert "forward" not in vars(net.a) and "forward" not in vars(net.b)  # the layers' own forwards again
    assert got.shape == want.shape == (rows, 1, 5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_few_rows_linears_leave_a_forward_with_gradients_alone_and_restore_after_an_error():
    from lrl.decode_step import few_rows_linears

    net = TwoLinears()
    with few_rows_linears(net):  # gradients enabled: the layers' own forwards, which backpropagate
        assert "forward" not in vars(net.a)
        net(torch.randn(16, 12)).sum().backward()
    assert net.a.weight.grad is not None
    with pytest.raises(KeyError), torch.no_grad(), few_rows_linears(net):
        raise KeyError("inside")
    assert "forward" not in vars(net.a) and "forward" not in vars(net.b)
