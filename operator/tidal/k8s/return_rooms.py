"""A defragmentation mover's way back: the room it was verified to fit into again, kept for it.

The defragmenter proposes a move only when the moved work fits again once the blocked gang is
placed (`placement/defrag.py`). That room is written into the mover's eviction
(`status.eviction.returnTo`) and, while the eviction lasts, booked in every cycle's snapshot before
anything is planned: no admission, pool, recovery, growth or other mover's re-placement takes it,
whichever mover's checkpoint ends first. In the cycle the eviction ends, the mover takes the room
as it was verified (admission for a whole move, growth for given-back replicas), and only if that
is no longer a valid placement (a node failed, was cordoned or tainted meanwhile) is it planned
afresh. A room is booked only where GPUs are free: the part of it that other leaving work still
holds is booked as that work leaves (`book_return_rooms` runs again after the reconciles), so a
node never looks over-booked.

The room lives in the status, so a restarted operator keeps it; an eviction called off, a job
deleted or suspended, frees it in the same cycle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tidal.k8s import compact
from tidal.k8s.cycle import Cycle
from tidal.k8s.state import ResourceView
from tidal.k8s.training import DEFRAGMENTED
from tidal.placement import GangRequest, GroupAssignment, PlacementPlan
from tidal.placement.gang import plan_on


@dataclass
class ReturnRoom:
    groups: tuple[GroupAssignment, ...]
    wanted: Counter[str]
    """Node -> GPUs the room needs there."""
    booked: Counter[str] = field(default_factory=Counter)
    """Node -> GPUs booked for it in this cycle's snapshot so far."""


def return_to(plan: PlacementPlan) -> dict[str, str]:
    """`status.eviction.returnTo` of a move re-placed by `plan` (the compact assignment form)."""
    return compact.encode([{"group": g.group, "supernode": g.supernode, "nodes": list(g.nodes)} for g in plan.groups])


def _room_of(view: ResourceView, status: dict[str, Any]) -> ReturnRoom | None:
    eviction = status.get("eviction") or {}
    if view.deleting or eviction.get("reason") != DEFRAGMENTED or not eviction.get("returnTo"):
        return None
    try:
        placement = compact.decode(eviction["returnTo"])
        gpp = int(view.spec["gpusPerPod"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # a room that cannot be read is none: the mover is planned afresh
    groups = tuple(GroupAssignment(g["group"], g["supernode"], tuple(g["nodes"])) for g in placement)
    wanted: Counter[str] = Counter()
    for g in groups:
        for node in g.nodes:
            wanted[node] += gpp
    return ReturnRoom(groups, wanted)


def _ended_this_cycle(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> bool:
    """The job's defragmentation eviction ended in this cycle (its pods, or replicas, are gone)."""
    history = status.get("evictionHistory") or []
    last = history[-1] if history else {}
    return (
        not view.deleting
        and not view.spec.get("suspend")
        and not status.get("eviction")
        and last.get("reason") == DEFRAGMENTED
        and last.get("at") == cyc.stamp
    )


def book_return_rooms(cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]) -> None:
    """Book, in this cycle's snapshot, what the rooms of movers still leaving need and is free now.

    Called when the cycle starts and again after the reconciles, which release the GPUs of work
    that left (a room may lie on another mover's old nodes). After the reconciles a room is kept
    only for a mover still leaving or one whose eviction ended in this cycle (it takes the room in
    admission or growth); any other (called off, deleted, suspended) is freed for everyone."""
    for uid in list(cyc.return_rooms):
        item = statuses.get(uid)
        view, status = item if item is not None else (None, {})
        if view is None or (_room_of(view, status) is None and not _ended_this_cycle(cyc, view, status)):
            _free(cyc, cyc.return_rooms.pop(uid))
    for uid, (view, status) in statuses.items():
        keep_return_room(cyc, uid, view, status)


def keep_return_room(cyc: Cycle, uid: str, view: ResourceView, status: dict[str, Any]) -> None:
    """Book what the job's room needs and is free now (nothing when it has no room)."""
    room = cyc.return_rooms.get(uid)
    if room is None:
        room = _room_of(view, status)
        if room is None:
            return
        cyc.return_rooms[uid] = room
    snapshot = cyc.snapshot
    for name, gpus in room.wanted.items():
        node = snapshot.nodes.get(name)
        more = min(gpus - room.booked[name], node.free if node is not None else 0)
        if more > 0:
            snapshot.allocate(name, more)
            room.booked[name] += more


def _free(cyc: Cycle, room: ReturnRoom) -> None:
    for name, gpus in room.booked.items():
        cyc.snapshot.release(name, gpus)
    room.booked.clear()


def take_return_room(cyc: Cycle, uid: str, request: GangRequest | None) -> PlacementPlan | None:
    """The job's room as a plan for `request` if it still is a valid placement, else None (and
    None without a request). Either way the room is given up: its GPUs are free again in the
    snapshot for whoever plans next (the caller books the plan it makes)."""
    room = cyc.return_rooms.pop(uid, None)
    if room is None:
        return None
    _free(cyc, room)
    return plan_on(cyc.snapshot, request, room.groups) if request is not None else None


def room_groups(cyc: Cycle, uid: str) -> tuple[int, ...]:
    """The group indices of the job's room this cycle (empty when it has none)."""
    room = cyc.return_rooms.get(uid)
    return tuple(sorted(g.group for g in room.groups)) if room is not None else ()
