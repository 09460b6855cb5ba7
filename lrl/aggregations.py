"""Aggregations: how the per-token terms of a loss become the one number a step differentiates (``--aggregation``).

A loss entry (:mod:`lrl.losses`) gives every action token its term l_{b,t} (0 off the actions). An aggregation is a
numerator and the units it is divided by, each a sum over rows, so a minibatch taken in microbatches (the memory
plan) or over ranks (DDP) has the loss of one forward over all its rows:

    loss = sum over the minibatch's rows of numerator(row) / sum over them of units(row)

Rows whose advantage is 0 stay out of the forward (they add nothing to the gradient) but count in the units. A row
counts as an episode where it holds at least one action token. With |y_b| the action tokens of episode b, B the
episodes of the minibatch:

- ``token-mean`` (DAPO's, and lrl's default): sum_{b,t} l_{b,t} / sum_b |y_b|: every action token weighs the same.
- ``seq-mean-token-mean`` (GRPO's, as the GRPO paper and verl's mode of that name write it): (1/B) sum_b
  (1/|y_b|) sum_t l_{b,t}: every episode weighs the same, and its tokens share its weight.
- ``seq-mean-token-sum`` (verl's): (1/B) sum_b sum_t l_{b,t}: a long episode weighs more.
- ``seq-mean-token-sum-norm`` (Dr. GRPO; TRL's ``dr_grpo``): sum_{b,t} l_{b,t} / (B L) with a constant L
  (``norm_tokens``; TRL takes its max_completion_length): a token's gradient depends on neither its episode's length
  nor the batch's token count.
- ``bnpo`` (TRL's): each rank's token mean, the ranks' means averaged: ``token-mean`` on one process; on several,
  each process weighs the same whatever its token count (TRL normalises by the tokens of each local batch).

An entry's factory takes what it reads (:func:`lrl.registry.supply`) and returns an :class:`Aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lrl.registry import AGGREGATIONS

register_aggregation = AGGREGATIONS.register  # factory(...) -> Aggregation


@dataclass(frozen=True)
class Aggregation:
    """``numerator(terms [b, T], mask [b, T]) -> []`` and ``units(mask [b, T]) -> []``, both sums over rows;
    ``per_rank``: the units are each rank's own (the ranks' losses averaged) rather than the sum over ranks."""

    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    units: Callable[[torch.Tensor], torch.Tensor]
    per_rank: bool = False


def token_sum(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_{b,t} l_{b,t} (a loss's terms are 0 off the action tokens): [b, T] -> []."""
    return terms.sum()


def tokens(mask: torch.Tensor) -> torch.Tensor:
    """The action tokens: [b, T] -> []."""
    return mask.sum()


def episodes(mask: torch.Tensor) -> torch.Tensor:
    """The rows holding at least one action token: [b, T] -> []."""
    return (mask.sum(-1) > 0).to(mask.dtype).sum()


def episode_token_means(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_b (1/|y_b|) sum_t l_{b,t}: [b, T] -> [] (a row without action tokens adds 0)."""
    return (terms.sum(-1) / mask.sum(-1).clamp(min=1)).sum()


@register_aggregation("token-mean")
def _token_mean() -> Aggregation:
    """every action token of the minibatch weighs the same (DAPO)"""
    return Aggregation(token_sum, tokens)


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean() -> Aggregation:
    """each episode weighs the same, its tokens share its weight (GRPO)"""
    return Aggregation(episode_token_means, episodes)


@register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum() -> Aggregation:
    """each episode's summed terms, averaged over episodes (a long episode weighs more)"""
    return Aggregation(token_sum, episodes)


@register_aggregation("seq-mean-token-sum-norm", uses=("norm_tokens",))
def _seq_mean_token_sum_norm(norm_tokens: int) -> Aggregation:
    """the summed terms over episodes x norm_tokens, a constant (Dr. GRPO)"""
    return Aggregation(token_sum, lambda mask: episodes(mask) * norm_tokens)


@register_aggregation("bnpo")
def _bnpo() -> Aggregation:
    """each rank's token mean, the ranks averaged (TRL's bnpo; token-mean on one process)"""
    return Aggregation(token_sum, tokens, per_rank=True)
