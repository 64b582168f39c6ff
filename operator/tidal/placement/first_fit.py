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
    for node in snapshot.nodes.values():
        if node.spare and not request.recovery:
            continue
        if snapshot.supernodes.get(node.supernode) is None:
            continue
        if snapshot.supernodes[node.supernode].accelerator != request.accelerator:
            continue
        fit = min(node.free // gpp, needed - len(pods))
        pods.extend([node.name] * fit)
        if len(pods) == needed:
            break
    if len(pods) < needed:
        return Unplaceable(
            request,
            UnplaceableReason.INSUFFICIENT_FREE_CAPACITY,
            f"needs {needed} pods of {gpp} {request.accelerator}; {len(pods)} fit",
        )
    groups = []
    for g in range(request.groups):
        nodes = tuple(pods[g * per_group : (g + 1) * per_group])
        groups.append(GroupAssignment(request.group_id(g), snapshot.nodes[nodes[0]].supernode, nodes))
    return PlacementPlan(request, tuple(groups))


def split_groups(snapshot: ClusterSnapshot, plan: PlacementPlan) -> int:
    """Groups whose pods are not all inside one supernode (must be 0 for tidal's plans)."""
    return sum(1 for g in plan.groups if len({snapshot.nodes[n].supernode for n in g.nodes}) > 1)
