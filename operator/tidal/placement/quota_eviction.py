"""Which of a namespace's running jobs to evict so that a higher-priority job fits the namespace's quota.

A ResourceQuota counts GPUs wherever they are, so this is a cover over GPU counts, not a
placement (where the job then goes is `plan_preemption`'s business, on the cluster as it will be
once these victims have left). The same order as every tidal eviction: the fewest GPUs that
cover the shortfall, then the fewest victims, then the lowest priorities. An elastic gang may give
back its highest DP replicas (down to its minimum) rather than go whole.

Exact: a dynamic programme over the GPU totals reachable, kept only below the shortfall (a total
that covers it is final, adding a victim only makes it worse), so its size is bounded by the
shortfall's distinct sums, not by the number of subsets. Above `EXACT_MAX_WORK` (options times
totals: hundreds of candidates of odd sizes and a shortfall of thousands of GPUs), a greedy in
Kueue's manner: whole gangs, lowest priority and largest first, until covered, then each dropped
again (largest first) if the rest still covers, and the last one shrunk to its fewest replicas
that still cover.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

from tidal.placement.preemption import Eviction, RunningGang

EXACT_MAX_WORK = 400_000
"""Options times GPU totals (in units) above which the greedy plans: about half a second of the
exact programme on this machine; the operator's cycle is single-threaded."""

_Partial = tuple[int, tuple[int, ...], Eviction | None, "_Partial | None"]
"""(victims, their priorities highest first, the last eviction, the partial it extends) of one
reachable GPU total: a chain, so extending a partial copies nothing but the priorities."""


def plan_quota_eviction(candidates: Sequence[RunningGang], shortfall: int) -> tuple[Eviction, ...] | None:
    """The evictions among `candidates` (already filtered: the namespace's preemptible gangs of
    lower priority, counted by the quota) that free at least `shortfall` GPUs, best first by GPUs,
    then victims, then priorities; () when nothing is short; None when all of them would not do.

    Totals are counted in units of the options' greatest common divisor (GPU counts are multiples
    of 4 or 8), and a partial's priorities are built only when its victim count does not already
    lose: 500 candidates and a 2,048-GPU shortfall plan in a fraction of a second."""
    if shortfall <= 0:
        return ()
    options = [(gang, found) for gang in sorted(candidates, key=lambda g: g.name) if (found := _options(gang))]
    unit = 0
    for _, evictions in options:
        for eviction in evictions:
            unit = gcd(unit, eviction.gpus)
    if unit == 0:
        return None
    need = -(-shortfall // unit)
    if sum(len(evictions) for _, evictions in options) * need > EXACT_MAX_WORK:
        return _greedy(options, shortfall)
    reachable: dict[int, _Partial] = {0: (0, (), None, None)}
    for gang, evictions in options:
        grown = dict(reachable)
        for total, partial in reachable.items():
            if total >= need:
                continue
            victims = partial[0] + 1
            for eviction in evictions:
                key = total + eviction.gpus // unit
                held = grown.get(key)
                if held is not None and held[0] < victims:
                    continue
                priorities = tuple(sorted((*partial[1], gang.priority), reverse=True))
                if held is None or (victims, priorities) < held[:2]:
                    grown[key] = (victims, priorities, eviction, partial)
        reachable = grown
    covering = [(total, partial) for total, partial in reachable.items() if total >= need]
    if not covering:
        return None
    _, partial = min(covering, key=lambda item: (item[0], item[1][0], item[1][1]))
    chosen: list[Eviction] = []
    link: _Partial | None = partial
    while link is not None and link[2] is not None:
        chosen.append(link[2])
        link = link[3]
    return tuple(reversed(chosen))


def _greedy(options: list[tuple[RunningGang, list[Eviction]]], shortfall: int) -> tuple[Eviction, ...] | None:
    """Whole gangs, lowest priority and largest first, until `shortfall` is covered; then each
    taken gang dropped (largest first) if the others still cover it; then each remaining one
    shrunk to its smallest option that still covers."""
    order = sorted(options, key=lambda item: (item[0].priority, -item[0].gpus, item[0].name))
    taken: list[tuple[RunningGang, list[Eviction]]] = []
    total = 0
    for gang, evictions in order:
        if total >= shortfall:
            break
        taken.append((gang, evictions))
        total += evictions[-1].gpus
    if total < shortfall:
        return None
    chosen = {gang.name: evictions[-1] for gang, evictions in taken}
    for gang, _ in sorted(taken, key=lambda item: -item[0].gpus):
        if total - chosen[gang.name].gpus >= shortfall:
            total -= chosen.pop(gang.name).gpus
    for gang, evictions in taken:
        if gang.name in chosen:
            fits = [e for e in evictions if total - chosen[gang.name].gpus + e.gpus >= shortfall]
            smallest = min(fits, key=lambda e: e.gpus)
            total += smallest.gpus - chosen[gang.name].gpus
            chosen[gang.name] = smallest
    return tuple(chosen[gang.name] for gang, _ in taken if gang.name in chosen)


def _options(gang: RunningGang) -> list[Eviction]:
    """Ways to take GPUs from one gang: its top k replicas (elastic, down to its minimum), or all of it."""
    n = len(gang.replicas)
    out = []
    if gang.min_replicas is not None:
        for k in range(1, n - gang.min_replicas + 1):
            if k == n:
                break
            replicas = tuple(range(n - k, n))
            gpus = sum(g for r in replicas for _, g in gang.replicas[r])
            out.append(Eviction(gang.name, replicas, False, gpus))
    out.append(Eviction(gang.name, tuple(range(n)), True, gang.gpus))
    return [e for e in out if e.gpus > 0]
