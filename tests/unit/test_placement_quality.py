"""Each quality rule of plan_gang pinned by a test that fails when the rule is removed.

Mutations tried (see the README's placement section): tightest-first inside a block instead of the
leftover score, best-fit block chosen before the leftover score, worst-fit block on a tie, the
emptiest blocks scored instead of the fullest, smallest blocks first when none suffices, a single
group scored only in the fullest blocks, no whole-domain worth, a diagnosis cache keyed on object
identity, other racks' spares before their free nodes (inside a rack and as a tier). Fullest nodes
first inside a supernode is pinned in test_placement.py. tests/unit/test_quality_mutants.py
re-applies these mutants on every run.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tidal.placement import (
    GangRequest,
    Packing,
    PlacementPlan,
    Unplaceable,
    UnplaceableReason,
    apply_plan,
    gang,
    plan_gang,
)
from tidal.placement.leftover import GroupDemand, stranded_gpus
from tidal.topology import ClusterSnapshot, NodeState, SupernodeState, build_fleet, snapshot_from_fleet


def use(snap: ClusterSnapshot, supernode: str, nodes: int) -> None:
    for node in list(snap.member_nodes(supernode))[:nodes]:
        snap.allocate(node.name, node.gpus)


def spares_and_full(snap: ClusterSnapshot, supernode: str, spares: int) -> list[NodeState]:
    """Make the supernode's first `spares` nodes hot spares and fill the rest; its nodes, in order."""
    nodes = list(snap.member_nodes(supernode))
    for node in nodes[:spares]:
        snap.update_node(node.name, spare=True)
    for node in nodes[spares:]:
        snap.allocate(node.name, node.gpus)
    return nodes


def test_queued_group_sizes_keep_the_empty_rack_for_the_job_that_fits_it():
    # Racks with 36 / 36 / 72 free; a 3x24 job now, a 2x36 job queued behind it.
    snap = snapshot_from_fleet(build_fleet("nvl72", 3))
    use(snap, "nvl72-0000", 9)
    use(snap, "nvl72-0001", 9)
    demand = GroupDemand()
    demand.observe("huawei.com/Ascend910", 48, 10.0)  # another accelerator's sizes do not count
    demand.observe("nvidia.com/gpu", 24)
    demand.observe("nvidia.com/gpu", 36, 2.0)
    first = plan_gang(snap, GangRequest("a", groups=3, group_gpus=24, gpus_per_pod=4), demand)
    assert isinstance(first, PlacementPlan)
    assert first.supernodes == {"nvl72-0002"}, "tightest-first spreads the job over the 36-GPU holes"
    apply_plan(snap, first)
    second = plan_gang(snap, GangRequest("b", groups=2, group_gpus=36, gpus_per_pod=4), demand)
    assert isinstance(second, PlacementPlan)
    assert second.supernodes == {"nvl72-0000", "nvl72-0001"}


def test_an_empty_domain_is_worth_more_than_its_group_sizes():
    # 40 free in rack 0, 72 (whole) in rack 1, 20-GPU groups queued. By sizes alone a 4-GPU group
    # costs rack 1 nothing (72 -> 68 still holds three 20s) and rack 0 one 20; the worth of a
    # whole domain keeps rack 1 empty for whatever needs a whole rack.
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    use(snap, "nvl72-0000", 8)
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 20)
    plan = plan_gang(snap, GangRequest("tiny", groups=1, group_gpus=4, gpus_per_pod=4), demand)
    assert plan.supernodes == {"nvl72-0000"}


def test_an_empty_domain_keeps_its_worth_when_the_leftover_score_ties():
    # 40 free in rack 0, 72 in rack 1: a 4-GPU group loses the same 4 usable GPUs in either rack
    # by size alone; only the worth of a whole domain keeps rack 1 empty.
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    use(snap, "nvl72-0000", 8)
    plan = plan_gang(snap, GangRequest("tiny", groups=1, group_gpus=4, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0000"}
    plan = plan_gang(snap, GangRequest("two", groups=2, group_gpus=8, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0000"}


def test_a_single_group_goes_to_the_best_hole_in_any_block_not_the_fullest_block():
    # Block 0: its only room is a whole empty rack. Block 1: many racks, one with a 16-GPU hole.
    # Choosing the fullest block first would break the empty rack.
    snap = snapshot_from_fleet(build_fleet("nvl72", 32))  # 2 blocks of 16 racks
    for s in range(16):
        if s != 3:
            use(snap, f"nvl72-{s:04d}", 18)
    for s in range(16, 32):
        use(snap, f"nvl72-{s:04d}", 14 if s == 20 else 9)
    plan = plan_gang(snap, GangRequest("g", groups=1, group_gpus=16, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0020"}


def test_gang_fitting_one_block_stays_in_it():
    snap = snapshot_from_fleet(build_fleet("nvl72", 48))
    for s in range(16, 32):
        use(snap, f"nvl72-{s:04d}", 2)  # block 1: 64 free per rack; blocks 0 and 2 empty
    plan = plan_gang(snap, GangRequest("g", groups=16, group_gpus=64, gpus_per_pod=4))
    assert {snap.supernodes[s].block for s in plan.supernodes} == {"nvl72-block-001"}


def test_the_fuller_block_wins_when_the_leftover_score_ties():
    # Block 0: three racks with 16 free; block 1: two. Two 16-GPU groups empty two holes either
    # way (the same leftover lost); best-fit keeps block 0's third hole and takes block 1, which
    # is second by name, so name order cannot pass for the rule.
    snap = snapshot_from_fleet(build_fleet("nvl72", 48))
    holes = {0, 1, 2, 16, 17}
    for s in range(48):
        use(snap, f"nvl72-{s:04d}", 14 if s in holes else 18)
    plan = plan_gang(snap, GangRequest("pair", groups=2, group_gpus=16, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0016", "nvl72-0017"}


def test_the_fullest_blocks_are_the_ones_scored_when_many_fit():
    # More blocks fit a 2x16 gang than BLOCKS_SCORED. Each has a rack with 48 free but the last
    # by name, whose rack has exactly 32: every choice loses the same leftover, so best-fit must
    # take the last block, which it can only if the fullest blocks are the ones scored.
    blocks = gang.BLOCKS_SCORED + 2
    snap = snapshot_from_fleet(build_fleet("nvl72", blocks * 16))
    for s in range(blocks * 16):
        block, rack = divmod(s, 16)
        use(snap, f"nvl72-{s:04d}", 18 if rack else (10 if block == blocks - 1 else 6))
    plan = plan_gang(snap, GangRequest("pair", groups=2, group_gpus=16, gpus_per_pod=4))
    assert plan.supernodes == {f"nvl72-{(blocks - 1) * 16:04d}"}


def test_the_largest_blocks_go_first_when_no_block_suffices():
    # Empty racks per block: 3, 10, 3, 10. A 20-rack gang fits in the two large blocks; smallest
    # blocks first would spread it over all four, name order over three.
    snap = snapshot_from_fleet(build_fleet("nvl72", 64))
    for s in range(64):
        block, rack = divmod(s, 16)
        if rack >= (10 if block % 2 else 3):
            use(snap, f"nvl72-{s:04d}", 18)
    plan = plan_gang(snap, GangRequest("big", groups=20, group_gpus=72, gpus_per_pod=4))
    assert isinstance(plan, PlacementPlan)
    assert {snap.supernodes[s].block for s in plan.supernodes} == {"nvl72-block-001", "nvl72-block-003"}


def test_a_single_group_competes_in_every_block_however_many_there_are():
    # More blocks than BLOCKS_SCORED. The exact 16-GPU holes are in the emptiest block (the last);
    # every other block has one 20-GPU hole, which a queued 20-GPU group needs. Scoring only the
    # fullest blocks would never see the exact holes.
    blocks = gang.BLOCKS_SCORED + 2
    snap = snapshot_from_fleet(build_fleet("nvl72", blocks * 16))
    for s in range(blocks * 16):
        block, rack = divmod(s, 16)
        if block == blocks - 1 and rack < 3:
            use(snap, f"nvl72-{s:04d}", 14)  # 16 free
        elif block < blocks - 1 and rack == 0:
            use(snap, f"nvl72-{s:04d}", 13)  # 20 free
        else:
            use(snap, f"nvl72-{s:04d}", 18)
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 16)
    demand.observe("nvidia.com/gpu", 20)
    plan = plan_gang(snap, GangRequest("one", groups=1, group_gpus=16, gpus_per_pod=4), demand)
    assert plan.supernodes <= {f"nvl72-{(blocks - 1) * 16 + i:04d}" for i in range(3)}, plan.supernodes


def test_recovery_order_own_spares_then_other_racks_free_nodes_then_their_spares():
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    for sn in ("nvl72-0000", "nvl72-0001"):
        spares_and_full(snap, sn, 2)
    snap.release("nvl72-0001-n10", 4)
    snap.release("nvl72-0001-n11", 4)
    fix = GangRequest("fix", 2, 8, 4, recovery=True, prefer_supernodes=("nvl72-0000",))
    plan = plan_gang(snap, fix)
    assert isinstance(plan, PlacementPlan)
    assert [g.nodes for g in plan.groups] == [
        ("nvl72-0000-n00", "nvl72-0000-n01"),  # own rack's hot spares
        ("nvl72-0001-n10", "nvl72-0001-n11"),  # the other rack's ordinary free nodes, not its spares
    ]
    more = plan_gang(snap, GangRequest("fix", 3, 8, 4, recovery=True, prefer_supernodes=("nvl72-0000",)))
    assert isinstance(more, PlacementPlan)
    assert more.groups[2].nodes == ("nvl72-0001-n00", "nvl72-0001-n01"), "other racks' spares come last"
    assert isinstance(plan_gang(snap, GangRequest("plain", 2, 8, 4)), Unplaceable), "spares are for recovery"


def test_recovery_takes_other_racks_free_nodes_before_any_of_their_spares():
    # The own rack is full. Racks 1 and 2 have one 8-GPU group of ordinary free nodes each, rack 3
    # only hot spares (room for two). Three groups: both ordinary holes, then one group of spares.
    snap = snapshot_from_fleet(build_fleet("nvl72", 4))
    use(snap, "nvl72-0000", 18)
    for sn in ("nvl72-0001", "nvl72-0002"):
        use(snap, sn, 16)
    spares_and_full(snap, "nvl72-0003", 4)
    fix = GangRequest("fix", 3, 8, 4, recovery=True, prefer_supernodes=("nvl72-0000",))
    plan = plan_gang(snap, fix)
    assert isinstance(plan, PlacementPlan)
    on_spares = [g for g in plan.groups if any(snap.nodes[n].spare for n in g.nodes)]
    assert len(on_spares) == 1, plan.groups
    assert plan.supernodes == {"nvl72-0001", "nvl72-0002", "nvl72-0003"}


def _tiny_cluster(gpus_per_node: int) -> ClusterSnapshot:
    nodes = [NodeState(name, "s", gpus_per_node) for name in ("a", "b")]
    return ClusterSnapshot([SupernodeState("s", nodes=["a", "b"])], nodes)


def test_diagnosis_of_one_snapshot_is_never_read_for_another(monkeypatch):
    # A freed snapshot's address is reused by the next one; stand in for that by making every
    # object's id() the same. Same shape_version, different nodes: a cache keyed on identity
    # would call the second snapshot's placeable job permanently unplaceable.
    monkeypatch.setattr(gang, "id", lambda _obj: 1, raising=False)
    request = GangRequest("big-pods", groups=1, group_gpus=8, gpus_per_pod=8)
    small = _tiny_cluster(4)
    assert plan_gang(small, request).reason is UnplaceableReason.POD_LARGER_THAN_NODES
    big = _tiny_cluster(8)
    assert big.shape_version == small.shape_version
    use(big, "s", 2)  # both nodes busy: a capacity problem, not a permanent one
    result = plan_gang(big, request)
    assert isinstance(result, Unplaceable) and not result.permanent
    big.release("a", 8)
    assert isinstance(plan_gang(big, request), PlacementPlan)


def test_stranded_gpus_count_what_no_mix_of_pending_sizes_can_use():
    assert stranded_gpus(36, [24]) == 12
    assert stranded_gpus(36, [24, 12]) == 0
    assert stranded_gpus(20, [8, 12]) == 0
    assert stranded_gpus(7, [8]) == 7


def test_a_small_group_goes_where_it_costs_queued_sizes_nothing_not_into_the_tightest_hole():
    # 16 free in rack 0 (a queued 16-GPU group fits exactly), 36 in rack 1 (two fit, 4 spare).
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    use(snap, "nvl72-0000", 14)
    use(snap, "nvl72-0001", 9)
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 16, 4.0)
    plan = plan_gang(snap, GangRequest("tiny", groups=1, group_gpus=4, gpus_per_pod=4), demand)
    assert plan.supernodes == {"nvl72-0001"}, "the tightest hole would strand the queued group"


def test_the_block_whose_leftover_loses_least_wins_over_the_fullest_block():
    # Block 0: one rack with 32 free (room for 2 groups). Block 1: three racks with 16 free.
    # Best-fit by capacity picks block 0 and destroys the only 32-GPU hole; the leftover score
    # fills two 16-GPU holes in block 1 instead.
    snap = snapshot_from_fleet(build_fleet("nvl72", 32))
    for s in range(32):
        use(snap, f"nvl72-{s:04d}", {3: 10, 20: 14, 21: 14, 22: 14}.get(s, 18))
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 16)
    demand.observe("nvidia.com/gpu", 32)
    plan = plan_gang(snap, GangRequest("pair", groups=2, group_gpus=16, gpus_per_pod=4), demand)
    assert plan.supernodes <= {"nvl72-0020", "nvl72-0021", "nvl72-0022"} and len(plan.supernodes) == 2


def test_recovery_with_room_only_on_spares_is_placed_not_crashed():
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    use(snap, "nvl72-0000", 18)
    nodes = spares_and_full(snap, "nvl72-0001", 4)
    plan = plan_gang(snap, GangRequest("fix", 1, 16, 4, recovery=True, prefer_supernodes=("nvl72-0000",)))
    assert isinstance(plan, PlacementPlan) and set(plan.groups[0].nodes) == {n.name for n in nodes[:4]}


def test_a_gang_already_in_a_block_through_its_preferred_rack_stays_in_that_block():
    # Group 1 fits the preferred rack 0 (block 0); group 2 must stay in block 0 (rack 5), even
    # though block 1 has a tighter hole (rack 20, exactly 16 free).
    snap = snapshot_from_fleet(build_fleet("nvl72", 32))
    for s in range(32):
        use(snap, f"nvl72-{s:04d}", {0: 14, 5: 8, 20: 14}.get(s, 18))
    for recovery in (False, True):
        request = GangRequest(
            "g", groups=2, group_gpus=16, gpus_per_pod=4, recovery=recovery, prefer_supernodes=("nvl72-0000",)
        )
        plan = plan_gang(snap, request)
        assert plan.supernodes == {"nvl72-0000", "nvl72-0005"}, recovery


def test_a_small_group_joins_the_busier_of_two_equal_holes():
    # Racks 0 and 1 both have 36 of 72 GPUs free, so by leftover they tie (and name order would
    # pick rack 0). Rack 0's 36 are held by one workload, rack 1's by six: rack 0 is whole again
    # when one job leaves, rack 1 only when all six do, so the new group joins rack 1.
    snap = snapshot_from_fleet(build_fleet("nvl72", 3))
    use(snap, "nvl72-0000", 9)
    use(snap, "nvl72-0001", 9)
    snap.add_residents(["nvl72-0000"])
    for _ in range(6):
        snap.add_residents(["nvl72-0001"])
    plan = plan_gang(snap, GangRequest("tiny", groups=1, group_gpus=4, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0001"}
    plan = plan_gang(snap, GangRequest("two", groups=2, group_gpus=8, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0001"}
    # One resident each: joining either costs more than with six, still less than breaking the
    # empty rack 2 (its whole-domain worth).
    snap.add_residents(["nvl72-0001"], -5)
    plan = plan_gang(snap, GangRequest("tiny", groups=1, group_gpus=4, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0000"}


def test_resident_counts_follow_arrivals_and_departures_and_survive_a_copy():
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    snap.add_residents(["nvl72-0000", "nvl72-0000", "nvl72-0001"])  # one workload: counted once
    snap.add_residents(["nvl72-0000"])
    clone = snap.copy()
    snap.add_residents(["nvl72-0000", "nvl72-0001"], -1)
    assert dict(snap.residents) == {"nvl72-0000": 1}
    assert dict(clone.residents) == {"nvl72-0000": 2, "nvl72-0001": 1}


def test_the_joining_cost_is_weighed_for_every_group_count_not_after_choosing_it():
    # Rack 0: 40 free, two residents; rack 1 empty; 8- and 32-GPU groups in demand; a 5x8 gang.
    # All five in rack 0 lose 36 of leftover plus the joining cost once (4 x 72 / 9 = 32): 68;
    # the empty rack loses 108 (its whole-domain worth included). Choosing how many groups go
    # to rack 0 by leftover alone (one: 4 lost) and then adding the joining cost to that one group
    # (36 per group) made rack 0 look dearer than breaking the empty rack (21.6 per group).
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    use(snap, "nvl72-0000", 8)
    snap.add_residents(["nvl72-0000"])
    snap.add_residents(["nvl72-0000"])
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 8)
    demand.observe("nvidia.com/gpu", 32)
    plan = plan_gang(snap, GangRequest("five", groups=5, group_gpus=8, gpus_per_pod=4), demand)
    assert plan.supernodes == {"nvl72-0000"}


def test_the_joining_cost_is_part_of_the_memo_not_only_of_the_leftover():
    # Three racks with 32 free each (same free count, so the same leftover memo), residents 1 / 6
    # / 6: a 3x16 gang goes where joining is cheapest (racks 1 and 2), which a memo keyed on the
    # leftover alone answers with rack 0's joining cost for all three.
    snap = snapshot_from_fleet(build_fleet("nvl72", 3))
    for rack, residents in ((0, 1), (1, 6), (2, 6)):
        use(snap, f"nvl72-000{rack}", 10)
        snap.add_residents([f"nvl72-000{rack}"], residents)
    plan = plan_gang(snap, GangRequest("g", groups=3, group_gpus=16, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0001", "nvl72-0002"}


def test_the_loss_reported_pays_each_supernodes_joining_cost_once():
    snap = snapshot_from_fleet(build_fleet("nvl72", 3))
    for rack, residents in ((0, 1), (1, 2), (2, 6)):
        use(snap, f"nvl72-000{rack}", 10)
        snap.add_residents([f"nvl72-000{rack}"], residents)
    scorer = gang._LeftoverScorer(16, {16: 1.0})
    capacity = {f"nvl72-000{rack}": 2 for rack in range(3)}
    picks, lost = gang._least_leftover_lost(snap, scorer, capacity, 5)
    expected = 0.0
    for name, groups in picks:
        free, whole = snap.largest_free_slice(name), snap.domain_gpus(name)
        expected += scorer.loss(free, whole, groups) + gang.resident_cost(snap.residents[name], whole)
    assert sum(groups for _, groups in picks) == 5
    assert lost == pytest.approx(expected)


def racks_with_residents(*racks: tuple[int, int]) -> ClusterSnapshot:
    """NVL72 racks, each (nodes used, resident workloads)."""
    snap = snapshot_from_fleet(build_fleet("nvl72", len(racks)))
    for rack, (used, residents) in enumerate(racks):
        use(snap, f"nvl72-{rack:04d}", used)
        snap.add_residents([f"nvl72-{rack:04d}"], residents)
    return snap


def test_a_workload_pays_no_joining_cost_where_it_already_is():
    # Growth of a job that holds rack 0 (its only resident): rack 0 costs nothing to join for it,
    # while for anyone else rack 1 (six residents) is cheaper.
    snap = racks_with_residents((9, 1), (9, 6))
    other = plan_gang(snap, GangRequest("other", groups=1, group_gpus=8, gpus_per_pod=4))
    assert other.supernodes == {"nvl72-0001"}
    growth = plan_gang(
        snap, GangRequest("grow", groups=1, group_gpus=8, gpus_per_pod=4, resident_on=frozenset({"nvl72-0000"}))
    )
    assert growth.supernodes == {"nvl72-0000"}


def test_fill_packing_takes_the_tighter_rack_whatever_its_residents():
    # Rack 0 (one resident) is tighter than rack 1 (six residents). keep-whole sends the group to
    # the busy rack so that rack 0 can come back whole soon; fill (the operator's --packing fill,
    # for users who resubmit rather than queue) has no resident cost: the tighter rack.
    snap = racks_with_residents((10, 1), (9, 6))
    request = GangRequest("g", groups=1, group_gpus=8, gpus_per_pod=4)
    assert plan_gang(snap, request).supernodes == {"nvl72-0001"}
    assert plan_gang(snap, replace(request, packing=Packing.FILL)).supernodes == {"nvl72-0000"}


def test_fill_packing_gives_an_empty_domain_no_worth_beyond_its_group_sizes():
    # As test_an_empty_domain_is_worth_more_than_its_group_sizes: rack 1 whole, 20-GPU groups in
    # demand, a 4-GPU group. keep-whole keeps rack 1 empty; fill values racks by the demanded sizes
    # alone, and 72 -> 68 still holds three 20s where 40 -> 36 loses one.
    snap = snapshot_from_fleet(build_fleet("nvl72", 2))
    use(snap, "nvl72-0000", 8)
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 20)
    request = GangRequest("tiny", groups=1, group_gpus=4, gpus_per_pod=4)
    assert plan_gang(snap, request, demand).supernodes == {"nvl72-0000"}
    assert plan_gang(snap, replace(request, packing=Packing.FILL), demand).supernodes == {"nvl72-0001"}


def test_a_supernode_taken_again_by_a_later_step_is_not_charged_its_joining_cost_twice():
    # Found by comparing against a planner that charges the joining cost at every step: the
    # greedy comes back to rack 1 for more groups, and must not pay its five residents' cost again.
    snap = snapshot_from_fleet(build_fleet("nvl72", 4))
    for rack, (nodes, residents) in enumerate(((17, 3), (3, 5), (16, 5), (8, 5))):
        use(snap, f"nvl72-000{rack}", nodes)
        snap.add_residents([f"nvl72-000{rack}"], residents)
    demand = GroupDemand()
    demand.observe("nvidia.com/gpu", 64)
    demand.observe("nvidia.com/gpu", 32)
    plan = plan_gang(snap, GangRequest("g", groups=17, group_gpus=4, gpus_per_pod=4), demand)
    per_supernode = {sn: sum(1 for g in plan.groups if g.supernode == sn) for sn in plan.supernodes}
    assert per_supernode == {"nvl72-0001": 15, "nvl72-0002": 2}
