"""A step's work counted as it runs, and the floor of each phase on this machine: its matrix products alone.

``profile_step.py`` counts what each phase of a step computes (:class:`Work`): the rows of every decode step, the
tokens of every prefill, the tokens that run through the model's body and the positions its LM head scores in
each forward with and without gradients. :class:`Floors` then times the model's own linear layers, and nothing
else, at exactly those shapes on this machine:

- **decode**: every linear layer and the LM head applied to ``[b, in]`` for each decode step's b rows, as the
  engine computes them (:func:`lrl.decode_step.few_rows_linears`); and, since a decode step reads every weight once,
  the weights' bytes at the machine's measured read bandwidth; the floor is the larger of the two sums;
- **forward** (the update's, with gradients) and **old_logp** (without): the layers at ``[tokens, in]`` and the
  head at ``[positions, hidden]``;
- **backward**: the gradients of the same products (weights and inputs), where the update's forward ran.

FLOPs are 2 x weights x rows for a forward, twice that for its backward; attention's own products (a few percent
at these lengths) and the element-wise work are not in them: a phase's share of its floor says how much of its
time is matrix products at the machine's own rate at its shapes, the rest being everything else it does.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from bench_real_model import best  # bench/ is on the path of every bench that runs this


class Work:
    """What the phases of the current step compute (reset with :meth:`take`)."""

    def __init__(self):
        self.counts: dict[str, list] = defaultdict(list)

    def add(self, phase: str, rows: int, head: int | None = None) -> None:
        """A forward of `rows` rows through the body (and `head` positions through the LM head; None: the same)."""
        self.counts[phase].append((int(rows), int(rows if head is None else head)))

    def take(self) -> dict[str, list]:
        out, self.counts = dict(self.counts), defaultdict(list)
        return out


def body_tokens(ids: torch.Tensor, attention_mask: torch.Tensor, prefix: torch.Tensor | None) -> int:
    """Tokens a forward runs through the body: every real token, each distinct prompt once where rows share it."""
    if prefix is None:
        return int(attention_mask.sum())
    prompts = {tuple(ids[r, : int(prefix[r])].tolist()) for r in range(len(ids))}
    rest = int((attention_mask.sum(-1) - prefix).clamp(min=0).sum())
    return sum(map(len, prompts)) + rest


class Floors:
    """The model's linear layers timed alone at a phase's shapes (memoised per row count)."""

    def __init__(self, model, repeats: int = 3):
        head = model.get_output_embeddings()
        self.head = head
        self.body = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
        self.body_params = sum(m.weight.numel() for m in self.body)
        self.head_params = head.weight.numel()
        self.weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in [*self.body, head])
        self.repeats = repeats
        self._forward: dict[tuple[int, int], float] = {}
        self._backward: dict[tuple[int, int], float] = {}
        self.bandwidth = self._read_bandwidth()

    def _read_bandwidth(self) -> float:
        """Bytes a second this machine reads from memory (a sum over 512 MiB)."""
        big = torch.ones(2**27)
        seconds = best(lambda: big.sum(), self.repeats)
        return big.numel() * 4 / seconds

    def _inputs(self, rows: int, head: int, grad: bool):
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(rows, m.in_features, generator=g, requires_grad=grad) for m in self.body]
        xs.append(torch.randn(head, self.head.in_features, generator=g, requires_grad=grad))
        return xs

    def forward(self, rows: int, head: int, engine: bool = False) -> float:
        """Seconds of the layers' forwards at `rows` (the head at `head`), without gradients."""
        key = (rows, head, engine)
        if key not in self._forward:
            from lrl.decode_step import few_rows_linears

            xs = self._inputs(rows, head, False)
            layers = [*self.body, self.head]
            model = torch.nn.ModuleList(layers)

            def run():
                with torch.no_grad(), few_rows_linears(model) if engine else contextlib.nullcontext():
                    for m, x in zip(layers, xs):
                        m(x)

            self._forward[key] = best(run, self.repeats)
        return self._forward[key]

    def backward(self, rows: int, head: int) -> float:
        """Seconds of the same products' backward (the gradients of weights and inputs) at `rows`."""
        key = (rows, head)
        if key not in self._backward:
            xs = self._inputs(rows, head, True)
            layers = [*self.body, self.head]
            outs = [m(x) for m, x in zip(layers, xs)]
            grads = [torch.ones_like(o) for o in outs]

            def run():
                for o, g in zip(outs, grads):
                    o.backward(g, retain_graph=True)

            self._backward[key] = best(run, self.repeats)
            for m in layers:
                m.weight.grad = None
        return self._backward[key]

    def flops(self, rows: int, head: int) -> float:
        return 2.0 * (self.body_params * rows + self.head_params * head)

    def phase(self, name: str, calls: list[tuple[int, int]]) -> tuple[float, float]:
        """A phase's (FLOPs, floor seconds) from its forwards' (rows, head positions)."""
        if not calls:
            return 0.0, 0.0
        if name == "backward":
            return 2 * sum(self.flops(r, h) for r, h in calls), sum(self.backward(r, h) for r, h in calls)
        flops = sum(self.flops(r, h) for r, h in calls)
        if name == "decode":
            products = sum(self.forward(r, h, engine=True) for r, h in calls)
            return flops, max(products, len(calls) * self.weight_bytes / self.bandwidth)
        return flops, sum(self.forward(r, h) for r, h in calls)


def main(argv=None) -> int:
    """The floors at given row counts for a model, printed: its products' GFLOP/s forward, and forward + backward."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_real_model import load_checked, machine, model_problem

    from lrl.cli import OneLineParser

    p = OneLineParser(prog="floors.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a named model or a save_pretrained folder")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 1024, 2048], help="rows of each product")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if problem := model_problem(args.model):
        p.error(problem)
    if args.threads < 1 or min(args.rows) < 1:
        p.error("--threads and every --rows must be at least 1")
    torch.set_num_threads(args.threads)
    model, _ = load_checked(p, args.model)
    floors = Floors(model)
    print(f"machine: {machine()}")
    print(f"weights {floors.weight_bytes / 2**20:.0f} MiB; memory read {floors.bandwidth / 1e9:.1f} GB/s")
    print(
        f"{'rows':>6} {'forward s':>10} {'GFLOP/s':>8} {'engine s':>9} {'GFLOP/s':>8} {'fwd+bwd s':>10} {'GFLOP/s':>8}"
    )
    for rows in args.rows:
        flops = floors.flops(rows, rows)
        plain, engine = floors.forward(rows, rows), floors.forward(rows, rows, engine=True)
        both = plain + floors.backward(rows, rows)
        print(f"{rows:>6} {plain:10.4f} {flops / plain / 1e9:8.0f} {engine:9.4f} {flops / engine / 1e9:8.0f} "
              f"{both:10.4f} {3 * flops / both / 1e9:8.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
