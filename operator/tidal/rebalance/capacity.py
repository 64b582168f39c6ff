"""Where inference replicas come from, in the order the operators of such clusters ask for:
free GPUs; then shrinking elastic training by whole DP replicas (never below minDP); then
suspending whole preemptible jobs, lowest priority first. Victims that free whole supernodes are
preferred (the preemption planner's rule), and evictions stay within a GPU budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tidal.placement import Eviction, GangRequest, PlacementPlan, RunningGang, plan_gang
from tidal.placement.preemption import Choice, EvictionSearch, eligible_gangs, sized
from tidal.rebalance.resize_cost import ResizeCosts, ResizeKind
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


def _stages(search: EvictionSearch) -> list[tuple[str, list[int]]]:
    """Each stage as a limit per candidate on its ladder: shrink elastic training above minDP first,
    then suspend whole gangs tier by tier, lowest priority first (higher tiers may still shrink)."""
    shrink = search.shrink_limits()
    stages = [("shrink elastic training", shrink)]
    for tier in sorted({v.gang.priority for v in search.victims}):
        limits = [v.top if v.gang.priority <= tier else shrink[v.index] for v in search.victims]
        stages.append((f"suspend training of priority <= {tier}", limits))
    return stages


def plan_capacity(
    snapshot: ClusterSnapshot,
    request: GangRequest,
    running: list[RunningGang],
    budget_gpus: int | None,
    costs: ResizeCosts | None = None,
) -> CapacityPlan:
    """Room for up to `request.groups` replicas (one group each): free first, then training.

    The most replicas any stage makes room for within the budget; among stages reaching that
    many, the earliest (shrink before suspend, lower priority tiers first). All stages share one
    EvictionSearch, so the per-node aggregation of the running gangs is done once.

    With `costs`, the ways are weighed by the GPU-seconds of no progress they cause
    (`resize_cost`): when the plan shrinks a Restart job (which stalls every GPU of it for a save
    and a reload), the same search is made again with Restart jobs only suspended whole, and the
    cheaper plan of the two wins if it makes room for as many replicas and suspends no job of a
    higher priority than the first plan suspends (or, if it only shrinks, than the lowest
    priority it shrinks).
    """
    direct = plan_gang(snapshot, request)
    if isinstance(direct, PlacementPlan):
        return CapacityPlan(request.groups, direct, (), "free GPUs")
    fitting = min(direct.groups_fitting_now, request.groups)  # the engine counts what fits now
    partial = plan_gang(snapshot, sized(request, fitting)) if fitting else None
    if isinstance(partial, PlacementPlan):
        free_only = CapacityPlan(fitting, partial, (), "free GPUs")
    else:
        free_only = CapacityPlan(0, None, (), "no free room")
    eligible = eligible_gangs(running, request.priority)
    if not eligible:
        return free_only
    plan = _best_plan(snapshot, request, eligible, budget_gpus, direct.groups_fitting_now, free_only)
    if costs is None:
        return plan
    gangs = {g.name: g for g in eligible}
    if not any(_restart_shrink(e, gangs) for e in plan.evictions):
        return plan
    spared = restart_jobs_whole(eligible)
    other = _best_plan(snapshot, request, spared, budget_gpus, direct.groups_fitting_now, free_only)
    if (
        other.replicas >= plan.replicas
        and _suspended_tier(other, gangs) <= _tier_allowed(plan, gangs)
        and plan_cost(other, gangs, costs) < plan_cost(plan, gangs, costs)
    ):
        return replace(other, reason=f"{other.reason} (cheaper than shrinking Restart jobs)")
    return plan


def restart_jobs_whole(gangs: list[RunningGang]) -> list[RunningGang]:
    """The gangs with every Restart job evictable only whole (Live jobs may still shrink): the
    plan that spares Restart shrinks, and the simulator's tidal-no-restart-shrink ablation."""
    return [g if g.resize == ResizeKind.LIVE else replace(g, min_replicas=None) for g in gangs]


def _restart_shrink(eviction: Eviction, gangs: dict[str, RunningGang]) -> bool:
    return not eviction.whole and gangs[eviction.gang].resize != ResizeKind.LIVE


def _suspended_tier(plan: CapacityPlan, gangs: dict[str, RunningGang]) -> int:
    """The highest priority the plan suspends whole (-inf: none)."""
    return max((gangs[e.gang].priority for e in plan.evictions if e.whole), default=-(2**31))


def _tier_allowed(plan: CapacityPlan, gangs: dict[str, RunningGang]) -> int:
    """The highest priority a cheaper plan may suspend in this plan's stead: what this one
    suspends, or if it only shrinks, the lowest priority it shrinks (a suspension then replaces
    a shrink of the same or a higher priority, never the other way round)."""
    if any(e.whole for e in plan.evictions):
        return _suspended_tier(plan, gangs)
    return min(gangs[e.gang].priority for e in plan.evictions)


def plan_cost(plan: CapacityPlan, gangs: dict[str, RunningGang], costs: ResizeCosts) -> float:
    """GPU-seconds of no progress the plan's evictions cause (resize_cost), the GPUs freed aside."""
    total = 0.0
    for e in plan.evictions:
        gang = gangs[e.gang]
        model_gpus = max(gang.gpus // max(len(gang.replicas), 1), 1)
        if e.whole:
            total += costs.suspend_gpu_s(gang.gpus, model_gpus)
        else:
            total += costs.shrink_gpu_s(gang.resize, gang.gpus, e.gpus, model_gpus)
    return total


def _best_plan(
    snapshot: ClusterSnapshot,
    request: GangRequest,
    eligible: list[RunningGang],
    budget_gpus: int | None,
    base_groups: int,
    free_only: CapacityPlan,
) -> CapacityPlan:
    search = EvictionSearch(snapshot, request, eligible, base_groups=base_groups)
    # No stage can pay for more groups than a lower bound on their GPUs allows: caps every search below.
    affordable = request.groups if budget_gpus is None else search.affordable_groups(budget_gpus, request.groups)
    stages = _stages(search)
    best: tuple[int, str, Choice] | None = None
    for why, limits in stages:
        floor = best[0] if best is not None else free_only.replicas
        if not any(limits) or affordable <= floor:
            continue  # nothing to evict, or cannot beat an earlier stage (ties go to the earlier one)
        if budget_gpus is None:
            found = _most_groups(search, limits, request.groups, floor)
        else:
            found = _within_budget(search, limits, affordable, budget_gpus)
        if found is not None and found[0] > floor:
            best = (found[0], why, found[1])
        if best is not None and best[0] == request.groups:
            break
    if best is not None:
        wanted, why, choice = best
        placement = search.place(choice.levels, sized(request, wanted))
        if placement is not None:  # None only if the count and plan_gang disagree: then evict nobody
            return CapacityPlan(wanted, placement, search.evictions(choice.levels), why)
    # Blame the budget only when evictions could have made room without it (the last stage may take most).
    if budget_gpus is not None and search.max_groups(stages[-1][1]) > free_only.replicas:
        return replace(free_only, reason=f"{free_only.reason}; the disruption budget allows no more evictions")
    return free_only


def _most_groups(search: EvictionSearch, limits: list[int], wanted: int, floor: int) -> tuple[int, Choice] | None:
    """All `wanted` groups if the stage makes room for them, else the most it makes room for."""
    choice = search.solve(wanted, limits)
    if choice is not None:
        return wanted, choice
    reach = search.max_groups(limits)
    if reach <= floor:
        return None
    choice = search.solve(reach, limits)
    return (reach, choice) if choice is not None else None


def _within_budget(search: EvictionSearch, limits: list[int], cap: int, budget: int) -> tuple[int, Choice] | None:
    """The most groups (at most `cap`) this stage makes room for within `budget` GPUs, and how.

    The budgeted greedy gives a count it can afford; a binary search above it, using the exact /
    heuristic minimum for each count, looks for more (fewer groups never need more GPUs).
    """
    greedy = search.most_within(cap, limits, budget)
    low = min(greedy.groups, cap)
    if low <= search.base_groups:
        best = None
    else:
        best = greedy
        tidy = search.solve(low, limits)  # the cheapest way to that many may be cheaper than the greedy's
        if tidy is not None and tidy.gpus <= greedy.gpus:
            best = tidy
    high = cap
    while low < high:
        mid = (low + high + 1) // 2
        found = search.solve(mid, limits)
        if found is not None and found.gpus <= budget:
            best, low = found, mid
        else:
            high = mid - 1
    return (low, best) if best is not None else None
