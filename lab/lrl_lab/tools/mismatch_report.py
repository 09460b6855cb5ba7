"""The mismatch tool's table and figure, from the results of :func:`lrl_lab.tools.mismatch.measure`."""

from __future__ import annotations

from pathlib import Path

from lrl.stats import PROBABILITY_BINS, cdf_points
from lrl_lab.tools.mismatch_arms import arms_report


def report(res: dict) -> str:
    """The comparison table, the probability-bin table and the ratio ranges, as text."""
    width = max(len(n) for n in res["comparisons"]) + 2
    lines = [
        f"{res['model']} | {res['engine']} {res['engine_dtype']} | fp32 head {res['fp32_head']} | ragged {res['ragged']}"
        f" | top-p {res['top_p']}"
        f" | top-k {res['top_k']} | {res['prompts']} prompts x {res['new_tokens']} tokens = {res['tokens']}"
    ]
    lines.append(
        f"{'comparison':<{width}}{'mean|d|':>10}{'median':>10}{'p99':>10}{'max':>10}{'max|seq sum|':>14}"
        f"{'over cap':>10}{'out band':>10}"
    )
    for name, s in res["comparisons"].items():
        lines.append(
            f"{name:<{width}}{s['mean']:>10.2e}{s['median']:>10.2e}{s['p99']:>10.2e}{s['max']:>10.2e}"
            f"{s['max_seq_sum']:>14.3f}{s.get('over_cap', float('nan')):>10.4f}{s.get('outside_band', float('nan')):>10.4f}"
        )
    lines.append("")
    lines.append(f"{res['headline']}, by the engine's probability of the sampled token:")
    for b in res["bins"]:
        close = "]" if b["hi"] == PROBABILITY_BINS[-1][1] else ")"
        lines.append(
            f"  p in [{b['lo']:.1f}, {b['hi']:.1f}{close}  {b['count']:5d} tokens  mean |d| {b['mean_abs']:.2e}"
        )
    r = res["ratios"]
    lines.append(
        f"token ratios pi/mu: [{r['token_min']:.4f}, {r['token_max']:.4f}]   "
        f"sequence ratios: [{r['seq_min']:.4f}, {r['seq_max']:.4f}]"
    )
    if res.get("arms"):
        lines += arms_report(res["arms"])
    lines.append("over cap: share of tokens with pi/mu > 2 (TIS); out band: outside [0.5, 5] (MIS)")
    return "\n".join(lines)


def plot(res: dict, folder: str | Path) -> Path:
    """Two panels: the CDF of |d| per comparison (log x), and mean |d| per engine-probability bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6))
    styles = ["-", "--", ":", "-."]
    for i, (name, d) in enumerate(res["_diffs"].items()):
        x, f = cdf_points(d)
        zero = float((d == 0).float().mean())
        label = f"{name} ({zero:.1%} exactly 0)" if zero else name
        keep = x > 0  # exact zeros have no place on a log axis; the curve starts at their share
        left.plot(x[keep], f[keep], styles[i % len(styles)], label=label, lw=1.5, drawstyle="steps-post")
    left.set_xscale("log")
    left.set_xlabel("|log pi - log mu| (nats)")
    left.set_ylabel("fraction of tokens at or below")
    left.set_title(f"CDF of the per-token mismatch ({res['tokens']} tokens)")
    left.grid(alpha=0.3)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    names = [n for n in res["bins_by_comparison"] if n.endswith("vs engine")]
    labels = [
        f"[{lo:.1f}, {hi:.1f}{']' if i == len(PROBABILITY_BINS) - 1 else ')'}"
        for i, (lo, hi) in enumerate(PROBABILITY_BINS)
    ]
    bar = 0.8 / max(len(names), 1)
    for j, name in enumerate(names):
        vals = [b["mean_abs"] if b["count"] else float("nan") for b in res["bins_by_comparison"][name]]
        right.bar([i + j * bar for i in range(len(labels))], vals, bar, label=name)
    counts = [b["count"] for b in res["bins"]]
    right.set_xticks([i + bar * (len(names) - 1) / 2 for i in range(len(labels))])
    right.set_xticklabels([f"{lab}\n{c} tok" for lab, c in zip(labels, counts)])
    right.set_xlabel("engine probability of the sampled token")
    right.set_yscale("log")
    right.set_ylabel("mean |log pi - log mu| (nats, log scale)")
    right.set_title("mismatch by engine probability")
    right.grid(alpha=0.3, axis="y")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.suptitle(f"{res['model']}: engine {res['engine_dtype']}, fp32 head {res['fp32_head']}", fontsize=10)
    fig.tight_layout()
    path = folder / "mismatch.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
