import pytest

from tidal.placement import (
    GangRequest,
    PlacementPlan,
    Unplaceable,
    UnplaceableReason,
    apply_plan,
    plan_first_fit,
    plan_gang,
    split_groups,
)
from tidal.topology import ClusterSnapshot, NodeState, OverbookedError, SupernodeState, build_fleet, snapshot_from_fleet


def mixed_snapshot() -> ClusterSnapshot:
    return snapshot_from_fleet(build_fleet("nvl72", 4) + build_fleet("cm384", 2) + build_fleet("hgx8", 6))


def test_mixed_fleet_snapshot_counts():
    snap = mixed_snapshot()
    assert snap.total_gpus() == 4 * 72 + 2 * 384 + 6 * 8
    assert snap.pod_slots("nvl72-0000", 4) == 18
    assert snap.pod_slots("cm384-0000", 8) == 48
    assert snap.supernodes["cm384-0001"].accelerator == "huawei.com/Ascend910"
    assert snap.largest_free_slice("hgx8-0003") == 8


def test_a_node_added_before_its_supernode_is_counted_once_listed_or_not():
    snap = ClusterSnapshot()
    snap.add_node(NodeState("listed", "A", 8))
    snap.add_node(NodeState("unlisted", "A", 8))
    snap.add_supernode(SupernodeState("A", "g", ["listed"]))
    assert snap.supernodes["A"].nodes == ["listed", "unlisted"]
    snap.update_node("unlisted", allocated=4)
    assert snap.free_gpus() == 12 and snap.largest_free_slice("A") == 12 and snap.pod_slots("A", 4) == 3


def test_a_supernode_may_not_list_another_supernodes_node():
    snap = ClusterSnapshot([SupernodeState("B", "g", ["m"])], [NodeState("m", "B", 8)])
    with pytest.raises(ValueError, match="supernode C lists node m, which belongs to B"):
        snap.add_supernode(SupernodeState("C", "g", ["m"]))


def test_moe_job_on_nvl72_keeps_each_group_in_one_rack():
    snap = mixed_snapshot()
    # tp=4, ep=16 -> 64-GPU groups; pp=2, dp=2 -> 4 groups, one per rack.
    plan = plan_gang(snap, GangRequest("moe", groups=4, group_gpus=64, gpus_per_pod=4))
    assert isinstance(plan, PlacementPlan)
    assert split_groups(snap, plan) == 0
    assert len(plan.supernodes) == 4
    assert all(len(g.nodes) == 16 for g in plan.groups)


def test_accelerator_must_match():
    snap = mixed_snapshot()
    plan = plan_gang(
        snap, GangRequest("ascend", groups=2, group_gpus=384, gpus_per_pod=8, accelerator="huawei.com/Ascend910")
    )
    assert isinstance(plan, PlacementPlan)
    assert plan.supernodes == {"cm384-0000", "cm384-0001"}
    none = plan_gang(snap, GangRequest("amd", groups=1, group_gpus=8, gpus_per_pod=8, accelerator="amd.com/gpu"))
    assert isinstance(none, Unplaceable) and none.reason is UnplaceableReason.NO_MATCHING_SUPERNODES


def test_best_fit_keeps_empty_supernodes_whole():
    snap = snapshot_from_fleet(build_fleet("nvl72", 3))
    for node in list(snap.member_nodes("nvl72-0001"))[:10]:
        snap.allocate(node.name, 4)  # 32 GPUs left in rack 1
    plan = plan_gang(snap, GangRequest("small", groups=1, group_gpus=16, gpus_per_pod=4))
    assert plan.supernodes == {"nvl72-0001"}


def test_fullest_nodes_are_used_first_inside_a_supernode():
    snap = snapshot_from_fleet(build_fleet("hgx8", 1, nodes_per_supernode=4))
    snap.allocate("hgx8-0000-n02", 6)
    plan = plan_gang(snap, GangRequest("tiny", groups=1, group_gpus=2, gpus_per_pod=2))
    assert plan.groups[0].nodes == ("hgx8-0000-n02",)


def test_gang_stays_in_fewest_blocks():
    snap = snapshot_from_fleet(build_fleet("nvl72", 48))  # 3 blocks of 16 racks
    # Leave block 0 partly used so that block 1 or 2 alone fits a 16-group gang.
    for node in list(snap.member_nodes("nvl72-0000"))[:4]:
        snap.allocate(node.name, 4)
    plan = plan_gang(snap, GangRequest("g", groups=16, group_gpus=72, gpus_per_pod=4))
    blocks = {snap.supernodes[g.supernode].block for g in plan.groups}
    assert len(blocks) == 1
    plan = plan_gang(snap, GangRequest("g", groups=20, group_gpus=72, gpus_per_pod=4))
    assert len({snap.supernodes[g.supernode].block for g in plan.groups}) == 2


def test_failed_cordoned_and_spare_nodes():
    snap = snapshot_from_fleet(build_fleet("nvl72", 1))
    snap.update_node("nvl72-0000-n00", ready=False)
    snap.update_node("nvl72-0000-n01", cordoned=True)
    snap.update_node("nvl72-0000-n02", spare=True)
    snap.update_node("nvl72-0000-n03", spare=True)
    assert snap.pod_slots("nvl72-0000", 4) == 14
    full = plan_gang(snap, GangRequest("all", groups=1, group_gpus=56, gpus_per_pod=4))
    assert isinstance(full, PlacementPlan)
    used = set(full.groups[0].nodes)
    assert not used & {"nvl72-0000-n00", "nvl72-0000-n01", "nvl72-0000-n02", "nvl72-0000-n03"}
    assert isinstance(plan_gang(snap, GangRequest("more", groups=1, group_gpus=60, gpus_per_pod=4)), Unplaceable)
    recovery = plan_gang(
        snap,
        GangRequest("fix", groups=1, group_gpus=8, gpus_per_pod=4, recovery=True, prefer_supernodes=("nvl72-0000",)),
    )
    assert set(recovery.groups[0].nodes) == {"nvl72-0000-n02", "nvl72-0000-n03"}, "recovery uses spares first"


def test_unplaceable_reasons_and_numbers():
    snap = snapshot_from_fleet(build_fleet("nvl72", 10))
    for sn in list(snap.supernodes)[1:]:
        for node in list(snap.member_nodes(sn))[:3]:
            snap.allocate(node.name, 4)
    busy = plan_gang(snap, GangRequest("j", groups=32, group_gpus=64, gpus_per_pod=4))
    assert busy.reason is UnplaceableReason.LARGER_THAN_CLUSTER and busy.permanent
    busy = plan_gang(snap, GangRequest("j", groups=4, group_gpus=64, gpus_per_pod=4))
    assert busy.reason is UnplaceableReason.INSUFFICIENT_FREE_CAPACITY and not busy.permanent
    assert busy.message == (
        "needs 4 group(s) of 64 nvidia.com/gpu (16 pod(s) x 4) each inside one supernode; "
        "1 supernode(s) have >= 64 free GPUs (room for 1 group(s) now)"
    )
    assert plan_gang(snap, GangRequest("j", 1, 80, 4)).reason is UnplaceableReason.GROUP_LARGER_THAN_SUPERNODES
    assert plan_gang(snap, GangRequest("j", 1, 8, 8)).reason is UnplaceableReason.POD_LARGER_THAN_NODES


def test_apply_plan_books_gpus_and_refuses_stale_plans():
    snap = snapshot_from_fleet(build_fleet("hgx8", 2))
    plan = plan_gang(snap, GangRequest("a", groups=2, group_gpus=8, gpus_per_pod=8))
    apply_plan(snap, plan)
    assert snap.free_gpus() == 0
    with pytest.raises(OverbookedError):
        apply_plan(snap, plan)
    assert snap.allocated_gpus() == 16


def test_first_fit_baseline_splits_groups_across_racks():
    snap = snapshot_from_fleet(build_fleet("nvl72", 4))
    plan = plan_first_fit(snap, GangRequest("ff", groups=4, group_gpus=64, gpus_per_pod=4))
    assert split_groups(snap, plan) == 3
    assert split_groups(snap, plan_gang(snap, GangRequest("t", groups=4, group_gpus=64, gpus_per_pod=4))) == 0


def test_snapshot_rejects_duplicates_and_tracks_nodes_added_later():
    snap = ClusterSnapshot([SupernodeState("s", nodes=["a"])])
    snap.add_node(NodeState("a", "s", 8))
    snap.add_node(NodeState("b", "s", 8))
    assert snap.supernodes["s"].nodes == ["a", "b"]
    assert snap.pod_slots("s", 8) == 2
    with pytest.raises(ValueError):
        snap.add_node(NodeState("a", "s", 8))


def test_best_fit_baseline_keeps_groups_whole_and_packs_like_kueue_best_fit():
    from tidal.placement import plan_best_fit

    snap = snapshot_from_fleet(build_fleet("nvl72", 3))
    for node in list(snap.member_nodes("nvl72-0000"))[:10]:
        snap.allocate(node.name, 4)  # 32 free
    for node in list(snap.member_nodes("nvl72-0001"))[:14]:
        snap.allocate(node.name, 4)  # 16 free
    one = plan_best_fit(snap, GangRequest("one", groups=1, group_gpus=16, gpus_per_pod=4))
    assert one.supernodes == {"nvl72-0001"}, "the tightest supernode that holds the remainder"
    three = plan_best_fit(snap, GangRequest("three", groups=5, group_gpus=16, gpus_per_pod=4))
    assert split_groups(snap, three) == 0
    assert [g.supernode for g in three.groups] == ["nvl72-0002"] * 4 + ["nvl72-0001"], "most room first"
