"""Preemption among many small victims: plan_preemption against an exact MILP oracle.

    python -m bench.preemption_small [--json] [--instances 200] [--seed 7]

The family (issue 34): every running gang sits on one node (one to three replicas of one pod,
or one replica of one or two pods, of 1, 2 or 4 GPUs), 15-200 of them are candidates, on 2-8
supernodes of 4-18 nodes of 4 or 8 GPUs, ~92% allocated, and a higher-priority request for 1-4
groups of one or two node-sized pods that does not fit now. Brute force cannot enumerate 2^166
combinations, so the oracle is an integer program solved by HiGHS (scipy.optimize.milp), written
from the model alone, without the planner's code: one binary per option of each gang (untouched,
give back its top 1..K replicas, suspend whole), pod slots per node <= free GPUs / pod GPUs,
groups per supernode <= slots / pods per group, groups >= asked; minimise GPUs evicted, then
victims. Reported: the share of instances at the oracle's GPUs, the worst ratio, and the p50 and
slowest plan_preemption call.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from bench.preemption import options
from tidal.placement import GangRequest, PreemptionPlan, RunningGang, Unplaceable, plan_gang, plan_preemption
from tidal.topology import ClusterSnapshot
from tidal.topology.snapshot import NodeState, SupernodeState

ACCELERATOR = "nvidia.com/gpu"
Instance = tuple[ClusterSnapshot, GangRequest, list[RunningGang]]


def instance(rng: random.Random, most_gangs: int = 200) -> Instance:
    """One instance of the family (it may fit without evictions or have too many candidates: the caller draws again)."""
    snapshot = ClusterSnapshot()
    node_gpus = rng.choice([4, 8])
    nodes: list[str] = []
    for s in range(rng.randint(2, 8)):
        sn = f"s{s}"
        members = [f"{sn}-n{i}" for i in range(rng.randint(4, 18))]
        snapshot.add_supernode(SupernodeState(sn, ACCELERATOR, list(members), block=f"b{s // 4}"))
        for name in members:
            snapshot.add_node(NodeState(name, sn, node_gpus))
        nodes += members
    running: list[RunningGang] = []
    for name in nodes:
        target = node_gpus if rng.random() < 0.75 else rng.randint(0, node_gpus - 1)
        while snapshot.nodes[name].allocated < target:
            room = target - snapshot.nodes[name].allocated
            pod = rng.choice([p for p in (1, 2, 4) if p <= room] or [room])
            fits = room // pod
            if rng.random() < 0.4 and fits >= 2:  # replicas of one pod each, maybe elastic
                replicas = [((name, pod),) for _ in range(rng.randint(2, min(3, fits)))]
                elastic = rng.random() < 0.5
            else:  # one replica of one or two pods
                replicas = [((name, pod),) * min(rng.randint(1, 2), fits)]
                elastic = False
            gpus = sum(g for replica in replicas for _, g in replica)
            snapshot.allocate(name, gpus)
            running.append(
                RunningGang(
                    f"g{len(running)}",
                    priority=rng.choice([0, 0, 1, 2]),
                    preemptible=rng.random() < 0.92,
                    replicas=tuple(replicas),
                    min_replicas=1 if elastic else None,
                )
            )
    for name in nodes:  # a few failed nodes: what their gangs hold gives the request nothing
        if rng.random() < 0.02:
            snapshot.update_node(name, ready=False)
    pod = node_gpus if rng.random() < 0.6 else node_gpus // 2
    per_group = rng.choice([1, 2, 2, 4])
    request = GangRequest(
        "big",
        groups=rng.randint(1, 4),
        group_gpus=pod * per_group,
        gpus_per_pod=pod,
        accelerator=ACCELERATOR,
        priority=3,
    )
    return snapshot, request, running


def candidates(snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang]) -> int:
    """Gangs plan_preemption may evict that hold GPUs on a usable node (the ones that can matter)."""
    usable = {n for n, node in snapshot.nodes.items() if node.ready and not node.cordoned and not node.tainted}
    return sum(
        1
        for g in running
        if g.preemptible and g.priority < request.priority and any(n in usable for r in g.replicas for n, _ in r)
    )


def instances(count: int, seed: int, fewest: int = 15, most: int = 200) -> list[Instance]:
    """`count` instances that need evictions, with `fewest`-`most` candidates."""
    rng = random.Random(seed)
    out: list[Instance] = []
    while len(out) < count:
        snapshot, request, running = instance(rng)
        if not fewest <= candidates(snapshot, request, running) <= most:
            continue
        if isinstance(plan_gang(snapshot, request), Unplaceable):
            out.append((snapshot, request, running))
    return out


def milp_minimum(snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang]) -> tuple[int, int] | None:
    """(fewest GPUs evicted, fewest victims at that many GPUs), or None if nothing makes room."""
    eligible = [g for g in running if g.preemptible and g.priority < request.priority and g.replicas]
    gangs = [options(g)[1:] for g in eligible]  # options other than "untouched"
    usable = [
        name
        for name, node in snapshot.nodes.items()
        if node.ready
        and not node.cordoned
        and not node.tainted
        and (request.recovery or not node.spare)
        and snapshot.supernodes[node.supernode].accelerator == request.accelerator
    ]
    supernodes = sorted({snapshot.nodes[n].supernode for n in usable})
    x = [(k, o) for k, opts in enumerate(gangs) for o in range(len(opts))]
    nx, nn, ns = len(x), len(usable), len(supernodes)
    width = nx + nn + ns  # option binaries, then slots per node, then groups per supernode
    rows: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []

    def row() -> np.ndarray:
        return np.zeros(width)

    for k in range(len(gangs)):  # at most one option per gang
        r = row()
        for col, (kk, _) in enumerate(x):
            r[col] = kk == k
        rows.append(r), lower.append(0), upper.append(1)
    node_col = {name: nx + i for i, name in enumerate(usable)}
    gpp = request.gpus_per_pod
    for name in usable:  # gpp * slots - released <= free now
        node = snapshot.nodes[name]
        r = row()
        r[node_col[name]] = gpp
        for col, (k, o) in enumerate(x):
            r[col] = -gangs[k][o][1].get(name, 0)
        rows.append(r), lower.append(-np.inf), upper.append(node.gpus - node.allocated)
    sn_col = {sn: nx + nn + j for j, sn in enumerate(supernodes)}
    for sn in supernodes:  # pods per group * groups <= slots of the supernode
        r = row()
        r[sn_col[sn]] = request.pods_per_group
        for name in usable:
            if snapshot.nodes[name].supernode == sn:
                r[node_col[name]] = -1
        rows.append(r), lower.append(-np.inf), upper.append(0)
    r = row()
    for sn in supernodes:
        r[sn_col[sn]] = 1
    rows.append(r), lower.append(request.groups), upper.append(np.inf)
    victims_max = len(gangs) + 1
    cost = np.zeros(width)
    for col, (k, o) in enumerate(x):
        cost[col] = gangs[k][o][0] * victims_max + 1
    slot_max = [snapshot.nodes[n].gpus // gpp for n in usable]
    result = milp(
        cost,
        constraints=LinearConstraint(np.array(rows), lower, upper),
        integrality=np.ones(width),
        bounds=Bounds([0] * width, [1] * nx + slot_max + [np.inf] * ns),
        options={"mip_rel_gap": 0},
    )
    if result.status == 2:  # infeasible
        return None
    if result.status != 0:
        raise RuntimeError(f"HiGHS: {result.message}")
    chosen = [x[col] for col in range(nx) if result.x[col] > 0.5]
    return sum(gangs[k][o][0] for k, o in chosen), len(chosen)


def run(count: int, seed: int) -> dict[str, object]:
    ratios: list[float] = []
    more_victims = missed = unsafe = 0
    wall: list[float] = []
    sizes: list[int] = []
    for snapshot, request, running in instances(count, seed):
        sizes.append(candidates(snapshot, request, running))
        minimum = milp_minimum(snapshot, request, running)
        start = time.perf_counter()
        result = plan_preemption(snapshot, request, running)
        wall.append(time.perf_counter() - start)
        if minimum is None:
            unsafe += isinstance(result, PreemptionPlan)
            continue
        if not isinstance(result, PreemptionPlan):
            missed += 1
            continue
        ratios.append(result.evicted_gpus / minimum[0])
        more_victims += result.evicted_gpus == minimum[0] and len(result.evictions) > minimum[1]
    solved = len(ratios) + missed
    return {
        "preemption_many_small_instances": solved,
        "preemption_many_small_candidates_min": min(sizes),
        "preemption_many_small_candidates_max": max(sizes),
        "preemption_many_small_at_minimum_share": round(sum(r == 1.0 for r in ratios) / max(solved, 1), 4),
        "preemption_many_small_worst_excess_ratio": round(max(ratios, default=1.0), 4),
        "preemption_many_small_more_victims": more_victims,
        "preemption_many_small_missed": missed,
        "preemption_many_small_infeasible_but_evicted": unsafe,
        "preemption_many_small_p50_ms": round(1000 * statistics.median(wall), 2),
        "preemption_many_small_max_ms": round(1000 * max(wall), 2),
        "preemption_many_small_seed": seed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = run(args.instances, args.seed)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:<48} {value}")


if __name__ == "__main__":
    main()
