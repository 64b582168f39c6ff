"""Defragmentation planner: fewest verified moves, only of preemptible work of priority <= the request's."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.placement import GangRequest, PlacementPlan, RunningGang, apply_plan, plan_gang
from tidal.placement import defrag as defrag_module
from tidal.placement.defrag import DefragPlan, MovableGang, plan_defrag, stranded_free_gpus
from tidal.topology import ClusterSnapshot, build_fleet, snapshot_from_fleet
from tidal.topology.snapshot import NodeState, SupernodeState

from .strategies import snapshots
from .test_placement_properties import check_plan, held


def put(
    snap: ClusterSnapshot,
    name: str,
    groups: int,
    group_gpus: int,
    *,
    on: str | None = None,
    gpp: int = 4,
    priority: int = 0,
    preemptible: bool = True,
    replicas: int = 1,
    min_replicas: int | None = None,
) -> MovableGang:
    """Place a gang (on supernode `on` if given) and describe it as the planner sees it."""
    request = GangRequest(name, groups=groups, group_gpus=group_gpus, gpus_per_pod=gpp, priority=priority)
    placing = GangRequest(name, groups, group_gpus, gpp, priority=priority, prefer_supernodes=(on,) if on else ())
    plan = plan_gang(snap, placing)
    assert isinstance(plan, PlacementPlan)
    if on is not None:
        assert plan.supernodes == {on}, plan.supernodes
    apply_plan(snap, plan)
    per_replica = groups // replicas
    allocations = tuple(held(plan.groups[r * per_replica : (r + 1) * per_replica], gpp) for r in range(replicas))
    return MovableGang(RunningGang(name, priority, preemptible, allocations, min_replicas), request)


def racks(n: int) -> ClusterSnapshot:
    return snapshot_from_fleet(build_fleet("nvl72", n))


def rack(i: int) -> str:
    return f"nvl72-{i:04d}"


def check(snap: ClusterSnapshot, request: GangRequest, running: list[MovableGang], plan: DefragPlan) -> None:
    """Replaying the plan on a copy: each move evicts a preemptible gang of priority <= the
    request's, whole or its top replicas (never below its minimum); the request fits where
    planned; then every group a move evicted is placed again, each inside one supernode; nothing
    over-booked."""
    scratch = snap.copy()
    by_name = {m.gang.name: m for m in running}
    for move in plan.moves:
        m = by_name[move.eviction.gang]
        gang = m.gang
        assert gang.preemptible, "never a non-preemptible gang"
        assert gang.priority <= request.priority, "never a higher-priority gang"
        n, k = len(gang.replicas), len(move.eviction.replicas)
        assert move.eviction.replicas == tuple(range(n - k, n)), "the top replicas, or all of them"
        assert move.eviction.whole == (k == n)
        if not move.eviction.whole:
            assert gang.min_replicas is not None, "only an elastic gang is shrunk"
            assert n - k >= gang.min_replicas, "never below its minimum DP replicas"
        per = m.request.groups // n
        assert sorted(g.group for g in move.replacement.groups) == list(range((n - k) * per, n * per)), (
            "every group it evicted is placed again"
        )
        assert all(len(g.nodes) == m.request.pods_per_group for g in move.replacement.groups)
        for r in move.eviction.replicas:
            for node, gpus in gang.replicas[r]:
                scratch.release(node, gpus)
    check_plan(scratch, request, plan.placement)
    apply_plan(scratch, plan.placement)
    for move in plan.moves:
        apply_plan(scratch, move.replacement)
    for p in (plan.placement, *(m.replacement for m in plan.moves)):
        for g in p.groups:
            assert {scratch.nodes[n].supernode for n in g.nodes} == {g.supernode}
    assert all(n.allocated <= n.gpus for n in scratch.nodes.values())


def test_scattered_small_work_one_move_frees_a_rack():
    snap = racks(4)
    running = [put(snap, f"s{i}", 1, 16, on=rack(i), priority=1) for i in range(4)]  # 56 free per rack
    request = GangRequest("big", 1, 72, 4, priority=1)  # equal priority: a move, not a preemption
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and len(plan.moves) == 1 and plan.moved_gpus == 16
    moved = plan.moves[0]
    assert moved.eviction.whole
    assert plan.placement.supernodes == {rack(int(moved.eviction.gang[1:]))}
    assert moved.replacement.supernodes.isdisjoint(plan.placement.supernodes)
    check(snap, request, running, plan)


def test_snapshot_is_left_exactly_as_it_was():
    snap = racks(3)
    running = [put(snap, f"s{i}", 1, 16, on=rack(i)) for i in range(3)]
    before = {n: (s.allocated, s.free) for n, s in snap.nodes.items()}
    buckets = sorted(snap.supernodes_with_free("nvidia.com/gpu", 1))
    assert plan_defrag(snap, GangRequest("big", 1, 72, 4), running, None) is not None
    assert {n: (s.allocated, s.free) for n, s in snap.nodes.items()} == before
    assert sorted(snap.supernodes_with_free("nvidia.com/gpu", 1)) == buckets
    assert all(snap.largest_free_slice(rack(i)) == 56 for i in range(3))


def test_only_when_blocked_by_fragmentation():
    snap = racks(2)
    running = [put(snap, "a", 1, 16, on=rack(0)), put(snap, "b", 1, 16, on=rack(1))]
    assert plan_defrag(snap, GangRequest("fits", 1, 56, 4), running, None) is None, "fits as is"
    assert plan_defrag(snap, GangRequest("too-many", 2, 72, 4), running, None) is None, "112 free < 144"
    assert plan_defrag(snap, GangRequest("never", 1, 76, 4), running, None) is None, "larger than a rack"


def test_never_moves_non_preemptible_or_higher_priority():
    snap = racks(3)
    running = [
        put(snap, "pinned", 1, 16, on=rack(0), preemptible=False),
        put(snap, "higher", 1, 16, on=rack(1), priority=5),
        put(snap, "movable", 1, 16, on=rack(2), priority=3),
    ]
    plan = plan_defrag(snap, GangRequest("big", 1, 72, 4, priority=3), running, None)
    assert plan is not None and [m.eviction.gang for m in plan.moves] == ["movable"]
    assert plan_defrag(snap, GangRequest("big", 1, 72, 4, priority=2), running, None) is None


def test_moved_work_must_fit_again():
    """Moving x (36 GPUs in one group) would be cheapest, but no rack has 36 free afterwards; y
    (5 groups of 8) fits again. Without the re-placement check the planner picks x."""
    snap = racks(3)
    x = put(snap, "x", 1, 36, on=rack(0))  # rack 0: 36 free
    y = put(snap, "y", 5, 8, on=rack(1))  # rack 1: 32 free
    z = put(snap, "z", 1, 40, on=rack(2), preemptible=False)  # rack 2: 32 free
    request = GangRequest("big", 1, 72, 4)
    plan = plan_defrag(snap, request, [x, y, z], None)
    assert plan is not None and [m.eviction.gang for m in plan.moves] == ["y"]
    assert plan.placement.supernodes == {rack(1)}
    check(snap, request, [x, y, z], plan)


def test_nothing_when_moved_work_cannot_fit_again():
    snap = racks(3)
    a = put(snap, "a", 1, 40, on=rack(0))
    b = put(snap, "b", 1, 40, on=rack(1))
    c = put(snap, "c", 1, 40, on=rack(2), preemptible=False)
    # 96 free; moving a or b frees a rack, but the mover (40 in one group) fits nowhere afterwards.
    assert plan_defrag(snap, GangRequest("big", 1, 72, 4), [a, b, c], None) is None


def test_fewest_moves_before_fewest_gpus():
    """Rack 0: one 24-GPU gang; rack 1: two 4-GPU gangs. One move of 24 beats two of 4 each."""
    snap = racks(3)
    one = put(snap, "one", 1, 24, on=rack(0))
    t1 = put(snap, "t1", 1, 4, on=rack(1))
    t2 = put(snap, "t2", 1, 4, on=rack(1))
    pinned = put(snap, "pinned", 1, 8, on=rack(2), preemptible=False)
    request = GangRequest("big", 1, 72, 4)
    running = [one, t1, t2, pinned]
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and [m.eviction.gang for m in plan.moves] == ["one"]
    assert plan.placement.supernodes == {rack(0)}
    check(snap, request, running, plan)


def test_fewest_gpus_among_equally_few_moves():
    snap = racks(3)
    running = [put(snap, "big16", 1, 16, on=rack(0)), put(snap, "small8", 1, 8, on=rack(1))]
    running.append(put(snap, "pinned", 1, 8, on=rack(2), preemptible=False))
    plan = plan_defrag(snap, GangRequest("big", 1, 72, 4), running, None)
    assert plan is not None and [m.eviction.gang for m in plan.moves] == ["small8"]


def test_budget_limits_the_gpus_moved():
    snap = racks(3)
    running = [put(snap, "a", 1, 16, on=rack(0)), put(snap, "b", 1, 24, on=rack(1))]
    running.append(put(snap, "pinned", 1, 8, on=rack(2), preemptible=False))
    request = GangRequest("big", 1, 72, 4)
    assert [m.eviction.gang for m in plan_defrag(snap, request, running, 16).moves] == ["a"]
    assert plan_defrag(snap, request, running, 15) is None


def test_two_groups_need_two_racks_freed():
    snap = racks(5)
    running = [put(snap, f"s{i}", 1, 12, on=rack(i)) for i in range(5)]
    request = GangRequest("big", 2, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and len(plan.moves) == 2
    assert len(plan.placement.supernodes) == 2
    check(snap, request, running, plan)


def elastic_el(snap: ClusterSnapshot, low_on: str, low: int, top_on: str, top: int, min_replicas: int) -> MovableGang:
    """An elastic gang "el" of one-group replicas of 8 GPUs: `low` of them on `low_on`, then the top
    `top` on `top_on`."""
    parts = put(snap, "low", low, 8, on=low_on), put(snap, "top", top, 8, on=top_on)
    replicas = tuple(
        tuple(sorted(Counter({n: 4 for n in nodes}).items())) for part in parts for nodes in _groups_nodes(snap, part)
    )
    return MovableGang(RunningGang("el", 0, True, replicas, min_replicas), GangRequest("el", low + top, 8, 4))


def elastic_over_two_racks(min_replicas: int) -> tuple[ClusterSnapshot, list[MovableGang]]:
    """One elastic gang "el" of 4 replicas of one 8-GPU group: replicas 0-1 on rack 1, the top two
    (2-3) on rack 0; rack 2 held by pinned work."""
    snap = racks(3)
    elastic = elastic_el(snap, rack(1), 2, rack(0), 2, min_replicas)
    return snap, [elastic, put(snap, "pinned", 1, 8, on=rack(2), preemptible=False)]


def test_elastic_gang_gives_back_only_the_replicas_in_the_way():
    snap, running = elastic_over_two_racks(min_replicas=2)
    request = GangRequest("big", 1, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and len(plan.moves) == 1
    move = plan.moves[0]
    assert not move.eviction.whole and move.eviction.replicas == (2, 3) and move.eviction.gpus == 16
    assert move.replacement.request.group_ids == (2, 3)
    assert plan.placement.supernodes == {rack(0)}


def test_an_elastic_gang_gives_back_the_replica_that_shares_a_rack_with_another_move():
    """Rack 0 holds el's top replica and x (8 GPUs each): the 72-GPU group needs both gone. Giving
    back el's one replica there gains no group on its own (64 free), so only the shrink that clears
    el off the rack offers it: 16 GPUs moved, not 40 (el whole). Racks 1 and 2 hold pinned work."""
    snap = racks(3)
    running = [
        elastic_el(snap, rack(1), 3, rack(0), 1, 1),
        put(snap, "x", 1, 8, on=rack(0)),
        put(snap, "pinned-1", 1, 8, on=rack(1), preemptible=False),
        put(snap, "pinned-2", 1, 8, on=rack(2), preemptible=False),
    ]
    request = GangRequest("big", 1, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and plan.moved_gpus == 16 and plan.placement.supernodes == {rack(0)}
    assert sorted((m.eviction.gang, m.eviction.replicas) for m in plan.moves) == [("el", (3,)), ("x", (0,))]
    check(snap, request, running, plan)


def test_an_elastic_gang_gives_back_just_the_replicas_a_group_needs():
    """Rack 0 holds el's top two replicas (16 GPUs), rack 1 its other two: 56 free on each. A
    64-GPU group needs only the top replica given back (8 GPUs), not the whole rack cleared (16):
    and within a budget of 8 GPUs, that is the only plan there is."""
    snap = racks(2)
    running = [elastic_el(snap, rack(1), 2, rack(0), 2, 2)]
    request = GangRequest("big", 1, 64, 4)
    for budget in (None, 8):
        plan = plan_defrag(snap, request, running, budget)
        assert plan is not None and [(m.eviction.replicas, m.eviction.gpus) for m in plan.moves] == [((3,), 8)]
        assert plan.placement.supernodes == {rack(0)}
        check(snap, request, running, plan)


def _groups_nodes(snap: ClusterSnapshot, m: MovableGang) -> list[tuple[str, ...]]:
    """The nodes of each group of a gang placed by `put` with one replica (pods of 4 GPUs)."""
    nodes = [n for n, g in m.gang.replicas[0] for _ in range(g // 4)]
    per = m.request.pods_per_group
    return [tuple(nodes[i : i + per]) for i in range(0, len(nodes), per)]


def test_greedy_alone_finds_a_plan_and_prunes(monkeypatch):
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap = racks(4)
    running = [put(snap, f"s{i}", 1, 16, on=rack(i)) for i in range(4)]
    request = GangRequest("big", 1, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and len(plan.moves) == 1
    check(snap, request, running, plan)


def test_greedy_gives_back_a_move_the_plan_can_do_without(monkeypatch):
    # Two 72-GPU groups. Rack 0 holds one 4-GPU gang "p": the cheapest rack to clear, taken
    # first. "w" holds 16 GPUs on each of racks 1 and 2 and clears both alone, so "p" goes back.
    # Rack 3 is held by pinned work.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap = racks(4)
    p = put(snap, "p", 1, 4, on=rack(0))
    w = over_racks(snap, "w", 16, 1, 2)
    pinned = put(snap, "pinned", 1, 40, on=rack(3), preemptible=False)
    request = GangRequest("big", 2, 72, 4)
    running = [p, w, pinned]
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and [m.eviction.gang for m in plan.moves] == ["w"], plan
    check(snap, request, running, plan)


def over_racks(snap: ClusterSnapshot, name: str, gpus_each: int, *on: int) -> MovableGang:
    """One gang of one group of `gpus_each` GPUs on each rack of `on`: moving it clears it off all of them."""
    parts = [put(snap, name, 1, gpus_each, on=rack(i)).gang.replicas[0] for i in on]
    return MovableGang(
        RunningGang(name, 0, True, (tuple(sorted(sum(parts, ()))),)), GangRequest(name, len(on), gpus_each, 4)
    )


def test_greedy_gives_back_the_larger_of_two_moves_it_can_do_without(monkeypatch):
    # Three 72-GPU groups. The greedy clears rack 0 ("p", 4 GPUs), then rack 1 ("q", 8), then
    # rack 2 with "w", which clears rack 3 too: four racks for three groups. Either "p" or "q" can
    # go back, not both; giving back the larger first keeps the plan at 36 GPUs, not 40.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap = racks(5)
    running = [put(snap, "p", 1, 4, on=rack(0)), put(snap, "q", 1, 8, on=rack(1)), over_racks(snap, "w", 16, 2, 3)]
    running.append(put(snap, "pinned", 1, 8, on=rack(4), preemptible=False))
    request = GangRequest("big", 3, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and sorted(m.eviction.gang for m in plan.moves) == ["p", "w"], plan
    assert plan.moved_gpus == 36
    check(snap, request, running, plan)


def one_node_gangs(snap: ClusterSnapshot, per_rack: int, on: Iterable[int]) -> list[MovableGang]:
    """`per_rack` preemptible 4-GPU gangs (one node each) on each rack of `on`."""
    return [put(snap, f"r{r}g{i}", 1, 4, on=rack(r)) for r in on for i in range(per_rack)]


def test_the_greedy_moves_no_more_gangs_than_the_cap(monkeypatch):
    # Clearing a rack of 4-GPU gangs takes one move per gang, all in one step of the greedy: 8 is
    # the cap (each move is a checkpoint and a restart), so 9 is no plan.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    request = GangRequest("big", 1, 72, 4)
    for per_rack, moves in ((8, 8), (9, None)):
        snap = racks(2)
        running = one_node_gangs(snap, per_rack, range(2))
        plan = plan_defrag(snap, request, running, None)
        assert (plan and len(plan.moves)) == moves, (per_rack, plan)
        if plan is not None:
            check(snap, request, running, plan)


def test_the_exact_search_moves_no_more_gangs_than_the_cap(monkeypatch):
    # Nine gangs on rack 0 are the only way to free a rack (rack 1 holds pinned work): nine moves.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 24)  # 9 options: the exact path
    snap = racks(2)
    running = one_node_gangs(snap, 9, range(1))
    running.append(put(snap, "pinned", 1, 4, on=rack(1), preemptible=False))
    assert plan_defrag(snap, GangRequest("big", 1, 72, 4), running, None) is None


@pytest.mark.parametrize("exact", [True, False], ids=["exact search", "greedy alone"])
def test_the_cap_is_twice_the_groups_missing_when_that_is_more(exact, monkeypatch):
    # Five racks each cleared by two moves: ten, above 8 but within twice the five groups missing.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 24 if exact else 0)  # 10 options
    snap = racks(8)
    running = one_node_gangs(snap, 2, range(5))
    running += [put(snap, f"pinned{r}", 1, 8, on=rack(r), preemptible=False) for r in range(5, 8)]
    request = GangRequest("big", 5, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and len(plan.moves) == 10
    check(snap, request, running, plan)


def past_the_cap() -> tuple[ClusterSnapshot, list[MovableGang], GangRequest]:
    """Two 72-GPU groups. The greedy clears rack 0 (four 4-GPU gangs, the cheapest rack), then rack 1
    with the five gangs "w*" that span racks 1 and 2: nine moves (56 GPUs), above the cap of 8.
    Rack 0's four then go back: five moves of 40 GPUs."""
    snap = racks(3)
    running = one_node_gangs(snap, 4, (0,)) + [over_racks(snap, f"w{i}", 4, 1, 2) for i in range(5)]
    return snap, running, GangRequest("big", 2, 72, 4)


def test_the_greedy_checks_the_cap_after_giving_moves_back(monkeypatch):
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap, running, request = past_the_cap()
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and sorted(m.eviction.gang for m in plan.moves) == [f"w{i}" for i in range(5)], plan
    check(snap, request, running, plan)


def test_the_greedy_checks_the_budget_after_giving_moves_back(monkeypatch):
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap, running, request = past_the_cap()
    plan = plan_defrag(snap, request, running, 40)
    assert plan is not None and plan.moved_gpus == 40, plan
    check(snap, request, running, plan)
    assert plan_defrag(snap, request, running, 39) is None


def test_the_greedy_may_go_past_the_cap_before_giving_moves_back(monkeypatch):
    # Three 72-GPU groups. Racks 0 and 3 each take four moves to clear (the cheapest), racks 1, 2
    # and 4 five together ("w*" span all three): the greedy reaches 8 moves with two racks cleared,
    # goes on to 13, then gives back the eight: five moves.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap = racks(5)
    running = one_node_gangs(snap, 4, (0, 3)) + [over_racks(snap, f"w{i}", 4, 1, 2, 4) for i in range(5)]
    request = GangRequest("big", 3, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and sorted(m.eviction.gang for m in plan.moves) == [f"w{i}" for i in range(5)], plan
    check(snap, request, running, plan)


def test_greedy_alone_clears_the_rack_with_fewest_moves(monkeypatch):
    # test_fewest_moves_before_fewest_gpus's layout on the path large clusters take: one move of
    # 24 GPUs beats two of 4 each.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    snap = racks(3)
    running = [
        put(snap, "one", 1, 24, on=rack(0)),
        put(snap, "t1", 1, 4, on=rack(1)),
        put(snap, "t2", 1, 4, on=rack(1)),
    ]
    running.append(put(snap, "pinned", 1, 8, on=rack(2), preemptible=False))
    request = GangRequest("big", 1, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and [m.eviction.gang for m in plan.moves] == ["one"]
    check(snap, request, running, plan)


def test_an_elastic_gang_is_never_shrunk_below_its_minimum():
    # The layout above with minDP 3 of 4: giving back the two replicas on rack 0 would leave 2, so
    # "el" moves whole.
    snap, running = elastic_over_two_racks(min_replicas=3)
    request = GangRequest("big", 1, 72, 4)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None and [(m.eviction.gang, m.eviction.whole) for m in plan.moves] == [("el", True)]
    check(snap, request, running, plan)


def test_stranded_gpus_count_what_no_pending_size_can_use():
    snap = racks(3)
    put(snap, "a", 1, 40, on=rack(0))  # 32 free
    put(snap, "b", 1, 52, on=rack(1))  # 20 free
    # rack 2: 72 free
    assert stranded_free_gpus(snap, {}) == 0, "nothing pending: nothing stranded"
    assert stranded_free_gpus(snap, {"nvidia.com/gpu": {72}}) == 32 + 20
    assert stranded_free_gpus(snap, {"nvidia.com/gpu": {16}}) == 0 + 4 + 8
    assert stranded_free_gpus(snap, {"nvidia.com/gpu": {16, 20}}) == 0 + 0 + 0
    assert stranded_free_gpus(snap, {"other": {16}}) == 0


@st.composite
def loaded(draw):
    snap = draw(snapshots())
    running = []
    accelerators = sorted({s.accelerator for s in snap.supernodes.values()})
    for i in range(draw(st.integers(0, 12))):
        acc = draw(st.sampled_from(accelerators))
        gpp = draw(st.sampled_from([1, 2, 4]))
        ppg = draw(st.sampled_from([1, 2, 4]))
        groups = draw(st.integers(1, 3))
        req = GangRequest(f"g{i}", groups, gpp * ppg, gpp, accelerator=acc)
        plan = plan_gang(snap, req)
        if not isinstance(plan, PlacementPlan):
            continue
        apply_plan(snap, plan)
        replicas = [held([g], gpp) for g in plan.groups]
        elastic = draw(st.booleans())
        gang = RunningGang(
            f"g{i}",
            draw(st.integers(0, 6)),
            draw(st.booleans()),
            tuple(replicas),
            min_replicas=draw(st.integers(1, len(replicas))) if elastic else None,
        )
        running.append(MovableGang(gang, req))
    acc = draw(st.sampled_from(accelerators))
    gpp = draw(st.sampled_from([1, 2, 4, 8]))
    request = GangRequest(
        "req",
        draw(st.integers(1, 4)),
        gpp * draw(st.sampled_from([1, 2, 4, 8, 18])),
        gpp,
        accelerator=acc,
        priority=draw(st.integers(0, 6)),
    )
    budget = draw(st.one_of(st.none(), st.integers(0, 200)))
    return snap, running, request, budget


@settings(max_examples=150, deadline=None)
@given(loaded())
def test_defrag_invariants(case):
    snap, running, request, budget = case
    plan_checked(snap, request, running, budget)


def plan_checked(
    snap: ClusterSnapshot, request: GangRequest, running: list[MovableGang], budget: int | None
) -> DefragPlan | None:
    """plan_defrag, its plan checked: the snapshot untouched; a plan only when the request does not
    fit as is, moving something, each gang once, within the budget; and all of check()."""
    before = {n: s.allocated for n, s in snap.nodes.items()}
    plan = plan_defrag(snap, request, running, budget)
    assert {n: s.allocated for n, s in snap.nodes.items()} == before, "the snapshot is untouched"
    if plan is None:
        return None
    assert not isinstance(plan_gang(snap, request), PlacementPlan), "only when it does not fit as is"
    assert plan.moves, "a plan always moves something (otherwise the request fitted)"
    assert len({m.eviction.gang for m in plan.moves}) == len(plan.moves)
    assert len(plan.moves) <= max(defrag_module.MAX_MOVES, 2 * request.groups), "each move is a restart: capped"
    if budget is not None:
        assert plan.moved_gpus <= budget
    check(snap, request, running, plan)
    return plan


def fragmented(rng: random.Random) -> tuple[ClusterSnapshot, list[MovableGang], GangRequest, int | None]:
    """3-6 NVL72 racks, 30-75% held by small gangs (some pinned, most elastic ones with their
    replicas wherever room was, as elastic growth leaves them), and a request for 36-72-GPU groups:
    the clusters defragmentation exists for."""
    n_racks = rng.randint(3, 6)
    snap = racks(n_racks)
    running = []
    fill = rng.uniform(0.3, 0.75) * 72 * n_racks
    for i in range(40):
        if sum(n.allocated for n in snap.nodes.values()) >= fill:
            break
        replicas, per_replica = rng.choice([1, 1, 2, 3, 4]), rng.choice([1, 1, 2])
        group_gpus = rng.choice([4, 8, 8, 16])
        name, priority = f"g{i:02d}", rng.randint(0, 4)
        allocations = []
        for r in range(replicas):
            on = rack(rng.randrange(n_racks))
            plan = plan_gang(snap, GangRequest(f"{name}-{r}", per_replica, group_gpus, 4, prefer_supernodes=(on,)))
            if not isinstance(plan, PlacementPlan):
                break
            apply_plan(snap, plan)
            allocations.append(held(plan.groups, 4))
        if not allocations:
            continue
        n = len(allocations)
        min_replicas = rng.randint(1, n) if n > 1 and rng.random() < 0.7 else None
        gang = RunningGang(name, priority, rng.random() < 0.85, tuple(allocations), min_replicas)
        running.append(MovableGang(gang, GangRequest(name, n * per_replica, group_gpus, 4, priority=priority)))
    request = GangRequest("req", rng.choice([1, 1, 2]), rng.choice([36, 48, 72]), 4, priority=rng.randint(2, 5))
    return snap, running, request, rng.choice([None, None, rng.randint(8, 120)])


def defrag_on_fragmented(seed: int, count: int = 300) -> tuple[int, int, int]:
    """Plan defragmentation on `count` seeded fragmented clusters, checking every plan's invariants.
    Returns how many were blocked, how many got a plan, and how many moves were shrinks."""
    rng = random.Random(seed)
    blocked = planned = shrinks = 0
    for _ in range(count):
        snap, running, request, budget = fragmented(rng)
        if isinstance(plan_gang(snap, request), PlacementPlan):
            continue
        blocked += 1
        plan = plan_checked(snap, request, running, budget)
        if plan is not None:
            planned += 1
            shrinks += sum(not m.eviction.whole for m in plan.moves)
    return blocked, planned, shrinks


def test_defrag_on_fragmented_racks_keeps_every_invariant():
    defrag_on_fragmented(seed=7)


def test_the_greedy_alone_on_fragmented_racks_keeps_every_invariant(monkeypatch):
    # The path of clusters with more than 24 options, which these small ones rarely take alone.
    monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    defrag_on_fragmented(seed=7)


@pytest.mark.parametrize("exact", [True, False], ids=["exact search", "greedy alone"])
def test_fragmented_racks_give_the_invariants_plans_and_shrinks_to_check(exact, monkeypatch):
    # The hypothesis test above draws general clusters, where a defragmentation plan is rare;
    # these are built fragmented, so plans and shrinks of elastic gangs are common (147 blocked,
    # 73 planned, 21 shrinks on seed 7; the greedy alone 70 and 23), and this test says so rather
    # than let the invariant tests pass on nothing.
    if not exact:
        monkeypatch.setattr(defrag_module, "EXACT_MAX_OPTIONS", 0)
    blocked, planned, shrinks = defrag_on_fragmented(seed=7)
    assert planned >= blocked // 3 and shrinks >= 15, (blocked, planned, shrinks)


@pytest.mark.parametrize("blocked", [4, 30], ids=["few options: all at once", "many: windows down the ranking"])
def test_a_plan_beyond_the_closest_supernodes_is_found_when_theirs_cannot_move(blocked):
    """Racks R00... each need one move (a job that fits nowhere else); rack E needs two moves of
    4-GPU jobs that do fit elsewhere (one free node on F and on G). The ranking puts the R racks
    first: a planner that only looks at the closest supernodes' gangs finds nothing, and neither
    does a greedy over every gang (it ranks the same racks first) once the options are many."""
    supernodes, nodes = [], []
    names = [f"R{i:02d}" for i in range(blocked)]
    for name, allocated in [*((s, (4, 4, 4, 4)) for s in [*names, "E"]), *((s, (0, 4, 4, 4)) for s in "FG")]:
        members = [f"{name}-n{i}" for i in range(4)]
        supernodes.append(SupernodeState(name, "g", members, "b0"))
        nodes += [NodeState(n, name, 4, a) for n, a in zip(members, allocated, strict=True)]
    snap = ClusterSnapshot(supernodes, nodes)
    running = []
    for s in names:  # one 8-GPU group on n2, n3: to move it, it would need 8 free GPUs on one rack
        gang = RunningGang(f"x-{s}", 0, True, (((f"{s}-n2", 4), (f"{s}-n3", 4)),))
        running.append(MovableGang(gang, GangRequest(gang.name, 1, 8, 4, "g")))
    for i, node in ((1, "E-n2"), (2, "E-n3")):
        gang = RunningGang(f"y{i}", 0, True, (((node, 4),),))
        running.append(MovableGang(gang, GangRequest(gang.name, 1, 4, 4, "g")))
    request = GangRequest("big", 1, 8, 4, "g", priority=1)
    plan = plan_defrag(snap, request, running, None)
    assert plan is not None, "two moves on E make room"
    assert sorted(m.eviction.gang for m in plan.moves) == ["y1", "y2"] and plan.placement.supernodes == {"E"}
    check(snap, request, running, plan)
