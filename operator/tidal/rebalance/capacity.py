"""Where inference replicas come from, in the order the operators of such clusters ask for:
free GPUs; then shrinking elastic training by whole DP replicas (never below minDP); then
suspending whole preemptible jobs, lowest priority first. Victims that free whole supernodes are
preferred (the preemption planner's rule), and evictions stay within a GPU budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tidal.placement import (
    Eviction,
    GangRequest,
    PlacementPlan,
    PreemptionPlan,
    RunningGang,
    plan_gang,
    plan_preemption,
)
from tidal.topology.snapshot import ClusterSnapshot


@dataclass(frozen=True)
class CapacityPlan:
    replicas: int
    """How many of the requested replicas this plan makes room for (0 if none)."""
    placement: PlacementPlan | None
    evictions: tuple[Eviction, ...]
    reason: str

    @property
    def evicted_gpus(self) -> int:
        return sum(e.gpus for e in self.evictions)


SHRINK = "#shrink"


def _shrinkable(gang: RunningGang) -> RunningGang | None:
    """The part of an elastic gang that may go without suspending it: its replicas above minDP."""
    if gang.min_replicas is None or len(gang.replicas) <= gang.min_replicas:
        return None
    return replace(gang, name=gang.name + SHRINK, replicas=gang.replicas[gang.min_replicas :], min_replicas=0)


def _stages(running: list[RunningGang], priority: int) -> list[tuple[str, list[RunningGang]]]:
    eligible = [g for g in running if g.preemptible and g.priority < priority]
    shrink_only = [s for g in eligible if (s := _shrinkable(g)) is not None]
    stages = [("shrink elastic training", shrink_only)]
    for tier in sorted({g.priority for g in eligible}):
        gangs = [g for g in eligible if g.priority <= tier]
        gangs += [s for g in eligible if g.priority > tier and (s := _shrinkable(g)) is not None]
        stages.append((f"suspend training of priority <= {tier}", gangs))
    return stages


def _as_real(evictions: tuple[Eviction, ...], running: list[RunningGang]) -> tuple[Eviction, ...]:
    """Map evictions planned on shrink-only views back to the real gangs' replica indices."""
    by_name = {g.name: g for g in running}
    out = []
    for e in evictions:
        name = e.gang.removesuffix(SHRINK)
        gang = by_name[name]
        offset = (gang.min_replicas or 0) if e.gang.endswith(SHRINK) else 0
        replicas = tuple(r + offset for r in e.replicas)
        out.append(Eviction(name, replicas, len(replicas) == len(gang.replicas), e.gpus))
    return tuple(out)


def plan_capacity(
    snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang], budget_gpus: int | None
) -> CapacityPlan:
    """Room for up to `request.groups` replicas (one group each): free first, then training."""
    direct = plan_gang(snapshot, request)
    if isinstance(direct, PlacementPlan):
        return CapacityPlan(request.groups, direct, (), "free GPUs")
    fitting = min(direct.groups_fitting_now, request.groups)  # the engine counts what fits now
    partial = plan_gang(snapshot, replace(request, groups=fitting, group_ids=None)) if fitting else None
    if isinstance(partial, PlacementPlan):
        free_only = CapacityPlan(fitting, partial, (), "free GPUs")
    else:
        free_only = CapacityPlan(0, None, (), "no free room")
    over_budget = False

    def with_evictions(wanted: int) -> CapacityPlan | None:
        nonlocal over_budget
        sized = replace(request, groups=wanted, group_ids=None)
        for why, gangs in _stages(running, request.priority):
            if not gangs:
                continue
            result = plan_preemption(snapshot, sized, gangs)
            if not isinstance(result, PreemptionPlan):
                continue
            evictions = _as_real(result.evictions, running)
            if budget_gpus is not None and sum(e.gpus for e in evictions) > budget_gpus:
                over_budget = True
                continue
            return CapacityPlan(wanted, result.placement, evictions, why)
        return None

    # The most replicas some stage makes room for: all of them usually; else a binary search,
    # since making room for fewer replicas never needs more evictions.
    best = with_evictions(request.groups)
    if best is None:
        low, high = free_only.replicas, request.groups - 1  # `low` replicas fit without evictions
        while low < high:
            mid = (low + high + 1) // 2
            found = with_evictions(mid)
            if found is None:
                high = mid - 1
            else:
                best, low = found, mid
    if best is not None and best.replicas > free_only.replicas:
        return best
    if over_budget:
        return replace(free_only, reason=f"{free_only.reason}; the disruption budget allows no more evictions")
    return free_only
