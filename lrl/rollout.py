"""Multi-turn rollouts in the TinyAgent gym, collation into the batch contract, and evaluation.

A rollout is driven by a *decoder*: any callable ``decode(seqs) -> [B, V]`` that returns, in fp32, the
log-probs of the next token for each token-id sequence in ``seqs`` (at the sampling temperature). The
trainer-style decoder below runs one full forward over the right-padded batch; samplers may supply
others (an engine-style KV-cache decoder, a decoder over rounded weights).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from lrl.gym import BugFixEnv, Task, WordTokenizer

Decoder = Callable[[list[list[int]]], torch.Tensor]
MAX_ACTION_TOKENS = 3  # the longest valid action is `answer K <eos>`


@dataclass
class Episode:
    """One episode as a single token sequence, with per-token tags for the tokens the policy generated."""

    task: Task
    ids: list[int]
    generated: list[bool] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    reward: float = 0.0
    reads: int = 0
    invalid: bool = False
    truncated: bool = False
    done: bool = False
    env_failure: bool = False  # the worker failed: no score, no gradient (see collate)

    def __post_init__(self):
        n = len(self.ids)
        self.generated, self.logp, self.version = [False] * n, [0.0] * n, [-1] * n

    def record(self, result) -> None:
        """Take in the env's StepResult for the last action: reward, flags, and the observation tokens."""
        self.reward += result.reward
        self.reads += result.info["action"] == "read"
        self.invalid |= result.info["invalid"]
        self.truncated |= result.info["truncated"]
        self.env_failure |= bool(result.info.get("env_failure", False))
        self.done = result.done
        self.extend(result.observation, False)

    def extend(self, ids: Sequence[int], generated: bool, logp=None, version: int = -1) -> None:
        self.ids.extend(ids)
        self.generated.extend([generated] * len(ids))
        self.logp.extend(logp if logp is not None else [0.0] * len(ids))
        self.version.extend([version] * len(ids))


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists -> ids [B, T] and attention_mask [B, T]."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.as_tensor(s)
        mask[row, : len(s)] = 1
    return ids, mask


def trainer_style_decoder(model, pad_id: int, temperature: float = 1.0) -> Decoder:
    """Decoder that re-runs the full right-padded sequences each step: seqs -> next-token logp [B, V]."""

    @torch.no_grad()
    def decode(seqs: list[list[int]]) -> torch.Tensor:
        ids, mask = pad_right(seqs, pad_id)
        device = next(model.parameters()).device
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [B, T, V]
        last = (mask.sum(-1) - 1).to(device)  # [B]
        rows = torch.arange(len(seqs), device=device)
        return torch.log_softmax(logits[rows, last].float() / temperature, dim=-1).cpu()

    return decode


def run_episodes(
    decode: Decoder,
    tasks: Sequence[Task],
    tok: WordTokenizer,
    generator: torch.Generator,
    version: int = 0,
    max_turns: int = 3,
    env_factory: Callable[[], BugFixEnv] | None = None,
) -> list[Episode]:
    """Roll out one episode per task in lockstep; every generated token is tagged with `version`."""
    envs = [env_factory() if env_factory else BugFixEnv(tok, max_turns) for _ in tasks]
    episodes = [Episode(task, env.reset(task)) for task, env in zip(tasks, envs)]
    active = list(range(len(episodes)))
    while active:
        actions: dict[int, list[int]] = {i: [] for i in active}
        generating = list(active)
        for _ in range(MAX_ACTION_TOKENS):
            logp = decode([episodes[i].ids for i in generating])  # [b, V]
            token = torch.multinomial(logp.exp(), 1, generator=generator)  # [b, 1]
            chosen = logp.gather(1, token).squeeze(1).tolist()
            token = token.squeeze(1).tolist()
            for i, t, lp in zip(generating, token, chosen):
                episodes[i].extend([t], True, [lp], version)
                actions[i].append(t)
            generating = [i for i, t in zip(generating, token) if t != tok.eos_id]
            if not generating:
                break
        for i in active:
            episodes[i].record(envs[i].step(actions[i]))
        active = [i for i in active if not episodes[i].done]
    return episodes


def collate(episodes: Sequence[Episode], pad_id: int) -> dict[str, torch.Tensor]:
    """Episodes -> the batch contract (see DESIGN): ids, masks, sample_logp, version, reward, task_id, ...

    An episode whose environment worker failed keeps its tokens and tags but gets an all-zero ``action_mask``
    row (no gradient, no mismatch statistics) and ``env_failure`` 1; its ``reward`` is 0 and is not a score.
    """
    ids, attention_mask = pad_right([e.ids for e in episodes], pad_id)  # [B, T]
    width = ids.shape[1]
    failed = torch.tensor([e.env_failure for e in episodes], dtype=torch.float32)  # [B]

    def per_token(values, fill, dtype):
        out = torch.full((len(episodes), width), fill, dtype=dtype)
        for row, v in enumerate(values):
            out[row, : len(v)] = torch.as_tensor(v, dtype=dtype)
        return out[:, 1:]  # tag of token t+1, aligned with the logits at position t

    return {
        "ids": ids,
        "attention_mask": attention_mask,
        "action_mask": per_token([e.generated for e in episodes], False, torch.bool).float() * (1 - failed)[:, None],
        "sample_logp": per_token([e.logp for e in episodes], 0.0, torch.float32),
        "version": per_token([e.version for e in episodes], -1, torch.long),
        "reward": torch.tensor([e.reward for e in episodes], dtype=torch.float32),
        "task_id": torch.tensor([e.task.task_id for e in episodes], dtype=torch.long),
        "reads": torch.tensor([e.reads for e in episodes], dtype=torch.float32),
        "invalid": torch.tensor([e.invalid for e in episodes], dtype=torch.float32),
        "truncated": torch.tensor([e.truncated for e in episodes], dtype=torch.float32),
        "length": attention_mask.sum(-1).float(),
        "env_failure": failed,
    }


@torch.no_grad()
def evaluate(
    model,
    tasks: Sequence[Task],
    episodes_per_task: int = 16,
    seed: int = 0,
    tok: WordTokenizer | None = None,
    temperature: float = 1.0,
    max_turns: int = 3,
) -> dict[str, float]:
    """Sample `episodes_per_task` episodes per task -> pass_rate, reads, invalid and mean length."""
    if tok is None:
        from lrl.gym import build_tokenizer, make_tasks

        tok = build_tokenizer(make_tasks("all"))
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    batch_tasks = [t for t in tasks for _ in range(episodes_per_task)]
    episodes = run_episodes(trainer_style_decoder(model, tok.pad_id, temperature), batch_tasks, tok, generator,
                            max_turns=max_turns)  # fmt: skip
    model.train(was_training)
    n = len(episodes)
    return {
        "pass_rate": sum(e.reward for e in episodes) / n,
        "reads": sum(e.reads for e in episodes) / n,
        "invalid": sum(e.invalid for e in episodes) / n,
        "length": sum(len(e.ids) for e in episodes) / n,
        "episodes": n,
    }
