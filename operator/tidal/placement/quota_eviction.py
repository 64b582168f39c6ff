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

from tidal.placement.preemption import Eviction, RunningGang

_Partial = tuple[int, tuple[int, ...], tuple[Eviction, ...]]
"""(victims, their priorities highest first, evictions) of one reachable GPU total."""


def plan_quota_eviction(candidates: Sequence[RunningGang], shortfall: int) -> tuple[Eviction, ...] | None:
    """The evictions among `candidates` (already filtered: the namespace's preemptible gangs of
    lower priority, counted by the quota) that free at least `shortfall` GPUs, best first by GPUs,
    then victims, then priorities; () when nothing is short; None when all of them would not do."""
    if shortfall <= 0:
        return ()
    reachable: dict[int, _Partial] = {0: (0, (), ())}
    for gang in sorted(candidates, key=lambda g: g.name):
        grown = dict(reachable)
        for total, (victims, priorities, evictions) in reachable.items():
            if total >= shortfall:
                continue
            for eviction in _options(gang):
                candidate = (
                    victims + 1,
                    tuple(sorted((*priorities, gang.priority), reverse=True)),
                    (*evictions, eviction),
                )
                key = total + eviction.gpus
                if key not in grown or candidate[:2] < grown[key][:2]:
                    grown[key] = candidate
        reachable = grown
    covering = [(total, partial) for total, partial in reachable.items() if total >= shortfall]
    if not covering:
        return None
    _, (_, _, evictions) = min(covering, key=lambda item: (item[0], item[1][0], item[1][1]))
    return evictions


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
