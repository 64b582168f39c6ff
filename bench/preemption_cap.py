"""What the branch and bound's caps cost: capped against uncapped search on medium instances.

    python -m bench.preemption_cap [--json] [--seeds 1 2] [--instances 150] [--quick]

`plan_preemption` searches exactly when at most `_EXACT_MAX_GANGS` (40) gangs matter, but stops
after `_EXACT_MAX_NODES` search nodes or `_EXACT_MAX_WORK` node updates and keeps the best plan
found so far. bench.preemption's instances are small enough never to reach the caps; these have
20-38 running gangs on 3-6 supernodes of 4-9 eight-GPU nodes (gangs of 1-3 replicas of 1-3 pods,
1, 2 or 4 GPUs a pod, ~90% preemptible, ~30% of the multi-replica ones elastic) and a request that
does not fit now. Each instance is planned with the shipped caps, 4x and 10x them, and with no
cap (the reference: the exact minimum). Reported per setting: instances whose plan takes more GPUs
than the reference, the worst ratio, and the p50 and slowest call.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import tidal.placement.preemption as preemption
from tidal.placement import GangRequest, PlacementPlan, RunningGang, Unplaceable, apply_plan, plan_gang
from tidal.topology import ClusterSnapshot
from tidal.topology.snapshot import NodeState, SupernodeState

SHIPPED = (preemption._EXACT_MAX_NODES, preemption._EXACT_MAX_WORK)
SETTINGS = {
    "shipped": SHIPPED,
    "4x": (4 * SHIPPED[0], 4 * SHIPPED[1]),
    "10x": (10 * SHIPPED[0], 10 * SHIPPED[1]),
    "uncapped": (10**9, 10**12),
}

Instance = tuple[ClusterSnapshot, GangRequest, list[RunningGang]]


def instance(rng: random.Random) -> Instance:
    snap = ClusterSnapshot()
    for i in range(rng.randint(3, 6)):
        members = [f"s{i}-n{j}" for j in range(rng.randint(4, 9))]
        snap.add_supernode(SupernodeState(f"s{i}", "a", members, f"b{i % 2}"))
        for name in members:
            snap.add_node(NodeState(name, f"s{i}", 8))
    running = []
    for g in range(rng.randint(20, 38)):
        gpp, ppg, replicas = rng.choice([1, 2, 4]), rng.randint(1, 3), rng.randint(1, 3)
        plan = plan_gang(snap, GangRequest(f"g{g}", replicas, gpp * ppg, gpp, "a"))
        if not isinstance(plan, PlacementPlan):
            continue
        apply_plan(snap, plan)
        held = tuple(tuple((node, gpp) for node in group.nodes) for group in plan.groups)
        elastic = replicas > 1 and rng.random() < 0.3
        minimum = rng.randint(1, replicas - 1) if elastic else None
        running.append(RunningGang(f"g{g}", rng.randint(0, 3), rng.random() < 0.9, held, minimum))
    gpp = rng.choice([2, 4, 8])
    request = GangRequest("request", rng.randint(1, 3), gpp * rng.randint(1, 4), gpp, "a", priority=4)
    return snap, request, running


def instances(seeds: list[int], per_seed: int) -> list[Instance]:
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        for _ in range(per_seed):
            snap, request, running = instance(rng)
            if isinstance(plan_gang(snap, request), Unplaceable):
                out.append((snap, request, running))
    return out


def run(seeds: list[int], per_seed: int) -> dict[str, object]:
    cases = instances(seeds, per_seed)
    gpus: dict[str, list[int | None]] = {}
    out: dict[str, object] = {"seeds": seeds, "instances": len(cases)}
    try:
        for name, (nodes, work) in SETTINGS.items():
            preemption._EXACT_MAX_NODES, preemption._EXACT_MAX_WORK = nodes, work
            gpus[name], times = [], []
            for snap, request, running in cases:
                started = time.perf_counter()
                plan = preemption.plan_preemption(snap, request, running)
                times.append((time.perf_counter() - started) * 1000)
                gpus[name].append(None if isinstance(plan, Unplaceable) else plan.evicted_gpus)
            out[f"{name}_p50_ms"] = round(statistics.median(times), 1)
            out[f"{name}_max_ms"] = round(max(times), 1)
    finally:
        preemption._EXACT_MAX_NODES, preemption._EXACT_MAX_WORK = SHIPPED
    for name in SETTINGS:
        pairs = [(a, b) for a, b in zip(gpus[name], gpus["uncapped"], strict=True) if a is not None and b]
        out[f"{name}_above_minimum"] = sum(1 for a, b in pairs if a > b)
        out[f"{name}_worst_ratio"] = round(max((a / b for a, b in pairs), default=1.0), 3)
        out[f"{name}_found_none"] = sum(1 for a, b in zip(gpus[name], gpus["uncapped"], strict=True) if a is None and b)
    return out


def table(result: dict[str, object]) -> str:
    rows = [
        f"{result['instances']} instances (seeds {result['seeds']})",
        "| caps | above the minimum | worst / minimum | p50 | slowest |",
        "|---|---|---|---|---|",
    ]
    for name in SETTINGS:
        rows.append(
            f"| {name} | {result[f'{name}_above_minimum']} | {result[f'{name}_worst_ratio']} "
            f"| {result[f'{name}_p50_ms']} ms | {result[f'{name}_max_ms']} ms |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--instances", type=int, default=150, help="instances drawn per seed")
    parser.add_argument("--quick", action="store_true", help="CI smoke: one seed, 20 instances")
    args = parser.parse_args()
    seeds, per_seed = ([1], 20) if args.quick else (args.seeds, args.instances)
    result = run(seeds, per_seed)
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
