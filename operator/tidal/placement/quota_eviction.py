"""Which of a namespace's running jobs to evict so that a higher-priority job fits the namespace's quota.

A ResourceQuota counts GPUs wherever they are, so this is a cover over GPU counts, not a
placement (where the job then goes is `plan_preemption`'s business, on the cluster as it will be
once these victims have left). The same order as every tidal eviction: the fewest GPUs that
cover the shortfall, then the fewest victims, then the lowest priorities. An elastic gang may give
back its highest DP replicas (down to its minimum) rather than go whole.

Exact: a dynamic programme over the GPU totals reachable, kept only below the shortfall (a total
that covers it is final, adding a victim only makes it worse), so its size is bounded by the
shortfall's distinct sums, not by the number of subsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

from tidal.placement.preemption import Eviction, RunningGang

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
    options = [(gang, _options(gang)) for gang in sorted(candidates, key=lambda g: g.name)]
    unit = 0
    for _, evictions in options:
        for eviction in evictions:
            unit = gcd(unit, eviction.gpus)
    if unit == 0:
        return None
    need = -(-shortfall // unit)
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
