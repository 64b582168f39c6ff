"""Which whole gangs (or whole elastic DP replicas) to evict so a higher-priority gang fits.

Objective, lexicographic: fewest GPUs evicted, then fewest victims (evictions), then lowest
priority (priority weighted by the GPUs taken); among equals, the first found in the order the
running gangs are given (deterministic for the same input).

Model. Room is a count: a supernode with the request's accelerator holds
floor(slots / pods_per_group) groups, where slots sums floor(free / gpus_per_pod) over its usable
nodes (hot spares only on recovery), and the request fits exactly when the counts add up to
`groups` (plan_gang's own test). Each candidate gang is a ladder of nested options: give back its
top 1..K DP replicas (elastic gangs, never below min_replicas), or suspend it whole. A victim's
allocations are summed per node first (two 4-GPU pods of one victim on an 8-GPU node free one
8-GPU slot). Only the nodes and supernodes the candidates touch are tracked, as an overlay of
released GPUs on the snapshot: no copy and no scan of the cluster per step.

Search.
1. Greedy on room gained per GPU evicted. Room is a potential: whole groups, plus convex partial
   credit for a supernode brought closer to its next group (so evictions that finish a domain
   beat evictions scattered over many), all capped at what is still missing: a move is worth
   only the room the request still lacks. Ties go to moves that finish more groups, then to
   bigger moves (fewer victims), then to lower priority. A lazy heap keeps it fast; after a pick
   only the moves on the supernodes (and shared nodes) it touched are re-scored. When a group is
   one pod, where a slot is does not matter and all supernodes count as one.
2. Prune: give back, most GPUs first, every option (or top part of a shrink) the plan can do without.
3. Improve: for each victim, most GPUs first, lower it (to nothing or a smaller shrink) and
   re-cover the gap greedily with at most its GPUs, from every candidate on small instances and
   from its neighbours (gangs on the same supernodes) on large ones; when the greedy stalls on
   releases that only free a slot together, take all those candidates and let pruning decide.
   Keep the result if the objective improved.
4. Exact: when at most 40 gangs can matter, a depth-first branch and bound over every gang's
   ladder, seeded with the heuristic's plan, pruned on cost and on "not even everything left
   would make room", capped in nodes and node updates (the best plan so far is kept at the cap).

Safety: never touches a non-preemptible gang or one of equal or higher priority; evicts nothing
when even evicting every candidate would not make room; the placement returned is plan_gang's
on the snapshot with the victims' GPUs released, computed on a read-only ReleasedView (falling
back to releasing on the snapshot and restoring it exactly). The caller's snapshot is not changed.
"""

from __future__ import annotations

import heapq
from collections import ChainMap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import count
from typing import TypeVar

from tidal.placement.gang import plan_gang
from tidal.placement.preemption_dp import DP_MAX_STEPS, dp_steps, minimum_levels, single_node
from tidal.placement.types import GangRequest, PlacementPlan, Unplaceable
from tidal.topology.snapshot import ClusterSnapshot, NodeState

Allocation = tuple[tuple[str, int], ...]
"""(node, GPUs) pairs."""

T = TypeVar("T")

_PARTIAL_CREDIT = 0.5
"""What a supernode one slot short of its next group is worth at most, in groups (< 1: finished groups win)."""
_EXACT_MAX_GANGS = 40
"""Branch and bound when at most this many gangs can matter; above, the heuristic alone."""
_EXACT_MAX_NODES = 20_000
"""Search nodes the branch and bound may explore before it settles for the best plan found."""
_EXACT_MAX_WORK = 200_000
"""Node updates (released GPUs applied or taken back) the branch and bound may spend likewise."""
_IMPROVE_ATTEMPTS = 24
"""Victims the improvement pass tries to replace (the most expensive first), when every candidate may replace them."""
_IMPROVE_ATTEMPTS_NEIGHBOURS = 8
"""Likewise on large instances, where only neighbours may (the greedy's picks there rarely have a cheaper swap)."""
_IMPROVE_EVERYONE_GANGS = 100
"""Up to this many candidates, a victim's replacement may come from any of them; above, from its neighbours."""


@dataclass(frozen=True)
class RunningGang:
    name: str
    priority: int
    preemptible: bool
    replicas: tuple[Allocation, ...]
    """Allocations per DP replica (a non-elastic gang may use a single entry)."""
    min_replicas: int | None = None
    """Elastic gangs may shrink to this many replicas by giving back their highest replicas."""
    resize: str = "Restart"
    """How it resizes (Restart or Live; the operator passes spec.elastic.resize): what
    a shrink costs it (tidal.rebalance.resize_cost)."""

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


def plan_preemption(
    snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang]
) -> PreemptionPlan | Unplaceable:
    direct = plan_gang(snapshot, request)
    if not isinstance(direct, Unplaceable):
        return PreemptionPlan((), direct)
    if direct.permanent:
        return direct
    eligible = eligible_gangs(running, request.priority)
    if not eligible:
        return direct
    if (
        not request.recovery
        and snapshot.free_gpus_of(request.accelerator) + sum(g.gpus for g in eligible) < request.total_gpus
    ):
        # Fewer GPUs than asked even with every candidate gone (free_gpus_of counts usable, non-spare
        # ones; a recovery may also use spares): no search can find room. Most refusals of a busy
        # cluster end here (at 24,048 GPUs in the simulator, 86% of them).
        return direct
    search = EvictionSearch(snapshot, request, eligible, base_groups=direct.groups_fitting_now)
    choice = search.solve(request.groups, search.full_limits())
    if choice is None:
        return direct  # evicting every candidate would still not make room: evict nobody
    placement = search.place(choice.levels, request)
    if placement is None:
        return direct  # the count and plan_gang disagree: evicting on a guess would be worse
    return PreemptionPlan(search.evictions(choice.levels), placement)


def eligible_gangs(running: Iterable[RunningGang], priority: int) -> list[RunningGang]:
    """The gangs a request of `priority` may evict: preemptible, strictly lower priority, placed."""
    return [g for g in running if g.preemptible and g.priority < priority and g.replicas]


@dataclass(frozen=True)
class Choice:
    """One option per candidate gang (0: untouched), and what it costs."""

    levels: tuple[int, ...]
    gpus: int
    victims: int
    priority_gpus: int
    groups: int
    """Groups of the request the cluster holds with these evictions."""

    @property
    def objective(self) -> tuple[int, int, int]:
        return (self.gpus, self.victims, self.priority_gpus)


class _Victim:
    """A candidate gang as a ladder of options: level l <= shrinkable gives back its top l replicas,
    level `top` suspends it whole. Releases are kept per replica, summed per tracked node."""

    __slots__ = (
        "cost",
        "disjoint",
        "gang",
        "index",
        "n",
        "replica_gain",
        "replica_rel",
        "shrinkable",
        "sns",
        "stacked",
        "top",
    )

    def __init__(
        self,
        index: int,
        gang: RunningGang,
        replica_rel: list[dict[str, int]],
        replica_gpus: list[int],
        replica_gain: list[dict[int, int]],
        disjoint: bool,
        sns: set[int],
        stacked: bool,
    ):
        self.n = n = len(gang.replicas)
        self.index = index
        self.gang = gang
        self.replica_rel = replica_rel
        self.replica_gain = replica_gain
        """Slots per supernode each replica alone frees on the untouched snapshot."""
        self.disjoint = disjoint
        """No two replicas share a node: then gains of several replicas add up."""
        self.sns = sns
        """Supernodes it holds tracked nodes in."""
        self.stacked = stacked
        """Two of its replicas share a node only it holds (unlike `disjoint`, whatever their sizes)."""
        self.shrinkable = shrinkable = min(max(n - gang.min_replicas, 0), n) if gang.min_replicas is not None else 0
        self.top = top = shrinkable if shrinkable == n else shrinkable + 1
        if not shrinkable:  # not elastic: nothing, or all of it
            self.cost = [0, sum(replica_gpus)] if top else [0]
            return
        # Suffix sums: a ladder of a hundred replicas would otherwise be summed a hundred times.
        suffix = [0] * (n + 1)
        for k in range(n - 1, -1, -1):
            suffix[k] = suffix[k + 1] + replica_gpus[k]
        self.cost = [suffix[n - level] if level <= shrinkable else suffix[0] for level in range(top + 1)]

    def first(self, level: int) -> int:
        """Index of the lowest replica the option releases (replicas first..n-1 go)."""
        return self.n - level if level <= self.shrinkable else 0


class _Move:
    """Raise one victim from level `lo` to `hi`; `gain` is slots gained per supernode in the current state."""

    # A slotted class, not a dataclass: the greedy makes one or two per candidate (thousands) per call.
    __slots__ = ("alive", "cost", "delta", "gain", "hi", "lo", "value", "version", "victim", "whole_groups")

    def __init__(self, victim: int, lo: int, hi: int, cost: int, gain: dict[int, int]):
        self.victim = victim
        self.lo = lo
        self.hi = hi
        self.cost = cost
        self.delta: dict[str, int] | None = None
        """EvictionSearch._delta, fetched when first needed: most moves are only ever scored."""
        self.gain = gain
        self.alive = True
        self.version = 0
        self.value = 0.0
        self.whole_groups = 0


Released = tuple[tuple[int, int, int, int, int], ...]
"""A release compiled for _State, in the order of the name-keyed delta (float partial credit is
summed in that order). A node other candidates also hold: (tracked node index, GPUs, node GPUs,
allocated, supernode index). A node only this candidate holds: (-1, slots it frees, 0, 0,
supernode index), left out where it frees none, and when groups are slots all such nodes are one
entry (their sum), as they are one per supernode when partial credit sums are exact (exact_partial).
What such a node frees depends only on the candidate's own level, and a release from lo to hi is only
ever applied with the candidate at lo (or taken back with it at hi)."""


class _State:
    """Released GPUs per tracked node, and the slot and group counts they give.

    Nodes are list indices (EvictionSearch.node_of), not names: apply runs millions of times
    in the exact search, where a name's dict lookups were most of the cost. Only nodes several
    candidates hold keep their released GPUs here (see Released); rel and nslots of the others
    stay as they started."""

    __slots__ = ("groups", "nslots", "partial", "rel", "search", "sslots")

    def __init__(self, search: EvictionSearch):
        self.search = search
        self.rel = [0] * len(search.node_slots0)
        self.nslots = list(search.node_slots0)
        self.sslots = list(search.sn_slots0)
        self.groups = search.base_groups
        self.partial = search.partial0

    def apply(self, delta: Released, sign: int) -> None:
        s = self.search
        gpp, per_group, phi = s.gpp, s.per_group, s.phi
        rel, nslots, sslots = self.rel, self.nslots, self.sslots
        groups, partial = self.groups, self.partial
        for i, d, gpus, alloc, j in delta:
            if i < 0:  # a node of this candidate alone: d slots
                before = sslots[j]
                after = before + sign * d
                sslots[j] = after
                groups += after // per_group - before // per_group
                partial += phi[after % per_group] - phi[before % per_group]
                continue
            r = rel[i] + sign * d
            rel[i] = r
            held = alloc - r
            free = gpus - (held if held > 0 else 0)
            slots = free // gpp if free > 0 else 0
            old = nslots[i]
            if slots != old:
                nslots[i] = slots
                before = sslots[j]
                after = before + slots - old
                sslots[j] = after
                groups += after // per_group - before // per_group
                partial += phi[after % per_group] - phi[before % per_group]
        self.groups, self.partial = groups, partial

    def apply_groups(self, delta: Released, sign: int) -> None:
        """apply without the partial credit (which only the greedy's scores read): the exact search's."""
        s = self.search
        gpp, per_group = s.gpp, s.per_group
        rel, nslots, sslots = self.rel, self.nslots, self.sslots
        groups = self.groups
        for i, d, gpus, alloc, j in delta:
            if i < 0:
                before = sslots[j]
                after = before + sign * d
                sslots[j] = after
                groups += after // per_group - before // per_group
                continue
            r = rel[i] + sign * d
            rel[i] = r
            held = alloc - r
            free = gpus - (held if held > 0 else 0)
            slots = free // gpp if free > 0 else 0
            old = nslots[i]
            if slots != old:
                nslots[i] = slots
                before = sslots[j]
                after = before + slots - old
                sslots[j] = after
                groups += after // per_group - before // per_group
        self.groups = groups

    def gain(self, delta: Released) -> dict[int, int]:
        """Slots each supernode would gain if `delta` were released on top of this state."""
        gpp = self.search.gpp
        rel, nslots = self.rel, self.nslots
        out: dict[int, int] = {}
        for i, d, gpus, alloc, j in delta:
            if i < 0:
                out[j] = out.get(j, 0) + d
                continue
            held = alloc - rel[i] - d
            free = gpus - (held if held > 0 else 0)
            slots = free // gpp if free > 0 else 0
            old = nslots[i]
            if slots != old:
                out[j] = out.get(j, 0) + slots - old
        return out

    def node_gain(self, i: int, d: int, released: int) -> int:
        """Slots tracked node `i` gains from `d` more GPUs when `released` are already given back."""
        s = self.search
        gpus, alloc, gpp = s.node_gpus[i], s.node_alloc[i], s.gpp
        before = gpus - max(alloc - released, 0)
        after = gpus - max(alloc - released - d, 0)
        return max(after, 0) // gpp - max(before, 0) // gpp


class EvictionSearch:
    """The candidates of one request shape (accelerator, pod size, group size, recovery) on one snapshot.

    Built once; `solve` answers "fewest GPUs for `groups` groups" for any group count and any
    per-gang limit on the ladder (plan_capacity's stages), reusing the per-node aggregation.
    `base_groups` (the groups that fit now) may be passed in when the caller has it from plan_gang.
    """

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        request: GangRequest,
        gangs: list[RunningGang],
        base_groups: int | None = None,
    ):
        self.snapshot = snapshot
        self.request = request
        self.gpp = gpp = request.gpus_per_pod
        self.per_group = per_group = request.pods_per_group
        # Convex partial credit: the last slots before a group are worth more than the first ones.
        self.phi = [_PARTIAL_CREDIT * (r / per_group) ** 2 for r in range(per_group)]
        recovery = request.recovery
        accelerator = request.accelerator
        supernodes = snapshot.supernodes
        nodes = snapshot.nodes
        sn_index: dict[str, int] = {}
        # One group per pod slot: where a slot is does not matter, so every supernode counts as one.
        self.flat = flat = per_group == 1
        self.sn_names: list[str] = ["*"] if flat else []
        node_of: dict[str, int] = {}
        # Per tracked node, by index: lists, not a tuple per node (a call meets ~25,000 nodes), sized
        # for every node up front and cut to the tracked ones after (a store is cheaper than an append).
        most = len(nodes)
        node_gpus = [0] * most
        node_alloc = [0] * most
        node_sn = [0] * most
        slots_now = [0] * most
        owner = [-1] * most  # the first candidate seen with part of the node (-1: none yet)
        holder = [-1] * most  # the one candidate holding GPUs on the node, or -2 when several do
        shared: dict[str, list[int]] = {}
        sn_names = self.sn_names
        claim = node_of.setdefault
        k = 0  # tracked nodes so far: the index the next one gets
        self.victims: list[_Victim] = []
        for v, gang in enumerate(gangs):
            replica_rel: list[dict[str, int]] = []
            replica_gpus: list[int] = []
            replica_gain: list[dict[int, int]] = []
            disjoint = True
            stacked = False  # two of its replicas on a node no other candidate holds
            sns: set[int] = set()
            add_sn = sns.add
            for replica in gang.replicas:
                per_node = dict(replica)
                if len(per_node) != len(replica):  # several pods on a node: what counts is their sum
                    per_node = {}
                    for name, g in replica:
                        per_node[name] = per_node.get(name, 0) + g
                replica_gpus.append(sum(per_node.values()))
                gain: dict[int, int] = {}
                dropped = False
                last_sn = -1
                run = 0  # slots gained on last_sn's nodes so far: added to `gain` when the supernode changes
                for name, g in per_node.items():
                    # One lookup both finds a node and, on first sight, gives it the next index: nearly
                    # every node is met once, and at 25,000 nodes the dict lookups are the cost.
                    i = claim(name, k)
                    if i == k:
                        node = nodes.get(name)
                        j = -1
                        # node.usable, inlined: this loop visits every node the running gangs hold.
                        if (
                            node is not None
                            and node.ready
                            and not node.cordoned
                            and not node.tainted
                            and (recovery or not node.spare)
                        ):
                            sn_name = node.supernode
                            if flat:  # one index for all, so only the accelerator counts (HGX: a supernode per node)
                                sn = supernodes.get(sn_name)
                                j = 0 if sn is not None and sn.accelerator == accelerator else -1
                            elif (j := sn_index.get(sn_name)) is None:
                                j = -1
                                sn = supernodes.get(sn_name)
                                if sn is not None and sn.accelerator == accelerator:
                                    j = len(sn_names)
                                    sn_names.append(sn_name)
                                sn_index[sn_name] = j
                        if j < 0:
                            node_of[name] = -1  # the GPUs still count as evicted, but give the request nothing
                            dropped = True
                            continue
                        k += 1
                        node_gpus_i = node.gpus
                        allocated = node.allocated
                        free = node_gpus_i - allocated
                        slots0 = free // gpp if free > 0 else 0
                        node_gpus[i] = node_gpus_i
                        node_alloc[i] = allocated
                        node_sn[i] = j
                        slots_now[i] = slots0
                        holder[i] = v
                    elif i < 0:
                        dropped = True
                        continue
                    else:
                        if holder[i] != v:
                            holder[i] = -2
                        else:
                            stacked = True
                        node_gpus_i = node_gpus[i]
                        allocated = node_alloc[i]
                        j = node_sn[i]
                        slots0 = slots_now[i]
                    if j != last_sn:  # a replica's nodes come supernode by supernode
                        if run:
                            gain[last_sn] = gain.get(last_sn, 0) + run
                            run = 0
                        add_sn(j)
                        last_sn = j
                    held = allocated - g
                    free = node_gpus_i - (held if held > 0 else 0)
                    run += (free // gpp if free > 0 else 0) - slots0
                    if g < node_gpus_i:  # the node has room for other pods: note who else holds GPUs there
                        first = owner[i]
                        if first < 0:
                            owner[i] = v
                        elif first == v:
                            disjoint = False  # an earlier replica of this gang is on the node too
                        else:
                            users = shared.setdefault(name, [first])
                            if users[-1] != v:
                                users.append(v)
                if run:
                    gain[last_sn] = gain.get(last_sn, 0) + run
                if dropped:
                    per_node = {name: g for name, g in per_node.items() if node_of[name] >= 0}
                replica_rel.append(per_node)
                replica_gain.append(gain)
            self.victims.append(_Victim(v, gang, replica_rel, replica_gpus, replica_gain, disjoint, sns, stacked))
        for per_node_list in (node_gpus, node_alloc, node_sn, slots_now, holder):
            del per_node_list[k:]
        self.node_of = node_of
        """Node name -> its index in the per-node lists and _State's; -1 where a release gives the request
        nothing (not the request's accelerator, unusable, a spare off recovery)."""
        self.node_gpus = node_gpus
        self.node_alloc = node_alloc
        self.node_sn = node_sn
        """Supernode index of each tracked node."""
        self.node_slots0 = slots_now
        """Pod slots of each tracked node now."""
        self.node_holder = holder
        """Per tracked node, the one candidate holding GPUs on it, or -2 when several do (see Released)."""
        if flat:
            self.sn_slots0 = [0]  # only changes count: groups are slots
        else:
            self.sn_slots0 = [snapshot.pod_slots(name, gpp, include_spares=recovery) for name in self.sn_names]
        self.partial0 = sum(self.phi[x % per_group] for x in self.sn_slots0)
        # The partial credit is a float summed node by node, and the plan must not depend on the
        # order. When every phi is a multiple of one power of two 2^-m and no sum can outgrow 52
        # bits at that step (groups of 2, 4, 16 pods: phi = r^2 / 2 pg^2), every such sum is exact,
        # so a candidate's sole-held nodes may be compiled one entry per supernode (Released).
        step = max(Fraction(x).denominator for x in self.phi).bit_length() - 1
        self.exact_partial = flat or len(self.sn_slots0) * max(self.phi) * 2**step < 2**52
        if base_groups is None:
            base_groups = sum(
                snapshot.pod_slots(name, gpp, include_spares=recovery) // per_group
                for name, sn in supernodes.items()
                if sn.accelerator == accelerator
            )
        self.base_groups = base_groups
        self.node_victims = shared
        """Nodes several candidates hold GPUs on: a pick changes what the others' releases there are worth."""
        self.sn_victims: list[list[int]] = [[] for _ in self.sn_names]
        for victim in self.victims:
            for j in victim.sns:
                self.sn_victims[j].append(victim.index)
        self._deltas: dict[tuple[int, int, int], dict[str, int]] = {}
        self._released: dict[tuple[int, int, int], Released] = {}

    # -- limits: how far up its ladder each candidate may go --------------------------------
    def full_limits(self) -> list[int]:
        return [v.top for v in self.victims]

    def shrink_limits(self) -> list[int]:
        return [v.shrinkable for v in self.victims]

    # -- the API -----------------------------------------------------------------------------
    def max_groups(self, limits: list[int]) -> int:
        """Groups the cluster holds with every candidate at its limit."""
        st = _State(self)
        for v, lim in enumerate(limits):
            if lim:
                st.apply(self._rel(v, 0, lim), +1)
        return st.groups

    def solve(self, groups: int, limits: list[int]) -> Choice | None:
        """The fewest GPUs (then victims, then priority) that make room for `groups`; None if nothing does."""
        levels = [0] * len(self.victims)
        if self.base_groups >= groups:
            return self._choice(levels, self.base_groups)
        relevant = [v for v, lim in enumerate(limits) if lim and self.victims[v].sns]
        if single_node(self, relevant) and dp_steps(self, groups, relevant) <= DP_MAX_STEPS:
            # Many small victims: exact at any count (preemption_dp).
            dp = minimum_levels(self, groups, limits, relevant)
            if dp is None:
                if self.max_groups(limits) < groups:
                    return None
                dp = [0] * len(self.victims)  # the two counts disagree (a bug): the search below answers
            st = _State(self)
            for v, level in enumerate(dp):
                if level:
                    st.apply(self._rel(v, 0, level), +1)
            if st.groups >= groups:
                return self._choice(dp, st.groups)
            st = _State(self)  # the two counts disagree (a bug): the search below still answers
        else:
            st = _State(self)
        self._greedy(st, levels, limits, groups)
        if st.groups < groups:
            # The greedy ran out of moves that help on their own (releases that only free a slot
            # together): take everything, which also tells whether any plan exists at all.
            for v, lim in enumerate(limits):
                if levels[v] < lim:
                    st.apply(self._rel(v, levels[v], lim), +1)
                    levels[v] = lim
            if st.groups < groups:
                return None
        self._prune(st, levels, groups)
        self._improve(st, levels, limits, groups, everyone=len(relevant) <= _IMPROVE_EVERYONE_GANGS)
        best = self._choice(levels, st.groups)
        if len(relevant) <= _EXACT_MAX_GANGS:
            exact = self._exact(groups, limits, relevant, best)
            if exact is not None:
                best = exact
        return best

    def affordable_groups(self, budget: int, wanted: int) -> int:
        """The most groups (at most `wanted`) that `budget` evicted GPUs could possibly make room for.

        A supernode holds at most floor(free GPUs / group GPUs) groups; freeing the gap to the next
        multiple is the cheapest a group can come, then a whole group's worth. Taking the smallest
        gaps first gives a lower bound on the GPUs for any count (spares ignored, so not on recovery).
        """
        if self.request.recovery:
            return wanted
        size = self.request.group_gpus
        now = 0
        gaps = []
        for name, sn in self.snapshot.supernodes.items():
            if sn.accelerator == self.request.accelerator:
                free = self.snapshot.largest_free_slice(name)
                now += free // size
                if free % size:
                    gaps.append(size - free % size)
        groups = now
        left = budget
        for gap in sorted(gaps):
            if gap > left:
                break
            left -= gap
            groups += 1
        return min(wanted, groups + left // size)

    def most_within(self, groups: int, limits: list[int], budget: int) -> Choice:
        """As many of `groups` groups as the greedy makes room for within `budget` GPUs, pruned."""
        st = _State(self)
        levels = [0] * len(self.victims)
        if st.groups < groups:
            self._greedy(st, levels, limits, groups, budget=budget)
        reached = min(st.groups, groups)
        self._prune(st, levels, reached)
        return self._choice(levels, st.groups)

    def evictions(self, levels: Iterable[int]) -> tuple[Eviction, ...]:
        out = []
        for v, level in enumerate(levels):
            if not level:
                continue
            victim = self.victims[v]
            n = len(victim.gang.replicas)
            replicas = tuple(range(victim.first(level), n))
            out.append(Eviction(victim.gang.name, replicas, len(replicas) == n, victim.cost[level]))
        return tuple(sorted(out, key=lambda e: e.gang))

    def place(self, levels: Iterable[int], request: GangRequest) -> PlacementPlan | None:
        """plan_gang on the snapshot with the chosen victims' GPUs released; None if it finds no room."""
        released: dict[str, int] = {}
        for v, level in enumerate(levels):
            if level:
                victim = self.victims[v]
                for replica in victim.gang.replicas[victim.first(level) :]:
                    for name, g in replica:
                        released[name] = released.get(name, 0) + g
        try:
            plan = plan_gang(ReleasedView(self.snapshot, released), request)
        except AttributeError:
            # plan_gang asked the view something it does not overlay: release on a private copy, so
            # the caller's snapshot (the operator's journaled one) is never touched.
            scratch = self.snapshot.copy()
            plan = with_released(scratch, released, lambda: plan_gang(scratch, request))
        return plan if isinstance(plan, PlacementPlan) else None

    # -- internals -----------------------------------------------------------------------------
    def _delta(self, v: int, lo: int, hi: int) -> dict[str, int]:
        """GPUs per tracked node that raising victim v from level lo to hi releases (read-only)."""
        key = (v, lo, hi)
        delta = self._deltas.get(key)
        if delta is None:
            victim = self.victims[v]
            replicas = victim.replica_rel[victim.first(hi) : victim.first(lo)]
            delta = replicas[0] if len(replicas) == 1 else {}
            if len(replicas) > 1:
                for replica in replicas:
                    if delta.keys().isdisjoint(replica):
                        delta.update(replica)  # replicas on distinct nodes, the usual case
                    else:
                        for name, g in replica.items():
                            delta[name] = delta.get(name, 0) + g
            self._deltas[key] = delta
        return delta

    def _rel(self, v: int, lo: int, hi: int) -> Released:
        """_delta compiled for _State (read-only, cached)."""
        key = (v, lo, hi)
        out = self._released.get(key)
        if out is None:
            node_of, gpus, alloc, sn, holder = (
                self.node_of,
                self.node_gpus,
                self.node_alloc,
                self.node_sn,
                self.node_holder,
            )
            gpp = self.gpp
            # What the candidate's lower replicas (released at level lo) free already, where they share its nodes.
            below = self._delta(v, 0, lo) if lo and self.victims[v].stacked else None
            entries: list[tuple[int, int, int, int, int]] = []
            alone = 0  # slots from nodes of this candidate alone, when groups are slots
            per_sn: dict[int, int] = {}  # likewise per supernode, when partial credit sums are exact
            at: dict[int, int] = {}  # where each such supernode's entry goes: where it first appears
            flat, exact = self.flat, self.exact_partial
            for name, d in self._delta(v, lo, hi).items():
                i = node_of[name]
                if holder[i] != v:
                    entries.append((i, d, gpus[i], alloc[i], sn[i]))
                    continue
                node_gpus = gpus[i]
                held = alloc[i] - (below.get(name, 0) if below else 0)
                free = node_gpus - (held if held > 0 else 0)
                before = free // gpp if free > 0 else 0
                held -= d
                free = node_gpus - (held if held > 0 else 0)
                freed = (free // gpp if free > 0 else 0) - before
                if freed:
                    if flat:
                        alone += freed
                    elif exact:
                        j = sn[i]
                        if j in per_sn:
                            per_sn[j] += freed
                        else:  # gain's keys must come in the order the supernodes first appear
                            per_sn[j] = freed
                            at[j] = len(entries)
                            entries.append((-1, 0, 0, 0, j))
                    else:
                        entries.append((-1, freed, 0, 0, sn[i]))
            if alone:
                entries.append((-1, alone, 0, 0, 0))
            for j, slots in per_sn.items():
                entries[at[j]] = (-1, slots, 0, 0, j)
            out = self._released[key] = tuple(entries)
        return out

    def _choice(self, levels: list[int], groups: int) -> Choice:
        gpus = victims = prio = 0
        for v, level in enumerate(levels):
            if level:
                victim = self.victims[v]
                gpus += victim.cost[level]
                victims += 1
                prio += victim.gang.priority * victim.cost[level]
        return Choice(tuple(levels), gpus, victims, prio, groups)

    def _potential(self, groups: int, partial: float, target: int) -> float:
        """Whole groups plus partial credit, capped at the target: room beyond what is missing is worth nothing."""
        if groups >= target:
            return float(target)
        return groups + min(partial, _PARTIAL_CREDIT * (target - groups))

    def _greedy(
        self,
        st: _State,
        levels: list[int],
        limits: list[int],
        target: int,
        budget: int | None = None,
        allowed: set[int] | None = None,
    ) -> int:
        """Raise victims by best room-per-GPU until `target` groups fit (or no move helps / fits the budget).

        Returns the GPUs it added. Gains are kept per move and supernode; a pick re-scores only the
        moves on the supernodes it changed and fixes the gains of moves sharing its nodes.
        """
        pristine = not any(levels)  # (st holds exactly what levels release)
        heap: list[tuple[tuple, int, int, int, _Move]] = []
        tick = count()
        step = 0
        moves_of: dict[int, list[_Move]] = {}
        victims = self.victims
        per_group, phi, flat = self.per_group, self.phi, self.flat
        sslots = st.sslots  # updated in place by st.apply
        heappush = heapq.heappush
        potential = self._potential
        now = potential(st.groups, st.partial, target)  # every score until the next pick is measured from it
        cap = _PARTIAL_CREDIT

        def push(m: _Move) -> None:
            """Score m in the current state and queue it if it helps and fits the budget."""
            whole = 0
            partial = 0.0
            if flat:
                whole = sum(m.gain.values())
            else:
                for j, g in m.gain.items():
                    before = sslots[j]
                    after = before + g
                    whole += after // per_group - before // per_group
                    partial += phi[after % per_group] - phi[before % per_group]
            m.whole_groups = whole
            groups = st.groups + whole
            # _potential(groups, st.partial + partial, target) - now, inlined: thousands of scores per call.
            if groups >= target:
                value = float(target) - now
            else:
                value = groups + min(st.partial + partial, cap * (target - groups)) - now
            m.value = value
            m.version += 1
            if value > 1e-12 and (budget is None or m.cost <= budget - spent):
                gang = victims[m.victim].gang
                # Best room per GPU; then finished groups (whole domains); bigger moves (fewer victims); low priority.
                key = (-round(value / m.cost, 12), -whole, -m.cost, gang.priority, gang.name)
                heappush(heap, (key, next(tick), step, m.version, m))

        def delta_of(m: _Move) -> dict[str, int]:
            delta = m.delta
            if delta is None:
                delta = m.delta = self._delta(m.victim, m.lo, m.hi)
            return delta

        def make_moves(v: int) -> None:
            lo, lim = levels[v], limits[v]
            victim = victims[v]
            out = []
            n, shrinkable = victim.n, victim.shrinkable
            first_lo = n - lo if lo <= shrinkable else 0  # victim.first, inlined
            for hi in (lo + 1, lim) if lim > lo + 1 else (lim,) if lim > lo else ():
                first_hi = n - hi if hi <= shrinkable else 0
                if not any(victim.replica_rel[first_hi:first_lo]):
                    continue  # releases nothing the request could use, now or later
                if pristine and first_lo - first_hi == 1:
                    # One replica on the untouched snapshot: what it frees alone (a copy: gains change later).
                    gain = dict(victim.replica_gain[first_hi])
                elif pristine and victim.disjoint:  # on the untouched snapshot replica gains add up
                    gain = {}
                    for replica_gain in victim.replica_gain[first_hi:first_lo]:
                        for j, g in replica_gain.items():
                            gain[j] = gain.get(j, 0) + g
                else:
                    gain = st.gain(self._rel(v, lo, hi))
                out.append(_Move(v, lo, hi, victim.cost[hi] - victim.cost[lo], gain))
            moves_of[v] = out
            for m in out:
                push(m)

        spent = 0
        for v in range(len(victims)) if allowed is None else sorted(allowed):
            if limits[v] > levels[v] and victims[v].sns:
                make_moves(v)
        shared = self.node_victims
        node_of = self.node_of
        while st.groups < target and heap:
            _, _, stamp, version, m = heapq.heappop(heap)
            if not m.alive or version != m.version:
                continue
            if budget is not None and m.cost > budget - spent:
                continue
            if stamp != step:  # scored before the last pick: the cap may have moved, so score again
                push(m)
                continue
            pristine = False
            old_rel = {name: st.rel[node_of[name]] for name in delta_of(m) if name in shared} if shared else {}
            st.apply(self._rel(m.victim, m.lo, m.hi), +1)
            now = potential(st.groups, st.partial, target)
            spent += m.cost
            levels[m.victim] = m.hi
            for old in moves_of.pop(m.victim, ()):
                old.alive = False
            step += 1
            dirty: dict[int, _Move] = {}
            # Moves of other victims on the same nodes: their slot gains there changed.
            for name, before in old_rel.items():
                i = node_of[name]
                after = st.rel[i]
                for u in shared[name]:
                    if u == m.victim:
                        continue
                    for other in moves_of.get(u, ()):
                        d = delta_of(other).get(name)
                        if d is None:
                            continue
                        change = st.node_gain(i, d, after) - st.node_gain(i, d, before)
                        if change:
                            j = self.node_sn[i]
                            other.gain[j] = other.gain.get(j, 0) + change
                        dirty[id(other)] = other
            # Moves on the supernodes whose slot counts changed: their room gained changed (when
            # groups are slots only the cap moves, and stale scores are redone when they surface).
            for j in () if self.flat else m.gain:
                for u in self.sn_victims[j]:
                    for other in moves_of.get(u, ()):
                        dirty[id(other)] = other
            for other in dirty.values():
                push(other)
            if m.hi < limits[m.victim]:
                make_moves(m.victim)
        return spent

    def _prune(self, st: _State, levels: list[int], target: int) -> None:
        """Lower every victim, most GPUs first, as far down its ladder as the plan allows."""
        order = sorted(
            (v for v, level in enumerate(levels) if level),
            key=lambda v: (-self.victims[v].cost[levels[v]], -self.victims[v].gang.priority, v),
        )
        for v in order:
            level = levels[v]
            while level > 0:
                delta = self._rel(v, level - 1, level)
                st.apply(delta, -1)
                if st.groups >= target:
                    level -= 1
                else:
                    st.apply(delta, +1)
                    break
            levels[v] = level

    def _set_level(self, st: _State, levels: list[int], v: int, level: int) -> None:
        if level > levels[v]:
            st.apply(self._rel(v, levels[v], level), +1)
        elif level < levels[v]:
            st.apply(self._rel(v, level, levels[v]), -1)
        levels[v] = level

    def _improve(self, st: _State, levels: list[int], limits: list[int], target: int, everyone: bool) -> None:
        """Try to replace each victim (most GPUs first) by a cheaper re-cover (it may stay, lower on its ladder).

        The re-cover is greedy with the victim's GPUs as budget, from every candidate when there are
        few (`everyone`), else from its neighbours (gangs on the same supernodes). When the greedy
        stalls on releases that only help together, all those candidates go and pruning decides.
        """
        best = self._choice(levels, st.groups).objective
        order = sorted(
            (v for v, level in enumerate(levels) if level),
            key=lambda v: (-self.victims[v].cost[levels[v]], v),
        )
        for v in order[: _IMPROVE_ATTEMPTS if everyone else _IMPROVE_ATTEMPTS_NEIGHBOURS]:
            if not levels[v]:  # no wall-clock guard: the same cluster must give the same plan under any load
                continue
            saved = list(levels)
            cost = self.victims[v].cost[levels[v]]
            self._set_level(st, levels, v, 0)
            tabu = list(limits)
            tabu[v] = saved[v] - 1  # it may come back lower on its ladder (a smaller shrink), never as it was
            pool = range(len(levels)) if everyone else self._neighbours(v)
            self._greedy(st, levels, tabu, target, budget=cost, allowed=None if everyone else set(pool))
            if st.groups < target:
                for u in pool:
                    if tabu[u] > levels[u]:
                        self._set_level(st, levels, u, tabu[u])
            if st.groups >= target:
                self._prune(st, levels, target)
                objective = self._choice(levels, st.groups).objective
                if objective < best:
                    best = objective
                    continue
            for u, level in enumerate(saved):
                if levels[u] != level:
                    self._set_level(st, levels, u, level)

    def _neighbours(self, v: int) -> set[int]:
        """Gangs on the supernodes of victim v (on its nodes when groups are slots: then only nodes interact)."""
        victim = self.victims[v]
        if not self.flat:
            return {u for j in victim.sns for u in self.sn_victims[j]}
        shared = self.node_victims
        return {v} | {u for rel in victim.replica_rel for name in rel if name in shared for u in shared[name]}

    def _exact(self, target: int, limits: list[int], relevant: list[int], incumbent: Choice) -> Choice | None:
        """Depth-first branch and bound over the relevant victims' ladders; None if nothing beats the incumbent."""
        victims = self.victims
        base = _State(self)
        scored = []
        for v in relevant:
            gain = base.gain(self._rel(v, 0, limits[v]))
            room = sum(gain.values())
            scored.append((-room / max(victims[v].cost[limits[v]], 1), v))
        order = [v for _, v in sorted(scored)]
        cur = _State(self)
        opt = _State(self)
        for v in order:
            opt.apply_groups(self._rel(v, 0, limits[v]), +1)
        if opt.groups < target:
            return None
        suffix_min = [0] * (len(order) + 1)
        suffix_min[len(order)] = 1 << 60
        for k in range(len(order) - 1, -1, -1):
            suffix_min[k] = min(suffix_min[k + 1], victims[order[k]].cost[1])
        best_obj = incumbent.objective
        best_levels: list[int] | None = None
        levels = [0] * len(victims)
        explored = work = 0

        def move(v: int, lo: int, hi: int) -> None:
            """Victim v from level lo to hi in both states (cur: chosen so far, opt: chosen + all the rest)."""
            nonlocal work
            if lo < hi:
                delta = self._rel(v, lo, hi)
                cur.apply_groups(delta, +1)
                opt.apply_groups(delta, +1)
            else:
                delta = self._rel(v, hi, lo)
                cur.apply_groups(delta, -1)
                opt.apply_groups(delta, -1)
            work += len(self._delta(v, min(lo, hi), max(lo, hi)))  # nodes, however the release is compiled

        def dfs(k: int, gpus: int, nvict: int, prio: int) -> None:
            nonlocal best_obj, best_levels, explored, work
            explored += 1
            if cur.groups >= target:
                if (gpus, nvict, prio) < best_obj:
                    best_obj, best_levels = (gpus, nvict, prio), list(levels)
                return  # more evictions would only cost more
            if k == len(order) or explored > _EXACT_MAX_NODES or work > _EXACT_MAX_WORK:
                return
            if (gpus + suffix_min[k], nvict + 1) > best_obj[:2]:
                return  # one more victim, at least the cheapest left, already costs more than the best plan
            v = order[k]
            victim = victims[v]
            lim = limits[v]
            # opt held v at its limit: from here on it holds v at the level tried.
            delta = self._rel(v, 0, lim)
            opt.apply_groups(delta, -1)
            nodes = len(self._delta(v, 0, lim))
            work += nodes
            level = 0
            while True:
                if opt.groups >= target:  # else not even with everything left: only a higher level of v may do
                    levels[v] = level
                    cost = victim.cost[level]
                    dfs(k + 1, gpus + cost, nvict + (level > 0), prio + victim.gang.priority * cost)
                    levels[v] = 0
                if level == lim or (gpus + victim.cost[level + 1], nvict + 1) > best_obj[:2]:
                    break  # costs rise with the level
                move(v, level, level + 1)
                level += 1
            if level:
                move(v, level, 0)
            opt.apply_groups(delta, +1)
            work += nodes

        dfs(0, 0, 0, 0)
        if best_levels is None:
            return None
        st = _State(self)
        for v, level in enumerate(best_levels):
            if level:
                st.apply(self._rel(v, 0, level), +1)
        return self._choice(best_levels, st.groups)


class ReleasedView(ClusterSnapshot):
    """The snapshot as it would be with `released` GPUs given back, without copying it.

    Nodes with released GPUs are copies, and queries about their supernodes are the snapshot's
    answer corrected by those nodes' changes (as its own histograms would be after releasing on
    it); everything else is the snapshot's own answer. The snapshot's private
    indexes are not shared: a query that would read them raises AttributeError (callers fall
    back to with_released), so the view is never silently stale. Read-only: never book on it.
    """

    def __init__(self, base: ClusterSnapshot, released: dict[str, int]):  # no super().__init__: shares base
        self._base = base
        self.supernodes = base.supernodes
        self.shape_version = base.shape_version
        changed: dict[str, NodeState] = {}
        # Released nodes per supernode: names only, and a list only where there are several (a
        # plan touches thousands of supernodes; the fewer objects kept, the less garbage collection).
        first: dict[str, str] = {}
        more: dict[str, list[str]] = {}
        # Free GPUs of each released node before and after (node.free, read once, not per query),
        # and the change in free non-spare GPUs per supernode (largest_free_slice, for all of them).
        free_before: dict[str, int] = {}
        free_after: dict[str, int] = {}
        freed: dict[str, int] = {}
        nodes = base.nodes
        for name, gpus in released.items():
            node = nodes.get(name)
            if node is None or gpus <= 0:
                continue  # a node that vanished took its allocation with it
            allocated = node.allocated - gpus
            if allocated < 0:
                allocated = 0
            supernode = node.supernode
            # Positional: thousands of nodes per plan, and keywords cost more than the copy itself.
            changed[name] = NodeState(
                node.name,
                supernode,
                node.gpus,
                allocated,
                node.ready,
                node.cordoned,
                node.spare,
                node.tainted,
            )
            if node.ready and not node.cordoned and not node.tainted:  # NodeState.free, inlined
                before = node.gpus - node.allocated
                before = before if before > 0 else 0
                after = node.gpus - allocated
                after = after if after > 0 else 0
            else:
                before = after = 0
            free_before[name] = before
            free_after[name] = after
            if not node.spare:
                freed[supernode] = freed.get(supernode, 0) + after - before
            seen = first.setdefault(supernode, name)
            if seen is not name:
                names = more.get(supernode)
                if names is None:
                    more[supernode] = [seen, name]
                else:
                    names.append(name)
        self._changed = changed
        self.nodes = ChainMap(changed, base.nodes)  # type: ignore[assignment]
        self._first = first
        self._more = more
        self._free_before = free_before
        self._free_after = free_after
        self._freed = freed
        self._touched = first.keys()
        self._totals: dict[tuple[int, bool], dict[str, int]] = {}

    def __getattr__(self, name: str) -> object:
        """Public data the view does not overlay (caches of the cluster's shape) comes from the snapshot."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._base, name)

    def member_nodes(self, supernode: str) -> Iterator[NodeState]:
        changed, nodes = self._changed, self._base.nodes
        names = self.supernodes[supernode].nodes
        # A list behind the iterator, not a generator: plan_gang asks for thousands of supernodes,
        # and for HGX servers (one node each) not even a comprehension.
        if len(names) == 1:
            return iter((changed.get(names[0]) or nodes[names[0]],))
        return iter([changed.get(name) or nodes[name] for name in names])

    def _total(self, supernode: str, unit: int, include_spares: bool) -> int:
        """Sum over member nodes of free // unit (unit 1: free GPUs), cached: the view never changes.

        The snapshot's own count, corrected by the released nodes only: a 48-node domain with one
        node released costs one node, not 48."""
        if unit == 1 and not include_spares:  # the snapshot keeps this as a running sum: no walk at all
            return self._base.largest_free_slice(supernode) + self._freed.get(supernode, 0)
        totals = self._totals.get((unit, include_spares))
        if totals is None:
            totals = self._totals[unit, include_spares] = {}
        total = totals.get(supernode)
        if total is None:
            names = self._more.get(supernode) or (self._first[supernode],)
            changed, after = self._changed, self._free_after
            if len(names) == len(self.supernodes[supernode].nodes):  # all of it released (an 8-GPU server)
                total = 0
                for name in names:
                    if include_spares or not changed[name].spare:
                        total += after[name] // unit
            else:
                total = self._base.pod_slots(supernode, unit, include_spares)
                before = self._free_before
                for name in names:
                    if include_spares or not changed[name].spare:
                        total += after[name] // unit - before[name] // unit
            totals[supernode] = total
        return total

    def pod_slots(self, supernode: str, gpus_per_pod: int, include_spares: bool = False) -> int:
        if supernode not in self._touched:
            return self._base.pod_slots(supernode, gpus_per_pod, include_spares)
        return self._total(supernode, gpus_per_pod, include_spares)

    def largest_free_slice(self, supernode: str) -> int:
        if supernode not in self._touched:
            return self._base.largest_free_slice(supernode)
        return self._total(supernode, 1, False)

    def supernodes_with_free(self, accelerator: str, at_least: int) -> list[str]:
        touched, supernodes, freed = self._touched, self.supernodes, self._freed
        untouched = [n for n in self._base.supernodes_with_free(accelerator, at_least) if n not in touched]
        free_now = self._base.largest_free_slice  # plus what was freed: largest_free_slice, inlined
        return untouched + [
            n
            for n in sorted(touched)
            if supernodes[n].accelerator == accelerator and free_now(n) + freed.get(n, 0) >= at_least
        ]

    # Queries about the cluster's shape, not its allocation: the snapshot's answers (and caches) hold.
    def accelerators(self) -> set[str]:
        return self._base.accelerators()

    def domain_gpus(self, supernode: str) -> int:
        return self._base.domain_gpus(supernode)

    def total_gpus(self) -> int:
        return self._base.total_gpus()


def with_released(snapshot: ClusterSnapshot, released: dict[str, int], fn: Callable[[], T]) -> T:
    """Run fn with `released` GPUs given back on the snapshot, then put every node's allocation back exactly."""
    saved: dict[str, int] = {}
    try:
        for name, gpus in released.items():
            node = snapshot.nodes.get(name)
            if node is None:
                continue  # a node that vanished took its allocation with it
            saved[name] = node.allocated
            snapshot.update_node(name, allocated=max(node.allocated - gpus, 0))
        return fn()
    finally:
        for name, allocated in saved.items():
            snapshot.update_node(name, allocated=allocated)


def sized(request: GangRequest, groups: int) -> GangRequest:
    """The request for `groups` of its groups (fresh group ids)."""
    return request if groups == request.groups else replace(request, groups=groups, group_ids=None)
