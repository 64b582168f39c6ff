"""All-or-nothing gang placement with every HBD group inside one supernode.

Quality rules, in order:
1. The caller's preferred supernodes first (a broken group's own rack on recovery).
2. As few scale-out blocks as possible: the best-fit block when one block suffices, the largest
   blocks first when none does.
3. Inside the last, partly used block, supernodes are chosen by what their leftover is worth to
   the work that is coming (`GroupDemand`: group sizes in the queue and recent arrivals), not by
   "tightest first": each step takes the supernode and group count that lose the least usable
   leftover per group placed. A whole, empty domain is worth something of its own, so it stays
   whole when a partly used domain can take the group as cheaply. A partly used domain with few
   resident workloads is close to being whole again, so joining it costs more than joining a busy
   one (`resident_cost`; the snapshot's `residents`). With `Packing.FILL` neither the whole
   domain's worth nor the resident cost counts: the leftover for the demanded sizes alone.
4. Inside a supernode, the fullest nodes first, so empty nodes stay whole.
Recovery uses hot spares of the preferred (own) supernodes first, then other supernodes'
ordinary free nodes, and other supernodes' spares last.

Candidates come from the snapshot's free-GPU index, so at ~99% allocation a call visits the few
supernodes that can hold a group, not all 25,000 nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tidal.placement.leftover import GroupDemand, leftover_value
from tidal.placement.types import (
    GangRequest,
    GroupAssignment,
    Packing,
    PlacementPlan,
    Unplaceable,
    UnplaceableReason,
)
from tidal.topology.snapshot import ClusterSnapshot, OverbookedError

WHOLE_DOMAIN_WEIGHT = 1.0
"""Worth of an empty domain's GPUs for domain-sized groups, against 1.0 for all demanded sizes."""
RESIDENT_WEIGHT = 4.0
"""Scale of `resident_cost`, in GPUs of leftover per GPU of the domain."""
RESIDENT_POWER = 2
"""`resident_cost` falls as 1/(n+1)**RESIDENT_POWER with n residents."""
BLOCKS_SCORED = 16
"""When one block suffices, the fullest this many fitting blocks are scored by leftover lost."""


def plan_gang(
    snapshot: ClusterSnapshot, request: GangRequest, demand: GroupDemand | None = None
) -> PlacementPlan | Unplaceable:
    """A full plan for the gang, or the reason it cannot be placed now (or ever). Never mutates.
    Leftovers are valued as `request.packing` says (the operator's --packing)."""
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    if request.accelerator not in snapshot.accelerators():
        return Unplaceable(
            request,
            UnplaceableReason.NO_MATCHING_SUPERNODES,
            f"no supernode offers {request.accelerator}",
        )
    preferred = [
        name
        for name in dict.fromkeys(request.prefer_supernodes)
        if name in snapshot.supernodes and snapshot.supernodes[name].accelerator == request.accelerator
    ]
    ordinary: dict[str, int] = {}
    for name in snapshot.supernodes_with_free(request.accelerator, request.group_gpus):
        groups = snapshot.pod_slots(name, gpp) // per_group
        if groups:
            ordinary[name] = groups
    first = {name: snapshot.pod_slots(name, gpp, request.recovery) // per_group for name in preferred}
    first = {name: groups for name, groups in first.items() if groups}
    others = {name: groups for name, groups in ordinary.items() if name not in first}
    spares: dict[str, int] = {}
    if request.recovery and sum(first.values()) + sum(others.values()) < request.groups:
        spares = _spare_capacity(snapshot, request, others, set(first))
    if sum(first.values()) + sum(others.values()) + sum(spares.values()) < request.groups:
        capacity_now = {**others, **first}
        for name, extra in spares.items():
            capacity_now[name] = capacity_now.get(name, 0) + extra
        return diagnose(snapshot, request, capacity_now)

    remaining = request.groups
    chosen: dict[str, int] = {}
    for name, groups in first.items():
        take = min(groups, remaining)
        if take:
            chosen[name] = take
            remaining -= take
    sizes = _demanded_sizes(request, demand)
    for tier in (others, spares):
        if remaining:
            used_blocks = {snapshot.supernodes[name].block or "" for name in chosen}
            for name, take in _choose_supernodes(snapshot, request, tier, remaining, sizes, used_blocks):
                chosen[name] = chosen.get(name, 0) + take
                remaining -= take
    return PlacementPlan(request, tuple(_assign_nodes(snapshot, request, chosen, set(first))))


def plan_on(snapshot: ClusterSnapshot, request: GangRequest, groups: Sequence[GroupAssignment]) -> PlacementPlan | None:
    """The plan that puts the request's groups exactly where `groups` says, if that is a valid
    placement now, else None (never mutates): every group of the request once, each whole on one
    supernode of its accelerator, one pod per listed node, no node a spare (unless a recovery),
    none over its free GPUs. How a room verified earlier (a defragmentation mover's way back) is
    taken as it was verified, rather than planned afresh into other holes."""
    wanted = [request.group_id(i) for i in range(request.groups)]
    by_group = {g.group: g for g in groups}
    if len(by_group) != len(groups) or sorted(by_group) != sorted(wanted):
        return None
    per_node: dict[str, int] = defaultdict(int)
    for g in groups:
        sn = snapshot.supernodes.get(g.supernode)
        if sn is None or sn.accelerator != request.accelerator or len(g.nodes) != request.pods_per_group:
            return None
        for name in g.nodes:
            node = snapshot.nodes.get(name)
            if node is None or node.supernode != g.supernode or (node.spare and not request.recovery):
                return None
            per_node[name] += request.gpus_per_pod
    if any(snapshot.nodes[name].free < gpus for name, gpus in per_node.items()):
        return None
    return PlacementPlan(request, tuple(by_group[gid] for gid in wanted))


def _spare_capacity(
    snapshot: ClusterSnapshot, request: GangRequest, ordinary: dict[str, int], preferred: set[str]
) -> dict[str, int]:
    """Groups that other supernodes' hot spares add to their ordinary free nodes (recovery only)."""
    extra = {}
    for name, sn in snapshot.supernodes.items():
        if sn.accelerator != request.accelerator or name in preferred:
            continue
        groups = snapshot.pod_slots(name, request.gpus_per_pod, True) // request.pods_per_group
        if groups > ordinary.get(name, 0):
            extra[name] = groups - ordinary.get(name, 0)
    return extra


def _demanded_sizes(request: GangRequest, demand: GroupDemand | None) -> dict[int, float]:
    """Normalized weights of the group sizes whose leftover counts; the request's own size always."""
    sizes = dict(demand.sizes(request.accelerator)) if demand is not None else {}
    if not sizes:
        sizes = {request.group_gpus: 1.0}
    total = sum(sizes.values())
    return {size: weight / total for size, weight in sizes.items() if weight > 0}


def _choose_supernodes(
    snapshot: ClusterSnapshot,
    request: GangRequest,
    capacity: dict[str, int],
    wanted: int,
    sizes: dict[int, float],
    used_blocks: frozenset[str] | set[str] = frozenset(),
) -> list[tuple[str, int]]:
    """(supernode, groups) pairs for `wanted` groups: fewest blocks, then least leftover lost.

    Blocks the gang already uses (its preferred supernodes', an earlier tier's) cost no new
    block, so their room is taken first.
    """
    if not capacity:
        return []  # e.g. recovery with room only on spares: the next tier supplies it
    scorer = _LeftoverScorer(request.group_gpus, sizes, request.resident_on, request.packing)
    chosen: list[tuple[str, int]] = []
    in_used = {n: c for n, c in capacity.items() if (snapshot.supernodes[n].block or "") in used_blocks}
    if in_used:
        take = min(wanted, sum(in_used.values()))
        chosen, _ = _least_leftover_lost(snapshot, scorer, in_used, take)
        wanted -= take
        capacity = {n: c for n, c in capacity.items() if n not in in_used}  # their room is all taken
        if not wanted or not capacity:
            return chosen
    if wanted == 1:
        # A single group never crosses the scale-out network: every supernode competes for it.
        return chosen + _least_leftover_lost(snapshot, scorer, dict(capacity), 1)[0]
    blocks: dict[str, list[str]] = defaultdict(list)
    block_capacity: dict[str, int] = defaultdict(int)
    for name, groups in capacity.items():
        block = snapshot.supernodes[name].block or ""
        blocks[block].append(name)
        block_capacity[block] += groups
    remaining = wanted
    while remaining > 0 and block_capacity:
        fitting = [b for b, groups in block_capacity.items() if groups >= remaining]
        if fitting:
            # One block suffices: the one whose leftover loses least, the fuller one on a tie.
            # Only the fullest few are scored, so 400 HGX blocks do not cost 400 greedy runs.
            fitting = sorted(fitting, key=lambda b: (block_capacity[b], b))[:BLOCKS_SCORED]
            best = None
            for b in fitting:
                picks, lost = _least_leftover_lost(snapshot, scorer, {n: capacity[n] for n in blocks[b]}, remaining)
                key = (round(lost, 6), block_capacity[b], b)
                if best is None or key < best[0]:
                    best = (key, picks)
            assert best is not None
            return chosen + best[1]
        block = max(block_capacity, key=lambda b: (block_capacity[b], b))
        members = sorted(blocks.pop(block))
        del block_capacity[block]
        chosen += [(name, capacity[name]) for name in members]  # the largest block goes whole
        remaining -= sum(capacity[name] for name in members)
    return chosen


def resident_cost(residents: int, whole: int, packing: Packing = Packing.KEEP_WHOLE) -> float:
    """What joining a partly used supernode with `residents` workloads costs its chance to be whole.

    A supernode is whole again only when its last resident leaves. Run times carry no memory of
    how long a job has run, so one more resident delays that by about 1/(n+1) of a run time, and
    the delay matters most where few residents are left (the domain would be whole soonest): hence
    1/(n+1)^2. n = 0 costs nothing: an empty domain is priced by the whole-domain worth instead,
    and a partly used one whose holders are unknown to the snapshot's owner (another tenant's
    pods) is treated as no closer to whole than the leftover score says. The form and the weight
    were chosen with `python -m bench.churn --resident-weight W --resident-power P` on seeds 1-15
    (README "Placement"); the other seeds and loads were run after the choice. Packing.FILL
    turns the cost off.
    """
    if packing is Packing.FILL:
        return 0.0
    return RESIDENT_WEIGHT * whole / (residents + 1) ** RESIDENT_POWER if residents > 0 else 0.0


class _LeftoverScorer:
    """Leftover value lost per group for k groups in a supernode, memoized on (free, whole, limit, joining):
    racks of one shape share few distinct free counts, so a call scores hundreds of racks cheaply."""

    def __init__(
        self,
        group_gpus: int,
        sizes: dict[int, float],
        own: frozenset[str] = frozenset(),
        packing: Packing = Packing.KEEP_WHOLE,
    ):
        self.group = group_gpus
        self.sizes = sizes
        self.own = own
        """Supernodes the request's workload already holds: no joining cost there."""
        self.packing = packing
        self._memo: dict[tuple[int, int, int, float], tuple[float, int, int]] = {}

    def value(self, free: int, whole: int) -> float:
        worth = leftover_value(free, self.sizes)
        if free == whole and self.packing is Packing.KEEP_WHOLE:
            worth += WHOLE_DOMAIN_WEIGHT * free  # an empty domain is worth more than its sizes
        return worth

    def loss(self, free: int, whole: int, groups: int) -> float:
        return self.value(free, whole) - self.value(free - groups * self.group, whole)

    def best_step(self, free: int, whole: int, limit: int, joining: float = 0.0) -> tuple[float, int, int]:
        """(loss per group, -k, GPUs left) of the best k in 1..limit: lower is better. `joining`
        is paid once whatever k, so it is part of the choice of k, not added after it."""
        key = (free, whole, limit, joining)
        if key not in self._memo:
            self._memo[key] = min(
                (round((self.loss(free, whole, k) + joining) / k, 9), -k, free - k * self.group)
                for k in range(1, limit + 1)
            )
        return self._memo[key]


def _least_leftover_lost(
    snapshot: ClusterSnapshot, scorer: _LeftoverScorer, capacity: dict[str, int], wanted: int
) -> tuple[list[tuple[str, int]], float]:
    """Greedy on leftover value lost per group placed; ties: more groups in one place, then tighter.

    Greedy alone is myopic (two 36-GPU holes look cheaper per group than an empty 72-GPU rack,
    until the third group breaks that rack anyway), so putting all groups into one supernode is
    compared with the greedy picks by total loss. Returns the picks and the value they lose.
    """
    free = {name: snapshot.largest_free_slice(name) for name in capacity}
    whole = {name: snapshot.domain_gpus(name) for name in capacity}
    residents = snapshot.residents
    joining = {
        name: 0.0 if name in scorer.own else resident_cost(residents.get(name, 0), whole[name], scorer.packing)
        for name in capacity
    }
    singles = [
        (round(scorer.loss(free[name], whole[name], wanted) + joining[name], 9), free[name], name)
        for name, groups in capacity.items()
        if groups >= wanted
    ]
    capacity = dict(capacity)
    chosen: dict[str, int] = {}
    remaining = wanted
    lost = 0.0
    while remaining > 0:
        per_group, minus_k, _, name = min(
            # joining is paid once per supernode: not again for more groups where some already went
            (
                *scorer.best_step(
                    free[name], whole[name], min(groups, remaining), 0.0 if name in chosen else joining[name]
                ),
                name,
            )
            for name, groups in capacity.items()
        )
        k = -minus_k
        lost += per_group * k
        chosen[name] = chosen.get(name, 0) + k
        capacity[name] -= k
        free[name] -= k * scorer.group
        if not capacity[name]:
            del capacity[name]
        remaining -= k
    if singles:  # by total loss, whichever supernodes the greedy steps took
        single_lost, _, name = min(singles)
        if single_lost <= round(lost, 9):
            return [(name, wanted)], single_lost
    return list(chosen.items()), lost


def _assign_nodes(
    snapshot: ClusterSnapshot, request: GangRequest, chosen: dict[str, int], preferred: set[str]
) -> list[GroupAssignment]:
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    recovery = request.recovery
    groups: list[GroupAssignment] = []
    # Sort keys as tuples built once per node (node.free is a property): a 16k-GPU gang on 8-GPU
    # servers visits 2,048 supernodes here. Names are unique, so no two keys tie.
    for supernode, count in chosen.items():
        spares_first = recovery and supernode in preferred  # the rack's hot spares exist for this
        members: list[tuple[bool, int, str]] = []
        for n in snapshot.member_nodes(supernode):
            free = n.free
            if free >= gpp and (recovery or not n.spare):
                members.append((not n.spare if spares_first else n.spare, free, n.name))
        members.sort()  # fullest first; others' spares last
        pod_slots: list[str] = []
        add_slot = pod_slots.append
        for _, free, name in members:
            slots = free // gpp
            if slots == 1:  # the usual case near full: no list or range per node
                add_slot(name)
            else:
                pod_slots += [name] * slots
        for i in range(count):
            nodes = tuple(pod_slots[i * per_group : (i + 1) * per_group])
            groups.append(GroupAssignment(request.group_id(len(groups)), supernode, nodes))
    return groups


def group_fits_some_supernode(snapshot: ClusterSnapshot, request: GangRequest) -> bool:
    """Whether one of the request's groups fits an empty supernode (cached per shape version)."""
    largest_node, largest_domain_pods, _ = _if_empty(snapshot, request)
    return largest_node >= request.gpus_per_pod and largest_domain_pods >= request.pods_per_group


def _if_empty(snapshot: ClusterSnapshot, request: GangRequest) -> tuple[int, int, int]:
    """(largest node, largest supernode in pods, groups an empty cluster holds); cached per shape."""
    gpp, per_group = request.gpus_per_pod, request.pods_per_group
    key = (snapshot.shape_version, request.accelerator, gpp, per_group, request.recovery)
    cache = snapshot.empty_cluster_cache
    if key in cache:
        return cache[key]
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
    if len(cache) > 256:
        cache.clear()
    cache[key] = (largest_node, largest_domain_pods, groups_if_empty)
    return cache[key]


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
