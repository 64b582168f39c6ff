"""plan_preemption against brute force on seeded random small clusters.

Brute force enumerates every combination of options (untouched, shrink by the top 1..K
replicas of an elastic gang, suspend whole) and counts room node by node, without the planner's
code. The planner must evict the fewest GPUs on every instance (its exact search covers such
small candidate sets), and its heuristic alone must stay close, so a broken heuristic rule
shows up here as well as in the targeted tests of test_preemption.py.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest

import tidal.placement.preemption as preemption
from tidal.placement import GangRequest, PreemptionPlan, RunningGang, Unplaceable, plan_gang, plan_preemption
from tidal.topology import ClusterSnapshot
from tidal.topology.snapshot import NodeState, SupernodeState

from .test_placement_properties import check_plan


def options(gang: RunningGang) -> list[tuple[int, dict[str, int], bool]]:
    """(GPUs evicted, GPUs released per node, is a victim) for each thing that may happen to the gang."""
    n = len(gang.replicas)
    firsts = {0}  # suspend whole
    if gang.min_replicas is not None:
        firsts |= {n - k for k in range(1, n - min(gang.min_replicas, n) + 1)}  # give back the top k
    out: list[tuple[int, dict[str, int], bool]] = [(0, {}, False)]
    for first in sorted(firsts, reverse=True):
        released: dict[str, int] = defaultdict(int)
        for replica in gang.replicas[first:]:
            for node, gpus in replica:
                released[node] += gpus
        out.append((sum(released.values()), dict(released), True))
    return out


def groups_with(snap: ClusterSnapshot, req: GangRequest, released: dict[str, int]) -> int:
    total = 0
    for sn in snap.supernodes.values():
        if sn.accelerator != req.accelerator:
            continue
        pods = 0
        for name in sn.nodes:
            node = snap.nodes[name]
            if not node.ready or node.cordoned or (node.spare and not req.recovery):
                continue
            pods += max(node.gpus - max(node.allocated - released.get(name, 0), 0), 0) // req.gpus_per_pod
        total += pods // req.pods_per_group
    return total


def brute_force(snap: ClusterSnapshot, req: GangRequest, running: list[RunningGang]) -> tuple[int, int] | None:
    """(fewest GPUs, fewest victims at that many GPUs), or None when nothing makes room."""
    eligible = [g for g in running if g.preemptible and g.priority < req.priority and g.replicas]
    best = None
    for combo in itertools.product(*(options(g) for g in eligible)):
        cost = (sum(o[0] for o in combo), sum(o[2] for o in combo))
        if best is not None and cost >= best:
            continue
        released: dict[str, int] = defaultdict(int)
        for _, rel, _ in combo:
            for node, gpus in rel.items():
                released[node] += gpus
        if groups_with(snap, req, released) >= req.groups:
            best = cost
    return best


def instance(rng: random.Random) -> tuple[ClusterSnapshot, GangRequest, list[RunningGang]]:
    """1-4 supernodes of 2-5 nodes of 4 or 8 GPUs (some cordoned, spare or failed); gangs concentrated
    or scattered, several pods per node, elastic ones with random minDP; a request of priority 2-4."""
    snap = ClusterSnapshot()
    names = []
    for s in range(rng.randint(1, 4)):
        gpus = rng.choice([4, 8])
        members = [f"s{s}-n{i}" for i in range(rng.randint(2, 5))]
        snap.add_supernode(SupernodeState(f"s{s}", "nvidia.com/gpu", list(members), block=f"b{s // 2}"))
        for name in members:
            roll = rng.random()
            cordoned, spare, failed = roll < 0.05, 0.05 <= roll < 0.1, roll >= 0.97
            snap.add_node(NodeState(name, f"s{s}", gpus, cordoned=cordoned, spare=spare, ready=not failed))
        names += members
    running = []
    for g in range(rng.randint(2, 7)):
        pod = rng.choice([2, 4, 4])
        pool = list(snap.supernodes[rng.choice(list(snap.supernodes))].nodes) if rng.random() < 0.6 else names
        replicas = []
        for _ in range(rng.randint(1, 3)):
            pods = []
            for _ in range(rng.randint(1, 3)):
                fits = [n for n in pool if snap.nodes[n].gpus - snap.nodes[n].allocated >= pod]
                if not fits:
                    break
                node = rng.choice(fits)
                snap.update_node(node, allocated=snap.nodes[node].allocated + pod)
                pods.append((node, pod))  # one entry per pod, as the operator passes them
            if pods:
                replicas.append(tuple(pods))
        if replicas:
            elastic = len(replicas) > 1 and rng.random() < 0.5
            min_replicas = rng.randint(0, len(replicas) - 1) if elastic else None
            running.append(RunningGang(f"g{g}", rng.randint(0, 3), rng.random() < 0.8, tuple(replicas), min_replicas))
    gpp = rng.choice([2, 4, 4])
    req = GangRequest(
        "req", rng.randint(1, 3), gpp * rng.randint(1, 4), gpp, priority=rng.randint(2, 4), recovery=rng.random() < 0.15
    )
    return snap, req, running


def compare(count: int, seed: int) -> tuple[list[float], int, int]:
    """Evicted / minimum per instance that needs evictions; instances where it found none wrongly; and
    instances at the fewest GPUs but not the fewest victims."""
    rng = random.Random(seed)
    ratios: list[float] = []
    missed = more_victims = 0
    while len(ratios) + missed < count:
        snap, req, running = instance(rng)
        if not isinstance(plan_gang(snap, req), Unplaceable):
            continue
        before = {n: v.allocated for n, v in snap.nodes.items()}
        minimum = brute_force(snap, req, running)
        result = plan_preemption(snap, req, running)
        assert {n: v.allocated for n, v in snap.nodes.items()} == before, "plan_preemption mutated the snapshot"
        if minimum is None:
            assert isinstance(result, Unplaceable), "evicted although nothing makes room"
            continue
        if not isinstance(result, PreemptionPlan):
            missed += 1
            continue
        scratch = snap.copy()
        by_name = {g.name: g for g in running}
        for e in result.evictions:
            for r in e.replicas:
                for node, gpus in by_name[e.gang].replicas[r]:
                    scratch.release(node, gpus)
        check_plan(scratch, req, result.placement)
        ratios.append(result.evicted_gpus / minimum[0])
        more_victims += result.evicted_gpus == minimum[0] and len(result.evictions) > minimum[1]
    return ratios, missed, more_victims


def test_exact_minimum_on_200_seeded_instances():
    ratios, missed, more_victims = compare(200, seed=11)
    assert missed == 0
    assert all(r == 1.0 for r in ratios), f"{sum(r > 1 for r in ratios)} of {len(ratios)} above the minimum"
    assert more_victims == 0, "fewest victims among the cheapest plans"


def test_heuristic_alone_stays_close_to_the_minimum(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(preemption, "_EXACT_MAX_GANGS", -1)  # the path every large cluster takes
    ratios, missed, _ = compare(200, seed=11)
    assert missed == 0
    at_minimum = sum(r == 1.0 for r in ratios) / len(ratios)
    assert at_minimum >= 0.95, f"at the minimum in {at_minimum:.0%}"
    assert max(ratios) <= 1.5
