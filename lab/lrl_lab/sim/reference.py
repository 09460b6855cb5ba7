"""A slot-scanning reference of the simulator's rules, written plainly to be checked by eye (docs/simulate.md).

Every event costs O(n_slots): the fill scans the slots, the next event time is a minimum over all of them, and
a sync pushes every in-flight end back one by one. :func:`lrl_lab.sim.simulate_pipeline` must agree with it to the
last bit (tests/sim/test_simulate.py); ``bench/bench_simulate.py`` times the two on the same run.
"""

from __future__ import annotations

import torch


def scan_reference(durs, n_slots, batch, train_time, sync_time, eta, interrupt, steps) -> dict:
    """The rules of lrl_lab.sim.pipeline without timeouts, failures or a consumption bound: durations [N] -> dict.

    Returns `events`, `time`, `throughput`, `gen_util`, `staleness_mean`, `staleness_max`, `staleness_hist`
    and `trained_duration`, computed as simulate_pipeline does (a ZeroDivisionError if no time passes).
    """
    todo = [float(x) for x in durs]
    slots: list[list | None] = [None] * n_slots  # [end, start, version, duration, start order]
    now = 0.0
    version = 0
    launched = 0
    ready: list[tuple[int, float]] = []  # finished (version, duration), in finishing order
    log: list[tuple] = []
    ages: list[int] = []
    lengths: list[float] = []
    step_end = None
    sync_end = None
    sync_wanted = False
    while version < steps:
        if sync_end is None and not (sync_wanted and not interrupt):
            for i in range(n_slots):
                if slots[i] is None and launched < (version + 1 + eta) * batch:
                    slots[i] = [now + todo[launched], now, version, todo[launched], launched]
                    launched += 1
        if step_end is None and sync_end is None and not sync_wanted and len(ready) >= batch:
            for v, d in ready[:batch]:
                ages.append(version - v)
                lengths.append(d)
            ready = ready[batch:]
            step_end = now + train_time
            log.append(("train", 0, now, step_end, version))
        candidates = [s[0] for s in slots if s is not None]
        candidates += [x for x in (step_end, sync_end) if x is not None]
        now = min(candidates)
        if sync_end == now:
            sync_end = None
            version += 1
        if step_end == now:
            step_end = None
            sync_wanted = True
        finished = sorted((s[4], i) for i, s in enumerate(slots) if s is not None and s[0] == now)
        for _, i in finished:
            end, start, v, d, _ = slots[i]
            slots[i] = None
            ready.append((v, d))
            log.append(("gen", i, start, end, v))
        if sync_wanted and (interrupt or all(s is None for s in slots)):
            sync_wanted = False
            sync_end = now + sync_time
            log.append(("sync", 0, now, sync_end, version))
            for s in slots:
                if s is not None:
                    s[0] += sync_time
    busy = 0.0
    for kind, _, start, end, _ in log:
        if kind == "gen":
            busy += end - start
    total = 0.0
    for d in lengths:
        total += d
    return dict(
        events=log,
        time=now,
        throughput=steps * batch / now * 3600,
        gen_util=busy / (n_slots * now),
        staleness_mean=torch.tensor(ages, dtype=torch.float32).mean().item(),
        staleness_max=max(ages),
        staleness_hist=[ages.count(k) for k in range(max(ages) + 1)],
        trained_duration=total / len(lengths),
    )
