"""A defragmentation mover's way back: `plan_on` (a verified room taken as it is, if still valid)
and the booking of rooms in a cycle's snapshot (k8s/return_rooms.py). The operator-level
behaviour (a late job does not take the room, a restart keeps it, a called-off move frees it) is
in test_defrag_operator.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from tidal.k8s.quota import Quotas
from tidal.k8s.return_rooms import (
    book_rest_of_rooms,
    book_return_rooms,
    free_untaken_rooms,
    return_to,
    take_return_room,
    top_up_return_rooms,
)
from tidal.k8s.state import ResourceView
from tidal.k8s.watch import JournaledSnapshot
from tidal.placement import GangRequest, GroupAssignment, PlacementPlan
from tidal.placement.gang import plan_on
from tidal.topology import ClusterSnapshot
from tidal.topology.snapshot import NodeState, SupernodeState

STAMP = "2026-05-01T12:00:00Z"


def two_racks() -> ClusterSnapshot:
    """Racks a and b, two 4-GPU nodes each; b1 is b's hot spare."""
    return ClusterSnapshot(
        [SupernodeState("a", nodes=["a0", "a1"]), SupernodeState("b", nodes=["b0", "b1"])],
        [
            NodeState("a0", "a", 4),
            NodeState("a1", "a", 4),
            NodeState("b0", "b", 4),
            NodeState("b1", "b", 4, spare=True),
        ],
    )


REQUEST = GangRequest("j", 2, 4, 4)  # two groups of one 4-GPU pod
ROOM = (GroupAssignment(0, "a", ("a0",)), GroupAssignment(1, "a", ("a1",)))


def test_plan_on_takes_a_valid_room_as_it_is():
    plan = plan_on(two_racks(), REQUEST, ROOM)
    assert isinstance(plan, PlacementPlan) and plan.groups == ROOM


def test_plan_on_refuses_a_room_that_is_no_longer_valid():
    snap = two_racks()
    snap.allocate("a1", 1)
    assert plan_on(snap, REQUEST, ROOM) is None, "a node without the GPUs free"
    snap = two_racks()
    snap.update_node("a0", ready=False)
    assert plan_on(snap, REQUEST, ROOM) is None, "a failed node"
    wrong_rack = (GroupAssignment(0, "b", ("a0",)), ROOM[1])
    assert plan_on(two_racks(), REQUEST, wrong_rack) is None, "a node of another supernode"
    assert plan_on(two_racks(), REQUEST, ROOM[:1]) is None, "a group missing"
    assert plan_on(two_racks(), REQUEST, (ROOM[0], ROOM[0])) is None, "a group twice"
    spare = (ROOM[0], GroupAssignment(1, "b", ("b1",)))
    assert plan_on(two_racks(), REQUEST, spare) is None, "a hot spare, outside a recovery"
    other_accelerator = GangRequest("j", 2, 4, 4, accelerator="amd.com/gpu")
    assert plan_on(two_racks(), other_accelerator, ROOM) is None
    shared = (GroupAssignment(0, "a", ("a0",)), GroupAssignment(1, "a", ("a0",)))
    assert plan_on(two_racks(), REQUEST, shared) is None, "two pods on one 4-GPU node"


def _mover(eviction: dict | None, history: list | None = None) -> tuple[ResourceView, dict]:
    view = ResourceView("TrainingJob", "ml", "m", "uid-m", 1, STAMP, {"gpusPerPod": 4}, {}, {}, "1", deleting=False)
    status = {"eviction": eviction} if eviction else {}
    if history:
        status["evictionHistory"] = history
    return view, status


def _cycle(snapshot: ClusterSnapshot) -> SimpleNamespace:
    return SimpleNamespace(snapshot=snapshot, return_rooms={}, stamp=STAMP, quotas=Quotas())


def test_a_room_is_booked_as_the_work_on_it_leaves():
    """Half the room is held by work still leaving: booked is what is free, and the rest once it
    has left (the second call of a cycle, after the reconciles released it); never over-booked."""
    snap = two_racks()
    snap.allocate("a1", 4)  # another job's pod, leaving
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    statuses = {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})}
    book_return_rooms(cyc, statuses)
    assert (snap.nodes["a0"].allocated, snap.nodes["a1"].allocated) == (4, 4)
    snap.release("a1", 4)  # the leaving pod is gone
    book_return_rooms(cyc, statuses)
    assert snap.nodes["a1"].allocated == 4, "the freed GPUs are kept for the mover"
    book_return_rooms(cyc, statuses)
    assert snap.nodes["a1"].allocated == 4 and snap.nodes["a0"].allocated == 4, "booked once"
    plan = take_return_room(cyc, "uid-m", REQUEST)
    assert plan is not None and plan.groups == ROOM
    assert snap.free_gpus() == 12, "the caller books the plan it makes"


def test_a_room_is_kept_in_the_cycle_its_move_ends_and_freed_when_called_off():
    snap = two_racks()
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})})
    ended = _mover(None, history=[{"at": STAMP, "reason": "Defragmented", "gpus": 8}])
    book_return_rooms(cyc, {"uid-m": ended})
    assert snap.free_gpus() == 4, "ended this cycle: kept for the mover to take"
    book_return_rooms(cyc, {"uid-m": _mover(None)})  # called off: no eviction, nothing ended
    assert snap.free_gpus() == 12 and not cyc.return_rooms


def test_only_a_defragmentation_eviction_has_a_room():
    snap = two_racks()
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Preempted", "returnTo": room})})
    assert snap.free_gpus() == 12 and not cyc.return_rooms


def test_an_unreadable_room_is_none_and_never_fails_a_cycle():
    snap = two_racks()
    cyc = _cycle(snap)
    for bad in ({"nodes": "a0", "groups": "3-1@a=0"}, {"nodes": "a0", "groups": "x"}, "text", {"groups": 5}):
        book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": bad})})
        assert not cyc.return_rooms and snap.free_gpus() == 12, bad


def test_a_room_is_booked_on_a_tainted_or_held_node_and_checked_when_taken():
    """Booked where GPUs are unallocated, whatever the node's flags: a taint the mover tolerates
    (or a hold's cordon in the cycle) must not leave its room open to whoever tolerates it."""
    snap = two_racks()
    snap.update_node("a1", tainted=True)
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})})
    assert snap.nodes["a1"].allocated == 4
    assert take_return_room(cyc, "uid-m", REQUEST) is None, "untolerated now: planned afresh"
    assert snap.nodes["a1"].allocated == 0


def test_a_suspended_movers_room_is_freed():
    snap = two_racks()
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    view, status = _mover({"reason": "Defragmented", "returnTo": room})
    book_return_rooms(cyc, {"uid-m": (view, status)})
    assert snap.free_gpus() == 4
    suspended = dataclasses.replace(view, spec={**view.spec, "suspend": True})
    book_return_rooms(cyc, {"uid-m": (suspended, status)})
    assert snap.free_gpus() == 12 and not cyc.return_rooms


def test_the_rest_of_a_room_is_booked_in_the_copy_that_counts_leaving_work_free():
    """Preemption and pool plans count leaving work's GPUs as free (a copy with them released):
    the part of a room under such work must be booked there too, or they plan onto it."""
    snap = two_racks()
    snap.allocate("a1", 4)  # leaving work under half the room
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})})
    scratch = snap.copy()
    scratch.release("a1", 4)  # as without_evictions_in_flight does
    book_rest_of_rooms(cyc, scratch)
    assert scratch.nodes["a1"].allocated == 4 and scratch.nodes["a0"].allocated == 4
    assert snap.nodes["a1"].allocated == 4 and cyc.return_rooms["uid-m"].booked["a1"] == 0, "the cycle's own untouched"


def test_a_room_not_taken_in_the_cycle_its_move_ended_is_freed_at_the_end():
    snap = two_racks()
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})})
    free_untaken_rooms(cyc)
    assert snap.free_gpus() == 4, "a mover still leaving keeps its room"
    ended = _mover(None, history=[{"at": STAMP, "reason": "Defragmented", "gpus": 8}])
    book_return_rooms(cyc, {"uid-m": ended})
    free_untaken_rooms(cyc)
    assert snap.free_gpus() == 12 and not cyc.return_rooms


def _journaled(tainted: bool) -> JournaledSnapshot:
    return JournaledSnapshot(
        [SupernodeState("a", nodes=["a0", "a1"])],
        [NodeState("a0", "a", 4, tainted=tainted), NodeState("a1", "a", 4, tainted=tainted)],
    )


def _ended_room(snap: ClusterSnapshot) -> SimpleNamespace:
    """A cycle whose one room's move ended in it (the mover takes it now or it is freed)."""
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})})
    book_return_rooms(cyc, {"uid-m": _mover(None, history=[{"at": STAMP, "reason": "Defragmented", "gpus": 8}])})
    return cyc


def test_a_freed_room_counts_as_capacity_back_even_on_tainted_nodes():
    """Queued jobs skipped since nothing grew are tried again only when capacity_version moves: a
    room freed on tainted nodes (a mover that tolerates them) raises no free count by itself (a
    review's test)."""
    for tainted in (False, True):
        snap = _journaled(tainted)
        cyc = _ended_room(snap)
        before = snap.capacity_version
        free_untaken_rooms(cyc)
        assert snap.capacity_version > before, tainted


def test_a_room_taken_by_its_mover_is_no_capacity_back():
    """Freed and booked again at once: the queue is not tried again for it (a thousand queued jobs
    re-planned once per return, for nothing)."""
    snap = _journaled(False)
    cyc = _ended_room(snap)
    before = snap.capacity_version
    plan = take_return_room(cyc, "uid-m", REQUEST)
    assert plan is not None and snap.capacity_version == before


def test_rooms_are_topped_up_where_a_reconcile_freed_gpus():
    snap = two_racks()
    snap.allocate("a1", 4)  # leaving work
    cyc = _cycle(snap)
    room = return_to(PlacementPlan(REQUEST, ROOM))
    book_return_rooms(cyc, {"uid-m": _mover({"reason": "Defragmented", "returnTo": room})})
    snap.release("a1", 4)  # a reconcile ended the leaving work
    top_up_return_rooms(cyc)
    assert snap.nodes["a1"].allocated == 4 and cyc.return_rooms["uid-m"].booked == cyc.return_rooms["uid-m"].wanted
