"""A defragmentation mover's way back: the room it was verified to fit into again, kept for it.

The defragmenter proposes a move only when the moved work fits again once the blocked gang is
placed (`placement/defrag.py`). That room is written into the mover's eviction
(`status.eviction.returnTo`) and, while the eviction lasts, booked in every cycle's snapshot before
anything is planned: no admission, pool, recovery, growth or other mover's re-placement takes it,
whichever mover's checkpoint ends first. In the cycle the eviction ends, the mover takes the room
as it was verified (admission for a whole move, growth for given-back replicas), and only if that
is no longer a valid placement (a node failed, was cordoned or tainted meanwhile) is it planned
afresh. A room is booked only where GPUs are unallocated (whatever the node's taints: the mover may
tolerate them): the part of it that other leaving work still holds is booked as that work leaves
(`book_return_rooms` runs again after the reconciles), so a node never looks over-booked.

The room lives in the status, so a restarted operator keeps it; an eviction called off, a job
deleted or suspended, frees it in the same cycle, and a room its mover did not take in the cycle
its move ended is freed at the end of that cycle (`free_untaken_rooms`). Plans made on a copy that
counts leaving work as gone (preemption, pools) see the whole room booked (`book_rest_of_rooms`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tidal.k8s import compact
from tidal.k8s.cycle import Cycle
from tidal.k8s.state import ResourceView
from tidal.k8s.training import DEFRAGMENTED, placement_of
from tidal.k8s.watch import JournaledSnapshot
from tidal.placement import GangRequest, GroupAssignment, PlacementPlan
from tidal.placement.gang import plan_on
from tidal.topology.snapshot import ClusterSnapshot


@dataclass
class ReturnRoom:
    groups: tuple[GroupAssignment, ...]
    wanted: Counter[str]
    """Node -> GPUs the room needs there."""
    booked: Counter[str] = field(default_factory=Counter)
    """Node -> GPUs booked for it in this cycle's snapshot so far."""
    taking: bool = False
    """Its move ended in this cycle: the mover takes it now or it is freed (`free_untaken_rooms`)."""


def return_to(plan: PlacementPlan) -> dict[str, str]:
    """`status.eviction.returnTo` of a move re-placed by `plan` (the compact assignment form)."""
    return compact.encode(placement_of(plan))


def _room_of(view: ResourceView, status: dict[str, Any]) -> ReturnRoom | None:
    eviction = status.get("eviction") or {}
    if (
        view.deleting
        or view.spec.get("suspend")
        or not isinstance(eviction, dict)
        or eviction.get("reason") != DEFRAGMENTED
        or not eviction.get("returnTo")
    ):
        return None
    try:
        gpp = int(view.spec["gpusPerPod"])
        groups = tuple(
            GroupAssignment(int(g["group"]), str(g["supernode"]), tuple(str(n) for n in g["nodes"]))
            for g in compact.decode(eviction["returnTo"])
        )
    except Exception:  # any unreadable room (a hand edit) is none: never a failed cycle
        return None  # the mover is planned afresh
    if gpp <= 0 or not groups:
        return None
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
        if item is not None and _room_of(*item) is not None:
            continue  # still leaving
        if item is not None and _ended_this_cycle(cyc, *item):
            cyc.return_rooms[uid].taking = True
            continue
        _free(cyc, cyc.return_rooms.pop(uid))
    for uid, (view, status) in statuses.items():
        keep_return_room(cyc, uid, view, status)


def hold_room_quota_shares(cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]) -> None:
    """A mover whose eviction ended this cycle no longer counts in its namespace's quota (its
    placement is gone), yet takes its room later in the cycle: the room's GPUs of quota are kept
    for it, as a hold's share is, until it takes the room or gives it up (`take_return_room`, or
    admission once it was tried; `free_untaken_rooms` for the rest).
    Otherwise a job of its namespace queued before it took that share, and the mover, though its
    room was kept, was refused by the quota. Called once the cycle's quotas are built."""
    for uid, room in cyc.return_rooms.items():
        item = statuses.get(uid)
        if room.taking and item is not None:
            cyc.quotas.keep_room_share(item[0], cyc.priorities.of(item[0]), sum(room.wanted.values()))


def keep_return_room(cyc: Cycle, uid: str, view: ResourceView, status: dict[str, Any]) -> None:
    """Book what the job's room needs and is free now (nothing when it has no room)."""
    room = cyc.return_rooms.get(uid)
    if room is None:
        room = _room_of(view, status)
        if room is None:
            return
        cyc.return_rooms[uid] = room
    _book(cyc.snapshot, room.wanted, room.booked)


def _book(snapshot: ClusterSnapshot, wanted: Counter[str], booked: Counter[str]) -> None:
    """Book `wanted - booked` where the GPUs are unallocated, adding to `booked`. Unallocated, not
    free: a node's taint (the mover may tolerate it), a hold's cordon or a failure is the business
    of whoever plans there; the room is only kept from being planned into (`plan_on` checks the
    rest when the mover takes it)."""
    for name, gpus in wanted.items():
        node = snapshot.nodes.get(name)
        more = min(gpus - booked[name], node.gpus - node.allocated) if node is not None else 0
        if more > 0:
            snapshot.update_node(name, allocated=node.allocated + more)
            booked[name] += more


def book_rest_of_rooms(cyc: Cycle, scratch: ClusterSnapshot) -> None:
    """In a copy of the snapshot as it will be once every eviction under way has finished
    (`admission.without_evictions_in_flight`), book the rest of every room: the part still held by
    leaving work, which the copy has released. Preemption and pool plans made on the copy must
    not count on it."""
    for room in cyc.return_rooms.values():
        _book(scratch, room.wanted, Counter(room.booked))


def free_untaken_rooms(cyc: Cycle) -> None:
    """The cycle's planning is over: a room its mover did not take (it was not tried, or could
    not be placed) is free again now, so the queue is tried again on it next cycle."""
    freed = False
    for room in cyc.return_rooms.values():
        if not room.taking:
            continue
        freed |= bool(room.booked)
        _free(cyc, room)
    cyc.return_rooms = {uid: room for uid, room in cyc.return_rooms.items() if not room.taking}
    if freed and isinstance(cyc.snapshot, JournaledSnapshot):
        # Said outright: on a tainted node (a room the mover tolerates) the release raises no free
        # count, so the snapshot would not note that capacity came back.
        cyc.snapshot.capacity_version += 1


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
    cyc.quotas.release_room(uid)  # its quota share (`hold_room_quota_shares`): the caller checks the quota
    version = getattr(cyc.snapshot, "capacity_version", None)
    _free(cyc, room)
    plan = plan_on(cyc.snapshot, request, room.groups) if request is not None else None
    if plan is not None and version is not None:
        # The same GPUs are booked again at once by the caller: no capacity came back, and the
        # queue need not be tried again for it.
        cyc.snapshot.capacity_version = version
    return plan


def top_up_return_rooms(cyc: Cycle) -> None:
    """Book what rooms still lack where GPUs came free (a reconcile released leaving work): before
    the next job's recovery or growth in the same loop could plan onto them."""
    for room in cyc.return_rooms.values():
        if room.booked != room.wanted:
            _book(cyc.snapshot, room.wanted, room.booked)


def room_groups(cyc: Cycle, uid: str) -> tuple[int, ...]:
    """The group indices of the job's room this cycle (empty when it has none)."""
    room = cyc.return_rooms.get(uid)
    return tuple(sorted(g.group for g in room.groups)) if room is not None else ()
