"""Baseline: gang-aware but topology-unaware first-fit, as the default scheduler plus a gang gate.

It is the yardstick for the benchmarks and the simulator, never used by the operator.
"""

from __future__ import annotations

from tidal.placement.types import GangRequest, GroupAssignment, PlacementPlan, Unplaceable, UnplaceableReason
from tidal.topology.snapshot import ClusterSnapshot


def plan_first_fit(snapshot: ClusterSnapshot, request: GangRequest) -> PlacementPlan | Unplaceable:
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    needed = request.groups * per_group
    pods: list[str] = []
    for sn in snapshot.supernodes.values():
        if sn.accelerator != request.accelerator:
            continue
        if not request.recovery and snapshot.largest_free_slice(sn.name) == 0:
            continue  # nothing free here: skipping it changes no choice, only the run time
        for node in snapshot.member_nodes(sn.name):
            if node.spare and not request.recovery:
                continue
            fit = min(node.free // gpp, needed - len(pods))
            pods.extend([node.name] * fit)
            if len(pods) == needed:
                break
        if len(pods) == needed:
            break
    if len(pods) < needed:
        return Unplaceable(
            request,
            UnplaceableReason.INSUFFICIENT_FREE_CAPACITY,
            f"needs {needed} pods of {gpp} {request.accelerator}; {len(pods)} fit",
            details={"pods_fitting_now": len(pods)},  # every free pod slot: the walk did not stop early
        )
    groups = []
    for g in range(request.groups):
        nodes = tuple(pods[g * per_group : (g + 1) * per_group])
        groups.append(GroupAssignment(request.group_id(g), snapshot.nodes[nodes[0]].supernode, nodes))
    return PlacementPlan(request, tuple(groups))


def split_groups(snapshot: ClusterSnapshot, plan: PlacementPlan) -> int:
    """Groups whose pods are not all inside one supernode (must be 0 for tidal's plans)."""
    return sum(1 for g in plan.groups if len({snapshot.nodes[n].supernode for n in g.nodes}) > 1)


def plan_constrained_first_fit(snapshot: ClusterSnapshot, request: GangRequest) -> PlacementPlan | Unplaceable:
    """Baseline: every group inside one supernode, supernodes and nodes taken in name order.

    What a competent user gets from Kueue TAS with a required rack-level slice or from Slurm's
    block plugin: topology constraints respected, no look at what the leftover is worth.
    """
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    groups: list[GroupAssignment] = []
    for name in sorted(snapshot.supernodes):
        if snapshot.supernodes[name].accelerator != request.accelerator:
            continue
        if snapshot.largest_free_slice(name) < request.group_gpus and not request.recovery:
            continue
        slots = [
            node.name
            for node in snapshot.member_nodes(name)
            if request.recovery or not node.spare
            for _ in range(node.free // gpp)
        ]
        while len(slots) >= per_group and len(groups) < request.groups:
            nodes, slots = tuple(slots[:per_group]), slots[per_group:]
            groups.append(GroupAssignment(request.group_id(len(groups)), name, nodes))
        if len(groups) == request.groups:
            return PlacementPlan(request, tuple(groups))
    return Unplaceable(
        request,
        UnplaceableReason.INSUFFICIENT_FREE_CAPACITY,
        f"needs {request.groups} groups of {request.group_gpus}; {len(groups)} fit inside supernodes",
    )


def plan_best_fit(snapshot: ClusterSnapshot, request: GangRequest) -> PlacementPlan | Unplaceable:
    """Baseline: every group inside one supernode, packed like Kueue TAS's BestFit.

    What Kueue TAS (required rack slices, BestFit) and Slurm's block plugin do: the fewest
    blocks (the best-fit block when one suffices, else the largest first), inside a block the
    supernodes with the most room first and, for the remainder, the tightest supernode that
    holds it; nodes fullest first. It knows nothing of the queue or of what leftovers are worth.
    """
    from tidal.placement.gang import _assign_nodes  # the same node order as tidal

    per_group = request.pods_per_group
    capacity: dict[str, int] = {}
    for name in snapshot.supernodes_with_free(request.accelerator, request.group_gpus):
        groups = snapshot.pod_slots(name, request.gpus_per_pod) // per_group
        if groups:
            capacity[name] = groups
    if sum(capacity.values()) < request.groups:
        return Unplaceable(
            request,
            UnplaceableReason.INSUFFICIENT_FREE_CAPACITY,
            f"needs {request.groups} groups of {request.group_gpus}; {sum(capacity.values())} fit inside supernodes",
        )
    blocks: dict[str, dict[str, int]] = {}
    for name, groups in capacity.items():
        blocks.setdefault(snapshot.supernodes[name].block or "", {})[name] = groups
    remaining = request.groups
    chosen: dict[str, int] = {}
    while remaining:
        totals = {b: sum(m.values()) for b, m in blocks.items()}
        fitting = [b for b, total in totals.items() if total >= remaining]
        block = min(fitting, key=lambda b: (totals[b], b)) if fitting else max(totals, key=lambda b: (totals[b], b))
        members = blocks.pop(block)
        while remaining and members:
            holds_rest = [n for n, groups in members.items() if groups >= remaining]
            if holds_rest:
                name = min(holds_rest, key=lambda n: (members[n], n))
            else:
                name = max(members, key=lambda n: (members[n], n))
            take = min(members.pop(name), remaining)
            chosen[name] = take
            remaining -= take
    return PlacementPlan(request, tuple(_assign_nodes(snapshot, request, chosen, set())))
