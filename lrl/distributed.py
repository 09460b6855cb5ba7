"""The rank arithmetic of data parallelism (Lightning DDP), in one place.

Each rank trains on its own episodes. The minibatches are one shuffle of the *global* batch (the same draw
on every rank), each rank keeping its own rows; each rank's loss is scaled to its share of the global
per-token mean, so DDP's gradient average equals the single-process gradient of the same global batch up to
floating-point summation order. Logged metrics are weighted means (and maxima) over all ranks' episodes and
tokens, reduced in one all-reduce per step. In a single process every function is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks."""

    world: int = 1
    rank: int = 0
    device: torch.device = torch.device("cpu")

    @classmethod
    def of(cls, module) -> Ranks:
        """The ranks of a LightningModule's trainer (one process when it has none)."""
        trainer = module._trainer
        if trainer is None or trainer.world_size == 1 or not dist.is_initialized():
            return cls(device=module.device)
        return cls(trainer.world_size, trainer.global_rank, module.device)

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or max) of a tensor over ranks; the tensor itself in a single process."""
        if self.world == 1:
            return x
        y = x.to(self.device)
        dist.all_reduce(y, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return y.to(x.device)

    def minibatch_rows(
        self, n_local: int, minibatches: int, generator: torch.Generator
    ) -> list[torch.Tensor]:
        """This rank's rows of each shuffled minibatch: one permutation of the global batch, chunked, each
        chunk cut to the rows this rank holds. One process: plain shuffled chunks."""
        perm = torch.randperm(n_local * self.world, generator=generator)
        chunks = perm.chunk(minibatches)
        if self.world == 1:
            return list(chunks)
        lo = self.rank * n_local
        return [c[(c >= lo) & (c < lo + n_local)] - lo for c in chunks]

    def loss_share(self, local_tokens: torch.Tensor, global_tokens: torch.Tensor) -> float:
        """Factor that turns this rank's per-token mean into its share of the global mean (1 in one process)."""
        if self.world == 1:
            return 1.0
        share = local_tokens.double().cpu().clamp(min=1) * self.world / global_tokens.clamp(min=1)
        return share.float().item()

    def weighted_means(
        self, means: dict[str, tuple[float, float]], maxes: dict[str, float]
    ) -> dict[str, float]:
        """{key: (value, weight)} -> sum(value * weight) / sum(weight) over ranks, and maxima over ranks.

        A key whose total weight is 0 is left out (never NaN)."""
        if self.world == 1:
            return {**{k: v for k, (v, w) in means.items() if w > 0}, **maxes}
        keys = list(means)
        sums = self.all_reduce(
            torch.tensor([[means[k][0] * means[k][1], means[k][1]] for k in keys], dtype=torch.float64)
        )
        top = self.all_reduce(torch.tensor(list(maxes.values()), dtype=torch.float64), "max")
        out = {k: (s / w).item() for k, (s, w) in zip(keys, sums) if w > 0}
        return {**out, **{k: v.item() for k, v in zip(maxes, top)}}

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenation over ranks of a 1-D tensor whose length differs per rank (for global statistics)."""
        if self.world == 1:
            return x
        parts: list = [None] * self.world
        dist.all_gather_object(parts, x.detach().cpu())
        return torch.cat(parts).to(x.device)

    def gather_objects(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...]; [obj] in a single process."""
        if self.world == 1:
            return [obj]
        parts: list = [None] * self.world
        dist.all_gather_object(parts, obj)
        return parts
