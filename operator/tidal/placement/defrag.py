"""Defragmentation: the fewest checkpoint-first moves that let a fragmentation-blocked gang fit.

A pending gang is *blocked by fragmentation* when its accelerator has at least as many free GPUs
as it needs, yet no placement exists (no supernode, or not enough of them, has a group's worth
free) and an empty cluster would hold it (the miss is not permanent).

A *move* is a checkpoint-first eviction of a running gang (whole, or, for an elastic gang, its top
DP replicas, never below minDP) that is then placed again elsewhere. The rule for who may move:

- only *preemptible* gangs (the same opt-in that lets preemption suspend or shrink them);
- only gangs of priority <= the request's. Equal priority is allowed, unlike preemption, because a
  moved gang is not suspended for good: the planner only moves work that it has verified can be
  re-placed on what is left after the request is placed (each moved gang, or its given-back
  replicas, through `plan_gang`, one after the other, on the snapshot with the request booked).
  A set of moves whose work would not all fit again is never proposed: a move is not a loss.
  Each gang is re-placed on the nodes *its* pods may use (`MovableGang.tainted`/`untainted`),
  not the request's: a request may go on tainted nodes it tolerates that the gang does not.
- the GPUs moved stay within `budget_gpus` (None: no limit).

Objective, lexicographic: fewest moves (gangs touched), then fewest GPUs moved.

Search. Supernodes are ranked by how little must move to free one more group's worth there (fewest
gangs, then fewest GPUs, counted in pod slots on their nodes); the gangs on the best few are the
candidates; when those give no plan, every movable gang if the options are few, else the next
windows of as many supernodes down the ranking (`FALLBACK_WINDOWS`). When the options are few (<=
`EXACT_MAX_OPTIONS` options), every set of 1, 2, ... moves is enumerated in (moves, GPUs) order,
counted in pod slots (cheap), and the first set that passes the full check (request placed, every
moved gang re-placed) is the answer: within the candidates it is exact. Above that, or when the
enumeration would exceed `EXACT_MAX_SETS`, a greedy adds the cheapest supernode's clearing moves
until the request fits (going up to twice the cap on moves), then prunes every move it can do
without (most GPUs first); a plan still above the cap is none.

Options per gang: suspend it whole, or (elastic), for each supernode it holds, the smallest
top-replica shrink that clears it off that supernode and the smallest that gives the request one
more group there as the supernode is now (3 replicas of 4 GPUs on one rack with 4 GPUs free
beside them, an 8-GPU group: giving back one replica does). A shrink between those two is not an
option, though with other moves on the same supernode it could be what a group needs: each such
level would be one more option per elastic gang, and the exact search's reach is counted in
options.

The planner never changes the caller's snapshot: it books and releases on it while checking and
restores every node's allocation exactly before it returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from tidal.placement.gang import plan_gang
from tidal.placement.leftover import stranded_gpus
from tidal.placement.preemption import Eviction, RunningGang
from tidal.placement.types import GangRequest, PlacementPlan, Unplaceable
from tidal.topology.snapshot import ClusterSnapshot, OverbookedError

EXACT_MAX_OPTIONS = 24
"""Exact enumeration when the candidate supernodes' gangs offer at most this many options."""
EXACT_MAX_SETS = 20_000
"""Sets of moves the exact enumeration may count (per size) before it hands over to the greedy."""
MAX_MOVES = 8
"""No plan moves more gangs than this, or twice the groups missing if more (each is a checkpoint and a restart)."""
EXTRA_SUPERNODES = 3
"""Candidate supernodes beyond the number of groups missing."""
PARTIAL_SHRINKS = True
"""Elastic gangs may also give back the fewest top replicas that give the request a group on a
supernode without clearing them off it (`bench.defrag_shrinks` turns this off to measure it)."""
FALLBACK_WINDOWS = 8
"""When the closest candidates give no plan: windows of as many supernodes down the ranking tried,
the first included (so a blocked gang's failed search costs at most this many)."""


@dataclass(frozen=True)
class MovableGang:
    """A running gang and how to place it again: its whole shape as a request (name = gang name).

    Given-back replicas of an elastic gang are re-placed as `groups // len(gang.replicas)` groups
    per replica."""

    gang: RunningGang
    request: GangRequest
    tainted: frozenset[str] = frozenset()
    """Nodes open to the request that this gang's pods may not use (taints only the request
    tolerates): its re-placement is verified without them."""
    untainted: frozenset[str] = frozenset()
    """Tainted nodes, closed to the request, that this gang's pods tolerate: its re-placement may use them."""

    @property
    def groups_per_replica(self) -> int:
        return max(self.request.groups // max(len(self.gang.replicas), 1), 1)


@dataclass(frozen=True)
class Move:
    eviction: Eviction
    replacement: PlacementPlan
    """Where the moved work fits again once the request is placed (verified, not reserved)."""


@dataclass(frozen=True)
class DefragPlan:
    moves: tuple[Move, ...]
    placement: PlacementPlan
    """The request's placement once the moves are done."""

    @property
    def moved_gpus(self) -> int:
        return sum(m.eviction.gpus for m in self.moves)


@dataclass(frozen=True)
class _Option:
    gang: int
    level: int
    """Replicas given back from the top; len(replicas) = the whole gang."""
    released: tuple[tuple[str, int], ...]
    gpus: int


def is_fragmentation_blocked(snapshot: ClusterSnapshot, request: GangRequest) -> Unplaceable | None:
    """The Unplaceable if the request fails only because free GPUs are scattered, else None."""
    miss = plan_gang(snapshot, request)
    if isinstance(miss, PlacementPlan) or miss.permanent:
        return None
    return miss if free_gpus(snapshot, request.accelerator) >= request.total_gpus else None


def free_gpus(snapshot: ClusterSnapshot, accelerator: str) -> int:
    return sum(snapshot.largest_free_slice(s) for s in snapshot.supernodes_with_free(accelerator, 1))


def movable(running: Iterable[MovableGang], request: GangRequest) -> list[MovableGang]:
    """Who may move for `request`: preemptible, priority <= the request's, placed, not itself."""
    return [
        m
        for m in running
        if m.gang.preemptible
        and m.gang.priority <= request.priority
        and m.gang.replicas
        and m.gang.name != request.name
    ]


def move_cap(request: GangRequest, groups_fitting_now: int) -> int:
    """The most moves a plan for `request` may make (`MAX_MOVES`, or twice the groups missing if more)."""
    return max(MAX_MOVES, 2 * (request.groups - groups_fitting_now))


def plan_defrag(
    snapshot: ClusterSnapshot, request: GangRequest, running: Sequence[MovableGang], budget_gpus: int | None
) -> DefragPlan | None:
    """The fewest (then smallest) verified moves that let `request` fit, or None."""
    miss = is_fragmentation_blocked(snapshot, request)
    if miss is None:
        return None
    gangs = movable(running, request)
    if not gangs:
        return None
    return _Planner(snapshot, request, gangs, budget_gpus, miss.groups_fitting_now).solve()


@contextmanager
def _taints_for(snap: ClusterSnapshot, m: MovableGang) -> Iterator[None]:
    """The snapshot's taint flags as `m`'s pods see them, for the block (allocations kept)."""
    flips = [(n, True) for n in m.tainted if n in snap.nodes and not snap.nodes[n].tainted]
    flips += [(n, False) for n in m.untainted if n in snap.nodes and snap.nodes[n].tainted]
    for name, value in flips:
        snap.update_node(name, tainted=value)
    try:
        yield
    finally:
        for name, value in flips:
            snap.update_node(name, tainted=not value)


class _Planner:
    def __init__(
        self,
        snapshot: ClusterSnapshot,
        request: GangRequest,
        gangs: list[MovableGang],
        budget: int | None,
        fitting_now: int,
    ):
        self.snap = snapshot
        self.request = request
        self.gangs = gangs
        self.budget = budget
        self.fitting_now = fitting_now
        gpp, ppg = request.gpus_per_pod, request.pods_per_group
        self.gpp, self.ppg = gpp, ppg
        self.sn_of = {}
        for name, sn in snapshot.supernodes.items():
            if sn.accelerator == request.accelerator and snapshot.domain_gpus(name) >= request.group_gpus:
                for node in sn.nodes:
                    self.sn_of[node] = name
        self.options = self._options()
        self.on_sn: dict[str, list[tuple[int, _Option]]] = {}
        """Supernode -> (GPUs released there, option) for every option releasing some there."""
        for o in self.options:
            here: dict[str, int] = {}
            for node, g in o.released:
                sn = self.sn_of.get(node)
                if sn is not None:
                    here[sn] = here.get(sn, 0) + g
            for sn, g in here.items():
                self.on_sn.setdefault(sn, []).append((g, o))
        self.max_moves = move_cap(request, fitting_now)

    # -- options ----------------------------------------------------------------------------
    def _release(self, m: MovableGang, level: int) -> tuple[tuple[str, int], ...]:
        per: dict[str, int] = {}
        for replica in m.gang.replicas[len(m.gang.replicas) - level :]:
            for node, gpus in replica:
                per[node] = per.get(node, 0) + gpus
        return tuple(sorted(per.items()))

    def _options(self) -> list[_Option]:
        out = []
        for i, m in enumerate(self.gangs):
            n = len(m.gang.replicas)
            totals: dict[str, int] = {}  # supernode -> GPUs the gang holds there
            for node, g in self._release(m, n):
                sn = self.sn_of.get(node)
                if sn is not None:
                    totals[sn] = totals.get(sn, 0) + g
            if not totals:
                continue  # holds nothing a group of the request could use
            levels = {n}
            if m.gang.min_replicas is not None:
                levels |= self._shrink_levels(m, totals)
            for level in sorted(levels):
                released = self._release(m, level)
                gpus = sum(g for _, g in released)
                if self.budget is None or gpus <= self.budget:
                    out.append(_Option(i, level, released, gpus))
        return out

    def _shrink_levels(self, m: MovableGang, totals: dict[str, int]) -> set[int]:
        """Per supernode the gang holds: the fewest top replicas (never below minDP) that give the
        request one more group there, and the fewest that clear the gang off it. One walk down
        from the top replica (a gang of 1,024 replicas must not cost a walk per level)."""
        n, levels = len(m.gang.replicas), set()
        base = {sn: self._groups_with(sn, {}) for sn in totals}
        released: dict[str, dict[str, int]] = {}  # supernode -> node -> GPUs given back so far
        gained, cleared = set(), set()
        for level in range(1, max(n - (m.gang.min_replicas or 0), 0) + 1):
            touched = set()
            for node, g in m.gang.replicas[n - level]:
                sn = self.sn_of.get(node)
                if sn is not None:
                    here = released.setdefault(sn, {})
                    here[node] = here.get(node, 0) + g
                    touched.add(sn)
            for sn in touched - cleared:
                if PARTIAL_SHRINKS and sn not in gained and self._groups_with(sn, released[sn]) > base[sn]:
                    levels.add(level)  # the fewest replicas that give the request a group here
                    gained.add(sn)
                if sum(released[sn].values()) == totals[sn]:
                    levels.add(level)  # the fewest that clear the gang off this supernode
                    cleared.add(sn)
            if len(cleared) == len(totals):
                break
        return levels

    # -- counting (cheap) -------------------------------------------------------------------
    def _slots(self, node: str, extra: int) -> int:
        state = self.snap.nodes[node]
        if not state.usable or (state.spare and not self.request.recovery):
            return 0
        free = max(state.gpus - max(state.allocated - extra, 0), 0)
        return free // self.gpp

    def groups_with(self, options: Iterable[_Option]) -> int:
        """Groups of the request the cluster holds with these options' GPUs released."""
        extra: dict[str, int] = {}
        for o in options:
            for node, g in o.released:
                if node in self.sn_of:
                    extra[node] = extra.get(node, 0) + g
        by_sn: dict[str, int] = {}
        for node, g in extra.items():
            sn = self.sn_of[node]
            by_sn[sn] = by_sn.get(sn, 0) + self._slots(node, g) - self._slots(node, 0)
        gained = 0
        for sn, more in by_sn.items():
            base = self.snap.pod_slots(sn, self.gpp, self.request.recovery)
            gained += (base + more) // self.ppg - base // self.ppg
        return self.fitting_now + gained

    # -- full check ---------------------------------------------------------------------------
    def verify(self, options: Sequence[_Option]) -> DefragPlan | None:
        """Release the options, place the request, then re-place every moved gang; restore after."""
        snap = self.snap
        saved: dict[str, int] = {}

        def set_alloc(node: str, value: int) -> None:
            saved.setdefault(node, snap.nodes[node].allocated)
            snap.update_node(node, allocated=value)

        def book(plan: PlacementPlan) -> None:
            for node, g in plan.gpus_by_node().items():
                if snap.nodes[node].free < g:
                    raise OverbookedError(node)
                set_alloc(node, snap.nodes[node].allocated + g)

        try:
            for o in options:
                for node, g in o.released:
                    if node in snap.nodes:
                        set_alloc(node, max(snap.nodes[node].allocated - g, 0))
            placement = plan_gang(snap, self.request)
            if not isinstance(placement, PlacementPlan):
                return None
            book(placement)
            moves = []
            for o in sorted(options, key=lambda o: (-o.gpus, self.gangs[o.gang].gang.name)):
                with _taints_for(snap, self.gangs[o.gang]):
                    again = plan_gang(snap, self._replacement(o))
                    if not isinstance(again, PlacementPlan):
                        return None
                    book(again)  # while its own nodes are open: a tainted node offers nothing
                moves.append(Move(self._eviction(o), again))
            moves.sort(key=lambda mv: mv.eviction.gang)
            return DefragPlan(tuple(moves), placement)
        except OverbookedError:
            return None
        finally:
            for node, value in saved.items():
                snap.update_node(node, allocated=value)

    def _replacement(self, o: _Option) -> GangRequest:
        m = self.gangs[o.gang]
        n = len(m.gang.replicas)
        if o.level >= n:
            return replace(m.request, recovery=False, prefer_supernodes=())
        per = m.groups_per_replica
        first = (n - o.level) * per
        ids = tuple(range(first, n * per))
        return replace(m.request, groups=len(ids), group_ids=ids, recovery=False, prefer_supernodes=())

    def _eviction(self, o: _Option) -> Eviction:
        m = self.gangs[o.gang]
        n = len(m.gang.replicas)
        return Eviction(m.gang.name, tuple(range(n - o.level, n)), o.level >= n, o.gpus)

    # -- search -------------------------------------------------------------------------------
    def solve(self) -> DefragPlan | None:
        width = self.request.groups - self.fitting_now + EXTRA_SUPERNODES
        ranked = [sn for _, sn, _ in self._ranked_supernodes(set())]
        plan = self._solve_among(self._options_on(ranked[:width]))
        if plan is not None:
            return plan
        # The closest supernodes' gangs could not do it (say, none of them fits anywhere else): a
        # plan may still clear a supernode further down the ranking. Every option at once when
        # that is small enough to search exactly; else the next windows of the ranking one by one
        # (a greedy over all of them would rank the same supernodes first and fail the same way).
        if len(self.options) <= EXACT_MAX_OPTIONS:
            return self._solve_among(self.options)
        for start in range(width, min(len(ranked), width * FALLBACK_WINDOWS), width):
            plan = self._solve_among(self._options_on(ranked[start : start + width]))
            if plan is not None:
                return plan
        return None

    def _options_on(self, supernodes: list[str]) -> list[_Option]:
        gangs = {o.gang for sn in supernodes for _, o in self.on_sn[sn]}
        return [o for o in self.options if o.gang in gangs]

    def _solve_among(self, options: list[_Option]) -> DefragPlan | None:
        if not options:
            return None
        if len(options) <= EXACT_MAX_OPTIONS:
            found = self._exact(options)
            if found is not False:
                return found
        return self._greedy(options)

    def _clearing(self, sn: str, taken: set[int], allowed: set[int] | None = None) -> list[_Option] | None:
        """Fewest options (largest release on `sn` first) that give `sn` one more group, from gangs
        not in `taken` (and in `allowed`, if given)."""
        base = self.snap.pod_slots(sn, self.gpp, self.request.recovery) // self.ppg
        on_sn = sorted(
            (
                (-here, o.gpus, o.gang, o.level, o)
                for here, o in self.on_sn.get(sn, [])
                if o.gang not in taken and (allowed is None or o.gang in allowed)
            ),
            key=lambda t: t[:4],
        )
        chosen: list[_Option] = []
        gangs: set[int] = set()
        for *_, o in on_sn:
            if o.gang in gangs:
                continue
            chosen.append(o)
            gangs.add(o.gang)
            if self._sn_groups(sn, chosen) > base:
                return chosen
        return None

    def _sn_groups(self, sn: str, options: Iterable[_Option]) -> int:
        extra: dict[str, int] = {}
        for o in options:
            for node, g in o.released:
                if self.sn_of.get(node) == sn:
                    extra[node] = extra.get(node, 0) + g
        return self._groups_with(sn, extra)

    def _groups_with(self, sn: str, extra: dict[str, int]) -> int:
        """Groups of the request supernode `sn` holds with `extra` GPUs (node -> GPUs, its nodes only) freed."""
        base = self.snap.pod_slots(sn, self.gpp, self.request.recovery)
        more = sum(self._slots(node, g) - self._slots(node, 0) for node, g in extra.items())
        return (base + more) // self.ppg

    def _ranked_supernodes(
        self, taken: set[int], allowed: set[int] | None = None
    ) -> list[tuple[tuple[int, int], str, list[_Option]]]:
        ranked = []
        for sn in sorted(self.on_sn):
            clearing = self._clearing(sn, taken, allowed)
            if clearing is not None:
                ranked.append(((len(clearing), sum(o.gpus for o in clearing)), sn, clearing))
        ranked.sort(key=lambda t: (t[0], t[1]))
        return ranked

    def _exact(self, options: list[_Option]) -> DefragPlan | bool | None:
        """The first verified set in (moves, GPUs) order; False when the enumeration is too large."""
        by_gang: dict[int, list[_Option]] = {}
        for o in options:
            by_gang.setdefault(o.gang, []).append(o)
        gangs = sorted(by_gang)
        if self.groups_with(max(by_gang[g], key=lambda o: o.level) for g in gangs) < self.request.groups:
            return None  # not even moving every candidate would make room
        for k in range(1, min(len(gangs), self.max_moves) + 1):
            sets = []
            for combo in itertools.combinations(gangs, k):
                for choice in itertools.product(*(by_gang[g] for g in combo)):
                    gpus = sum(o.gpus for o in choice)
                    if self.budget is not None and gpus > self.budget:
                        continue
                    sets.append((gpus, choice))
                    if len(sets) > EXACT_MAX_SETS:
                        return False
            sets.sort(key=lambda t: (t[0], [(o.gang, o.level) for o in t[1]]))
            for _, choice in sets:
                if self.groups_with(choice) >= self.request.groups:
                    plan = self.verify(choice)
                    if plan is not None:
                        return plan
        return None

    def _greedy(self, options: list[_Option]) -> DefragPlan | None:
        """Clear the cheapest supernodes (ranked once; a pick whose gangs were taken meanwhile is
        re-costed against what is left) until the request fits."""
        allowed = {o.gang for o in options}
        chosen: list[_Option] = []
        taken: set[int] = set()
        ranked = self._ranked_supernodes(taken, allowed)
        for _, sn, clearing in ranked:
            # Past the cap is allowed, up to twice it: giving moves back below may bring the plan within it.
            if self.groups_with(chosen) >= self.request.groups or len(chosen) >= 2 * self.max_moves:
                break
            if any(o.gang in taken for o in clearing):
                clearing = self._clearing(sn, taken, allowed)
                if clearing is None:
                    continue
            chosen += clearing
            taken |= {o.gang for o in clearing}
        if self.groups_with(chosen) < self.request.groups:
            return None
        plan = self.verify(chosen)
        if plan is None:
            return None
        for o in sorted(chosen, key=lambda o: -o.gpus):  # give back every move it can do without
            rest = [c for c in chosen if c is not o]
            if rest and self.groups_with(rest) >= self.request.groups:
                smaller = self.verify(rest)
                if smaller is not None:
                    chosen, plan = rest, smaller
        # Cap and budget after giving back, which may bring the plan within them (one pass: a miss
        # here leaves the gang pending, never unsafe).
        if len(chosen) > self.max_moves or (self.budget is not None and plan.moved_gpus > self.budget):
            return None
        return plan


def stranded_free_gpus(snapshot: ClusterSnapshot, pending_sizes: dict[str, set[int]]) -> int:
    """Free GPUs that no pending group size can use, summed over supernodes (per accelerator).

    `pending_sizes`: accelerator -> HBD-group sizes (GPUs) of the pending queue. A supernode's free
    GPUs count as stranded when no mix of those sizes fills them (`leftover.stranded_gpus`); an
    accelerator with nothing pending strands nothing (there is nobody to be useless to)."""
    total = 0
    for name, sn in snapshot.supernodes.items():
        sizes = pending_sizes.get(sn.accelerator)
        if not sizes:
            continue
        free = snapshot.largest_free_slice(name)
        if free:
            total += stranded_gpus(free, sizes)
    return total
