"""Rows of one task run their common prompt once in the trainer's forward (lrl.logprobs ``prefix``): the same
log-probs, entropies and gradient as every whole row run on its own, on the real model's shape in fp32."""

import torch

import lrl.logprobs as logprobs
from lrl.logprobs import prompt_lengths, token_log_probs
from lrl.policy import load_policy


def batch(generator):
    """Three prompts of different lengths, three rows each with their own continuations of different lengths,
    right-padded; the action positions start at each prompt's last token, with an observation token inside."""
    prompts = [torch.randint(10, 1000, (n,), generator=generator) for n in (7, 12, 9)]
    rows, actions = [], []
    for g, prompt in enumerate(prompts):
        for j in range(3):
            rows.append(torch.cat([prompt, torch.randint(10, 1000, (5 + 3 * j + g,), generator=generator)]))
            actions.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    positions = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
        positions[i, actions[i] - 1 : len(row) - 1] = True
        positions[i, actions[i] + 2] = False  # an observation's token among the actions
    return ids, mask, positions


def test_a_shared_prompt_gives_every_rows_log_probs_entropies_and_gradient(smollm2_cut, monkeypatch):
    model = load_policy(smollm2_cut)[0].eval()
    monkeypatch.setattr(logprobs, "FULL_LOGITS_LIMIT", 0)  # the chunked path, as a real batch takes
    ids, mask, positions = batch(torch.Generator().manual_seed(0))
    prefix = prompt_lengths(positions)
    assert prefix.tolist() == [7] * 3 + [12] * 3 + [9] * 3
    forwards = []
    hook = model.base_model.register_forward_pre_hook(
        lambda m, a, kw: forwards.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    results = {}
    for name, pre in (("whole rows", None), ("shared", prefix)):
        model.zero_grad()
        forwards.clear()
        logp, ent = token_log_probs(model, ids, mask, 1.0, positions, entropy=True, prefix=pre)
        (logp * positions).sum().backward()
        results[name] = (logp, ent, [p.grad.clone() for p in model.parameters()])
    hook.remove()
    after = int((mask.sum(-1) - prefix).max())
    assert forwards == [(3, 12), (9, after)]  # the three prompts once each, then what follows them
    (a_logp, a_ent, a_grad), (b_logp, b_ent, b_grad) = results["whole rows"], results["shared"]
    torch.testing.assert_close(b_logp, a_logp, rtol=0, atol=5e-5)
    torch.testing.assert_close(b_ent, a_ent, rtol=0, atol=5e-5)
    assert (b_logp[~positions] == 0).all()
    for a, b in zip(a_grad, b_grad):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * a.abs().max().item())
