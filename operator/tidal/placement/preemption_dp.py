"""The exact minimum when every candidate gang sits on one node: a DP over nodes, then supernodes.

When each candidate holds GPUs on a single node, what one candidate frees changes only its own
node's pod slots, so the problem splits: a node's slots depend only on its own candidates'
levels, a supernode's groups only on its nodes' slots, and the request fits when the supernodes'
groups add up (EvictionSearch's count, plan_gang's test). Three knapsacks, each keeping the
cheapest way to every outcome:

1. per node, over its candidates' ladders: released GPUs -> cheapest options, turned into pod
   slots gained;
2. per supernode, over its nodes: slots gained (capped at what the missing groups need) ->
   cheapest, turned into groups gained;
3. over supernodes: groups gained, capped at the missing ones.

Cost is plan_preemption's objective, (GPUs, victims, priority x GPUs), added up and compared
lexicographically; it is folded into one integer so the tables compare ints. That is exact
because the objective is a sum per candidate and lexicographic order survives addition.

The issue it closes: with many small victims (15-166 relevant gangs, each on one node) the exact
branch and bound is off (over 40 gangs) or stops at its work caps, and the greedy missed the
minimum in over a third of the instances (worst 1.6x). Caller: EvictionSearch.solve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidal.placement.preemption import EvictionSearch

Picks = tuple[tuple[int, int], "Picks"] | None
"""(candidate, level) chosen, as a linked list: a table entry extends its parent's in O(1)."""
Table = dict[int, tuple[int, Picks]]
"""Outcome (released GPUs, slots or groups gained) -> (folded cost, the picks that reach it)."""


def single_node(search: EvictionSearch, relevant: list[int]) -> bool:
    """Every relevant candidate holds its tracked GPUs on one node (the DP's premise)."""
    for v in relevant:
        nodes: set[str] = set()
        for replica in search.victims[v].replica_rel:
            nodes.update(replica)
            if len(nodes) > 1:
                return False
    return True


DP_MAX_STEPS = 2_000_000
"""Table steps the DP may take (about a second of Python); above, the greedy and the branch and
bound decide as they did before it (a flat request for thousands of groups on thousands of
elastic victims would otherwise take minutes inside an operator cycle)."""


def dp_steps(search: EvictionSearch, target: int, relevant: list[int]) -> int:
    """An upper bound on the supernode stage's table steps, the DP's dominant cost: per tracked
    node, its released-GPU outcomes times the slot outcomes its supernode's table may hold."""
    need = target - search.base_groups
    nodes = {search.node_of[name] for v in relevant for replica in search.victims[v].replica_rel for name in replica}
    per_group = search.per_group
    steps = 0
    for i in nodes:
        s0 = search.sn_slots0[search.node_sn[i]]
        cap = (s0 // per_group + need) * per_group - s0
        steps += (search.node_alloc[i] + 1) * (cap + 1)
    return steps


def minimum_levels(search: EvictionSearch, target: int, limits: list[int], relevant: list[int]) -> list[int] | None:
    """Levels (per candidate) of the cheapest plan that holds `target` groups, or None if none does.

    Premise: single_node(search, relevant). Candidates outside `relevant` stay at level 0.
    """
    need = target - search.base_groups
    levels = [0] * len(search.victims)
    if need <= 0:
        return levels
    fold = _Fold(search, relevant, limits)
    # Candidates by node (tracked index), in the order they come.
    on_node: dict[int, list[int]] = {}
    for v in relevant:
        victim = search.victims[v]
        name = next(name for replica in victim.replica_rel for name in replica)
        on_node.setdefault(search.node_of[name], []).append(v)
    # Stage 1 then 2: per supernode, the cheapest way to each count of groups gained.
    nodes_of_sn: dict[int, list[int]] = {}
    for i in on_node:
        nodes_of_sn.setdefault(search.node_sn[i], []).append(i)
    per_group = search.per_group
    total: Table = {0: (0, None)}
    for j, nodes in nodes_of_sn.items():
        s0 = search.sn_slots0[j]
        cap = (s0 // per_group + need) * per_group - s0  # slots gained beyond it add no group that is missing
        slots: Table = {0: (0, None)}
        for i in nodes:
            slots = _combine(slots, _node_slots(search, i, on_node[i], limits, fold), cap)
        groups: Table = {}
        for gained, entry in slots.items():
            k = (s0 + gained) // per_group - s0 // per_group
            if k and (k not in groups or entry[0] < groups[k][0]):
                groups[k] = entry
        # Stage 3: over supernodes, groups gained capped at the missing ones.
        total = _combine(total, groups, need)
    if need not in total:
        return None
    picks = total[need][1]
    while picks is not None:
        (v, level), picks = picks
        levels[v] = level
    return levels


class _Fold:
    """(GPUs, victims, priority x GPUs) as one int whose order is the tuple's.

    Priorities may be negative (Kubernetes allows it): the priority term is taken from the
    lowest one, which adds the same amount to every plan of the same GPUs, so ties on GPUs and
    victims still order by priority."""

    def __init__(self, search: EvictionSearch, relevant: list[int], limits: list[int]):
        victims = search.victims
        self.low = min((victims[v].gang.priority for v in relevant), default=0)
        prio_span = sum((victims[v].gang.priority - self.low) * victims[v].cost[limits[v]] for v in relevant) + 1
        self.victim_unit = prio_span
        self.gpu_unit = (len(relevant) + 1) * prio_span

    def cost(self, search: EvictionSearch, v: int, level: int) -> int:
        victim = search.victims[v]
        gpus = victim.cost[level]
        return gpus * self.gpu_unit + self.victim_unit + (victim.gang.priority - self.low) * gpus


def _node_slots(search: EvictionSearch, i: int, candidates: list[int], limits: list[int], fold: _Fold) -> Table:
    """Pod slots gained on tracked node i -> the cheapest options of its candidates that gain them."""
    alloc = search.node_alloc[i]
    released: Table = {0: (0, None)}
    for v in candidates:
        victim = search.victims[v]
        # GPUs on the node each level releases: suffix sums over the replicas (a long ladder).
        suffix = [0] * (victim.n + 1)
        for k in range(victim.n - 1, -1, -1):
            suffix[k] = suffix[k + 1] + sum(victim.replica_rel[k].values())
        ladder = [
            (suffix[victim.first(level)], fold.cost(search, v, level), (v, level)) for level in range(1, limits[v] + 1)
        ]
        grown = dict(released)
        for r, (cost, picks) in released.items():
            for gpus, extra, pick in ladder:
                after = min(r + gpus, alloc)
                total = cost + extra
                if after not in grown or total < grown[after][0]:
                    grown[after] = (total, (pick, picks))
        released = grown
    gpus, gpp, slots0 = search.node_gpus[i], search.gpp, search.node_slots0[i]
    out: Table = {}
    for r, entry in released.items():
        held = alloc - r
        free = gpus - (held if held > 0 else 0)
        gained = (free // gpp if free > 0 else 0) - slots0
        if gained not in out or entry[0] < out[gained][0]:
            out[gained] = entry
    return out


def _combine(left: Table, right: Table, cap: int) -> Table:
    """Every way to add one outcome of each table (sums capped at `cap`), the cheapest kept per sum."""
    out = dict(left)
    for a, (cost_a, picks_a) in left.items():
        for b, (cost_b, picks_b) in right.items():
            if not b:
                continue
            total = min(a + b, cap)
            cost = cost_a + cost_b
            if total not in out or cost < out[total][0]:
                out[total] = (cost, _join(picks_b, picks_a))
    return out


def _join(front: Picks, back: Picks) -> Picks:
    """front's picks before back's (front is one node's or supernode's few)."""
    items = []
    while front is not None:
        item, front = front
        items.append(item)
    for item in reversed(items):
        back = (item, back)
    return back
