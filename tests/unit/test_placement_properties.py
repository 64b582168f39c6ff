"""Invariants of gang placement on random mixed fleets, checked against brute-force counting."""

from collections import Counter
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.placement import GangRequest, GroupAssignment, PlacementPlan, Unplaceable, apply_plan, plan_gang
from tidal.topology import ClusterSnapshot

from .strategies import requests, snapshots


def brute_force_groups(snap: ClusterSnapshot, req: GangRequest, *, empty: bool = False) -> int:
    """Groups that fit, counted node by node with no help from the snapshot's histograms."""
    total = 0
    for sn in snap.supernodes.values():
        if sn.accelerator != req.accelerator:
            continue
        pods = 0
        for name in sn.nodes:
            node = snap.nodes[name]
            if node.spare and not req.recovery:
                continue
            if empty:
                pods += node.gpus // req.gpus_per_pod
            elif node.ready and not node.cordoned:
                pods += (node.gpus - node.allocated) // req.gpus_per_pod
        total += pods // req.pods_per_group
    return total


def held(groups: Iterable[GroupAssignment], gpus_per_pod: int) -> tuple[tuple[str, int], ...]:
    """(node, GPUs) the groups' pods hold, summed per node: a running gang's allocation as the
    preemption and defragmentation planners take it."""
    per_node: Counter[str] = Counter()
    for g in groups:
        for node in g.nodes:
            per_node[node] += gpus_per_pod
    return tuple(sorted(per_node.items()))


def check_plan(snap: ClusterSnapshot, req: GangRequest, plan: PlacementPlan) -> None:
    assert len(plan.groups) == req.groups, "all or nothing"
    assert sorted(g.group for g in plan.groups) == list(range(req.groups))
    used: Counter[str] = Counter()
    for group in plan.groups:
        assert len(group.nodes) == req.pods_per_group
        assert snap.supernodes[group.supernode].accelerator == req.accelerator
        for node_name in group.nodes:
            node = snap.nodes[node_name]
            assert node.supernode == group.supernode, "HBD group split across supernodes"
            assert node.ready and not node.cordoned, "failed or cordoned node used"
            assert req.recovery or not node.spare, "spare used outside recovery"
            used[node_name] += req.gpus_per_pod
    for node_name, gpus in used.items():
        assert gpus <= snap.nodes[node_name].free, "node over-booked"


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_plan_is_whole_valid_or_provably_impossible(data):
    snap = data.draw(snapshots())
    req = data.draw(requests(snap))
    before = {n: (v.allocated, v.free) for n, v in snap.nodes.items()}
    result = plan_gang(snap, req)
    assert {n: (v.allocated, v.free) for n, v in snap.nodes.items()} == before, "planning must not mutate"
    fit_now = brute_force_groups(snap, req)
    if isinstance(result, PlacementPlan):
        check_plan(snap, req, result)
        assert fit_now >= req.groups
        apply_plan(snap, result)
    else:
        assert isinstance(result, Unplaceable)
        assert fit_now < req.groups, f"refused a placeable request: {result.message}"
        assert result.permanent == (brute_force_groups(snap, req, empty=True) < req.groups)
        assert str(req.groups) in result.message


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_sequential_gangs_never_overbook(data):
    snap = data.draw(snapshots())
    initial = snap.allocated_gpus()
    placed = 0
    for i in range(data.draw(st.integers(1, 8))):
        req = data.draw(requests(snap, name=f"job-{i}"))
        result = plan_gang(snap, req)
        if isinstance(result, PlacementPlan):
            check_plan(snap, req, result)
            apply_plan(snap, result)
            placed += req.total_gpus
    for node in snap.nodes.values():
        assert 0 <= node.allocated <= node.gpus
    assert snap.allocated_gpus() == initial + placed
