"""Which whole gangs (or whole elastic DP replicas) to evict so a higher-priority gang fits.

Greedy on "groups of room gained per GPU evicted", where a supernode brought closer to holding
one more group earns part of a group: evictions concentrated on few supernodes win, so the
planner frees whole domains rather than scattering victims. A pruning pass then gives back
every eviction the plan can do without. Never touches a non-preemptible gang or one of equal or
higher priority; returns nothing at all when even evicting every candidate would not make room.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tidal.placement.gang import plan_gang
from tidal.placement.types import GangRequest, PlacementPlan, Unplaceable
from tidal.topology.snapshot import ClusterSnapshot

Allocation = tuple[tuple[str, int], ...]
"""(node, GPUs) pairs."""

_PARTIAL_CREDIT = 0.5


@dataclass(frozen=True)
class RunningGang:
    name: str
    priority: int
    preemptible: bool
    replicas: tuple[Allocation, ...]
    """Allocations per DP replica (a non-elastic gang may use a single entry)."""
    min_replicas: int | None = None
    """Elastic gangs may shrink to this many replicas by giving back their highest replicas."""

    @property
    def gpus(self) -> int:
        return sum(g for replica in self.replicas for _, g in replica)


@dataclass(frozen=True)
class Eviction:
    gang: str
    replicas: tuple[int, ...]
    whole: bool
    """True: suspend the whole gang. False: shrink it by giving back `replicas`."""
    gpus: int


@dataclass(frozen=True)
class PreemptionPlan:
    evictions: tuple[Eviction, ...]
    placement: PlacementPlan

    @property
    def evicted_gpus(self) -> int:
        return sum(e.gpus for e in self.evictions)


@dataclass
class _Move:
    gang: RunningGang
    replicas: tuple[int, ...]
    whole: bool

    def allocation(self) -> list[tuple[str, int]]:
        return [a for r in self.replicas for a in self.gang.replicas[r]]

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.allocation())


def plan_preemption(
    snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang]
) -> PreemptionPlan | Unplaceable:
    direct = plan_gang(snapshot, request)
    if not isinstance(direct, Unplaceable):
        return PreemptionPlan((), direct)
    if direct.permanent:
        return direct
    eligible = [g for g in running if g.preemptible and g.priority < request.priority and g.replicas]
    if not eligible:
        return direct
    room = _Room(snapshot.copy(), request)
    for gang in eligible:
        room.release(_Move(gang, tuple(range(len(gang.replicas))), True).allocation())
    if room.groups() < request.groups:
        return direct  # evicting every candidate would still not make room: evict nobody

    room = _Room(snapshot.copy(), request)
    evicted: dict[str, set[int]] = defaultdict(set)
    whole: set[str] = set()
    chosen: list[_Move] = []
    while room.groups() < request.groups:
        best = max(
            _candidate_moves(eligible, evicted, whole),
            key=lambda m: (room.gain(m.allocation()) / max(m.gpus, 1), -m.gang.priority, -m.gpus, m.gang.name),
        )
        room.release(best.allocation())
        chosen.append(best)
        evicted[best.gang.name].update(best.replicas)
        if best.whole:
            whole.add(best.gang.name)

    chosen = _prune(room, chosen)
    evictions = _as_evictions(chosen)
    plan = plan_gang(room.snapshot, request)
    assert isinstance(plan, PlacementPlan), "capacity count and plan_gang disagree"
    return PreemptionPlan(evictions, plan)


def _candidate_moves(eligible: list[RunningGang], evicted: dict[str, set[int]], whole: set[str]) -> list[_Move]:
    moves = []
    for gang in eligible:
        if gang.name in whole:
            continue
        remaining = tuple(r for r in range(len(gang.replicas)) if r not in evicted[gang.name])
        if gang.min_replicas is not None and len(remaining) > gang.min_replicas:
            moves.append(_Move(gang, (remaining[-1],), False))  # shrink by the highest replica
        moves.append(_Move(gang, remaining, True))
    return moves


def _prune(room: _Room, chosen: list[_Move]) -> list[_Move]:
    """Give back evictions the request does not need: most valuable victims first."""
    kept = list(chosen)
    for move in sorted(chosen, key=lambda m: (-m.gang.priority, -m.gpus)):
        if not move.whole and _has_lower_shrink(move, kept):
            continue  # replicas are given back from the top down; keep the set a suffix
        room.take(move.allocation())
        if room.groups() >= room.request.groups:
            kept.remove(move)
        else:
            room.release(move.allocation())
    return kept


def _has_lower_shrink(move: _Move, kept: list[_Move]) -> bool:
    return any(
        m is not move and m.gang.name == move.gang.name and not m.whole and m.replicas[0] < move.replicas[0]
        for m in kept
    )


def _as_evictions(chosen: list[_Move]) -> tuple[Eviction, ...]:
    by_gang: dict[str, list[_Move]] = defaultdict(list)
    for move in chosen:
        by_gang[move.gang.name].append(move)
    evictions = []
    for name, moves in by_gang.items():
        gang = moves[0].gang
        replicas = tuple(sorted({r for m in moves for r in m.replicas}))
        is_whole = any(m.whole for m in moves) or len(replicas) == len(gang.replicas)
        if is_whole:
            replicas = tuple(range(len(gang.replicas)))
        gpus = sum(g for r in replicas for _, g in gang.replicas[r])
        evictions.append(Eviction(name, replicas, is_whole, gpus))
    return tuple(sorted(evictions, key=lambda e: e.gang))


class _Room:
    """Room for the request's groups in a scratch snapshot, with cheap what-if gains."""

    def __init__(self, snapshot: ClusterSnapshot, request: GangRequest):
        self.snapshot = snapshot
        self.request = request
        self.matching = {name for name, sn in snapshot.supernodes.items() if sn.accelerator == request.accelerator}

    def _slots(self, supernode: str) -> int:
        return self.snapshot.pod_slots(supernode, self.request.gpus_per_pod, self.request.recovery)

    def groups(self) -> int:
        per_group = self.request.pods_per_group
        return sum(self._slots(s) // per_group for s in self.matching)

    def gain(self, allocation: list[tuple[str, int]]) -> float:
        gpp, per_group = self.request.gpus_per_pod, self.request.pods_per_group
        extra: dict[str, int] = defaultdict(int)
        for name, gpus in allocation:
            node = self.snapshot.nodes.get(name)
            if node is None or node.supernode not in self.matching or not node.usable:
                continue
            if node.spare and not self.request.recovery:
                continue
            free_after = min(node.free + gpus, node.gpus)
            extra[node.supernode] += free_after // gpp - node.free // gpp
        total = 0.0
        for supernode, added in extra.items():
            before = self._slots(supernode)
            total += _potential(before + added, per_group) - _potential(before, per_group)
        return total

    def release(self, allocation: list[tuple[str, int]]) -> None:
        for name, gpus in allocation:
            self.snapshot.release(name, gpus)

    def take(self, allocation: list[tuple[str, int]]) -> None:
        for name, gpus in allocation:
            node = self.snapshot.nodes.get(name)
            if node is not None:
                self.snapshot.update_node(name, allocated=node.allocated + gpus)


def _potential(slots: int, per_group: int) -> float:
    return slots // per_group + _PARTIAL_CREDIT * (slots % per_group) / per_group
