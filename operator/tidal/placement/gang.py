"""All-or-nothing gang placement with every HBD group inside one supernode.

Quality rules, in order: use the caller's preferred supernodes first; keep the gang in as few
scale-out blocks as possible (best-fit block when one block suffices, largest blocks first when
none does); inside a block take the tightest supernodes first so empty supernodes stay whole;
inside a supernode take the fullest nodes first so empty nodes stay whole.
"""

from __future__ import annotations

from collections import defaultdict

from tidal.placement.types import (
    GangRequest,
    GroupAssignment,
    PlacementPlan,
    Unplaceable,
    UnplaceableReason,
)
from tidal.topology.snapshot import ClusterSnapshot, OverbookedError


def plan_gang(snapshot: ClusterSnapshot, request: GangRequest) -> PlacementPlan | Unplaceable:
    """A full plan for the gang, or the reason it cannot be placed now (or ever). Never mutates."""
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    matching = [sn for sn in snapshot.supernodes.values() if sn.accelerator == request.accelerator]
    if not matching:
        return Unplaceable(
            request,
            UnplaceableReason.NO_MATCHING_SUPERNODES,
            f"no supernode offers {request.accelerator}",
        )
    slots: dict[str, int] = {}
    capacity: dict[str, int] = {}
    for sn in matching:
        if not request.recovery and snapshot.largest_free_slice(sn.name) < request.group_gpus:
            continue  # cannot hold a group whatever the pod layout
        s = snapshot.pod_slots(sn.name, gpp, include_spares=request.recovery)
        if s >= per_group:
            slots[sn.name] = s
            capacity[sn.name] = s // per_group
    if sum(capacity.values()) < request.groups:
        return diagnose(snapshot, request, capacity)
    chosen = _choose_supernodes(snapshot, request, capacity, slots)
    return PlacementPlan(request, tuple(_assign_nodes(snapshot, request, chosen)))


def _choose_supernodes(
    snapshot: ClusterSnapshot, request: GangRequest, capacity: dict[str, int], slots: dict[str, int]
) -> list[tuple[str, int]]:
    remaining = request.groups
    chosen: list[tuple[str, int]] = []
    for name in request.prefer_supernodes:
        take = min(capacity.pop(name, 0), remaining)
        if take:
            chosen.append((name, take))
            remaining -= take
    blocks: dict[str, list[str]] = defaultdict(list)
    block_capacity: dict[str, int] = defaultdict(int)
    for name, cap in capacity.items():
        block = snapshot.supernodes[name].block or ""
        blocks[block].append(name)
        block_capacity[block] += cap
    while remaining > 0:
        fitting = [b for b, cap in block_capacity.items() if cap >= remaining]
        if fitting:
            block = min(fitting, key=lambda b: (block_capacity[b], b))
        else:
            block = max(block_capacity, key=lambda b: (block_capacity[b], b))
        for name in sorted(blocks.pop(block), key=lambda n: (slots[n], n)):
            take = min(capacity[name], remaining)
            chosen.append((name, take))
            remaining -= take
            if remaining == 0:
                break
        del block_capacity[block]
    return chosen


def _assign_nodes(
    snapshot: ClusterSnapshot, request: GangRequest, chosen: list[tuple[str, int]]
) -> list[GroupAssignment]:
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    groups: list[GroupAssignment] = []
    for supernode, count in chosen:
        members = [n for n in snapshot.member_nodes(supernode) if n.free >= gpp and (request.recovery or not n.spare)]
        # Recovery goes to hot spares first; otherwise fill the fullest nodes first.
        members.sort(key=lambda n: (not n.spare, n.free, n.name) if request.recovery else (n.free, n.name))
        pod_slots = [n.name for n in members for _ in range(n.free // gpp)]
        for i in range(count):
            nodes = tuple(pod_slots[i * per_group : (i + 1) * per_group])
            groups.append(GroupAssignment(request.group_id(len(groups)), supernode, nodes))
    return groups


_EMPTY_CACHE: dict[tuple, tuple[int, int, int]] = {}


def _if_empty(snapshot: ClusterSnapshot, request: GangRequest) -> tuple[int, int, int]:
    """(largest node, largest supernode in pods, groups an empty cluster holds); cached per shape."""
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    key = (id(snapshot), snapshot.shape_version, request.accelerator, gpp, per_group, request.recovery)
    if key in _EMPTY_CACHE:
        return _EMPTY_CACHE[key]
    largest_node = groups_if_empty = largest_domain_pods = 0
    for sn in snapshot.supernodes.values():
        if sn.accelerator != request.accelerator:
            continue
        pods = 0
        for node in snapshot.member_nodes(sn.name):
            largest_node = max(largest_node, node.gpus)
            if request.recovery or not node.spare:
                pods += node.gpus // gpp
        largest_domain_pods = max(largest_domain_pods, pods)
        groups_if_empty += pods // per_group
    if len(_EMPTY_CACHE) > 4096:
        _EMPTY_CACHE.clear()
    _EMPTY_CACHE[key] = (largest_node, largest_domain_pods, groups_if_empty)
    return _EMPTY_CACHE[key]


def diagnose(snapshot: ClusterSnapshot, request: GangRequest, capacity_now: dict[str, int]) -> Unplaceable:
    """Why the request does not fit, with the numbers; `permanent` if an empty cluster would not do."""
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    largest_node, largest_domain_pods, groups_if_empty = _if_empty(snapshot, request)
    needs = (
        f"needs {request.groups} group(s) of {request.group_gpus} {request.accelerator} "
        f"({per_group} pod(s) x {gpp}) each inside one supernode"
    )
    now = sum(capacity_now.values())
    if largest_node < gpp:
        return Unplaceable(
            request,
            UnplaceableReason.POD_LARGER_THAN_NODES,
            f"{needs}; a pod needs {gpp} {request.accelerator} but the largest node has {largest_node}",
            details={"largest_node_gpus": largest_node},
        )
    if largest_domain_pods < per_group:
        return Unplaceable(
            request,
            UnplaceableReason.GROUP_LARGER_THAN_SUPERNODES,
            f"{needs}; the largest supernode holds {largest_domain_pods * gpp} such GPUs even when empty",
            details={"largest_supernode_gpus": largest_domain_pods * gpp},
        )
    if groups_if_empty < request.groups:
        return Unplaceable(
            request,
            UnplaceableReason.LARGER_THAN_CLUSTER,
            f"{needs}; the whole cluster holds {groups_if_empty} such group(s) even when empty",
            groups_fitting_now=now,
            supernodes_fitting_now=len(capacity_now),
            details={"groups_if_empty": groups_if_empty},
        )
    return Unplaceable(
        request,
        UnplaceableReason.INSUFFICIENT_FREE_CAPACITY,
        f"{needs}; {len(capacity_now)} supernode(s) have >= {request.group_gpus} free GPUs "
        f"(room for {now} group(s) now)",
        groups_fitting_now=now,
        supernodes_fitting_now=len(capacity_now),
        details={"groups_if_empty": groups_if_empty},
    )


def apply_plan(snapshot: ClusterSnapshot, plan: PlacementPlan) -> None:
    """Book the plan's GPUs in the snapshot; raises OverbookedError (and books nothing) if stale."""
    per_node = plan.gpus_by_node()
    for node, gpus in per_node.items():
        if snapshot.nodes[node].free < gpus:
            raise OverbookedError(f"node {node}: plan wants {gpus} GPUs, {snapshot.nodes[node].free} free")
    for node, gpus in per_node.items():
        snapshot.allocate(node, gpus)


def release_plan(snapshot: ClusterSnapshot, plan: PlacementPlan) -> None:
    for node, gpus in plan.gpus_by_node().items():
        snapshot.release(node, gpus)
