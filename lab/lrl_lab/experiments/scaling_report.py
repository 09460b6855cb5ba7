"""The tables of :mod:`lrl_lab.experiments.scaling`: measured inputs, then the projection by layout and bound."""

from __future__ import annotations

import statistics

from lrl_lab.experiments.workload import BATCH, BOUNDS, LAYOUTS


def markdown(inputs: dict, rows: dict) -> str:
    d = inputs["durations"]
    mean_d = statistics.fmean(d)
    cap = BATCH / inputs["trainer"]
    lines = [
        f"Measured on this machine: {len(d)} episodes, mean {mean_d:.2f} s (median {statistics.median(d):.2f} s, "
        f"max {max(d):.2f} s); trainer {inputs['trainer']:.3f} s per step of {BATCH} episodes outside waiting for "
        f"data, so at most {cap:.0f} episodes/s; weight load {1000 * inputs['switch']:.1f} ms.",
        "",
    ]
    for grow in (False, True):
        lines.append(
            "Batch growing with the slots (64 a step per 64 slots):" if grow else f"Batch fixed at {BATCH}:"
        )
        lines.append("")
        head = " | ".join("sync" if eta == 0 else f"bound {eta}" for eta in BOUNDS)
        lines += [
            f"| slots x workers | batch | generation capacity (ep/s) | {head} |",
            "|" + "---|" * (3 + len(BOUNDS)),
        ]
        for total, layouts in LAYOUTS.items():
            for per, workers in layouts:
                batch = max(BATCH, total) if grow else BATCH
                cells = []
                for eta in BOUNDS:
                    r = rows[(total, per, workers, batch, eta)]
                    mark = " T" if r["trainer_busy"] > 0.9 else ""
                    cells.append(
                        f"{r['episodes_per_s']:.0f} ({r['slot_util']:.2f}, {r['staleness']:.2f}){mark}"
                    )
                lines.append(
                    f"| {per} x {workers} | {batch} | {total / mean_d:.0f} | " + " | ".join(cells) + " |"
                )
        lines.append("")
    lines.append(
        "Cells: trained episodes per second (slot use, mean token staleness); T: the trainer computes over 90% "
        "of the time (the trainer is the bottleneck)."
    )
    return "\n".join(lines)
