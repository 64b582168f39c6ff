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
    for wanted in range(request.groups, 0, -1):
        sized = replace(request, groups=wanted, group_ids=None)
        direct = plan_gang(snapshot, sized)
        if isinstance(direct, PlacementPlan):
            if wanted == request.groups:
                return CapacityPlan(wanted, direct, (), "free GPUs")
            free_only = CapacityPlan(wanted, direct, (), "free GPUs")
            break
    else:
        free_only = CapacityPlan(0, None, (), "no free room")
    over_budget = False
    for wanted in range(request.groups, free_only.replicas, -1):
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
    if over_budget:
        return replace(free_only, reason=f"{free_only.reason}; the disruption budget allows no more evictions")
    return free_only
