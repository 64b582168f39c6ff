"""Preemption inside a namespace's quota: GPUs evicted by tidal's cover against Kueue's order.

    python -m bench.quota_eviction [--json] [--seeds 1 2 3] [--instances 400] [--quick]

Each instance is a namespace of 3-40 running preemptible jobs (1-8 DP replicas of 4-64 GPUs,
priorities 0-5, half of the multi-replica ones elastic down to one replica) and a shortfall of
quota between 1 GPU and half of what they hold. Planned by:

- tidal: `plan_quota_eviction` (the fewest GPUs that cover, then the fewest victims, then the
  lowest priorities; elastic jobs may give back top replicas);
- kueue_order: the baseline a Kueue user gets from `withinClusterQueue: LowerPriority` with
  the job's quota as its ClusterQueue: whole workloads, lowest priority first (then the largest,
  as Kueue does not shrink), until the quota fits, then each one given back if the rest still
  fits (Kueue's candidate minimisation), measured in the same run on the same instances.

Reported per seed and in all: GPUs evicted by each, instances where tidal evicts fewer, more or
the same, the worst ratio kueue_order/tidal, victims, and the slowest tidal call. Plus the exact
planner's cost at 500 candidates for shortfalls of 64 to 8,192 GPUs (where it hands over to its
greedy, `EXACT_MAX_WORK`).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from tidal.placement.preemption import Eviction, RunningGang
from tidal.placement.quota_eviction import plan_quota_eviction


def namespace(rng: random.Random, jobs: int) -> list[RunningGang]:
    out = []
    for i in range(jobs):
        n = rng.randint(1, 8)
        size = rng.choice([4, 8, 8, 16, 32, 64])
        replicas = tuple(((f"j{i}-r{r}", size),) for r in range(n))
        elastic = n > 1 and rng.random() < 0.5
        out.append(RunningGang(f"j{i:03d}", rng.randint(0, 5), True, replicas, 1 if elastic else None))
    return out


def kueue_order(candidates: list[RunningGang], shortfall: int) -> tuple[Eviction, ...] | None:
    """Whole workloads, lowest priority first (largest at equal priority), until covered; then
    each given back, in the order taken, if the others still cover."""
    taken, total = [], 0
    for gang in sorted(candidates, key=lambda g: (g.priority, -g.gpus, g.name)):
        if total >= shortfall:
            break
        taken.append(gang)
        total += gang.gpus
    if total < shortfall:
        return None
    kept = []
    for gang in taken:
        if total - gang.gpus >= shortfall:
            total -= gang.gpus
        else:
            kept.append(gang)
    return tuple(Eviction(g.name, tuple(range(len(g.replicas))), True, g.gpus) for g in kept)


def run(seeds: list[int], instances: int) -> dict:
    rows = []
    for seed in seeds:
        rng = random.Random(seed)
        tidal_gpus = kueue_gpus = fewer = more = same = 0
        tidal_victims = kueue_victims = 0
        worst, slowest = 1.0, 0.0
        for _ in range(instances):
            gangs = namespace(rng, rng.randint(3, 40))
            shortfall = rng.randint(1, max(1, sum(g.gpus for g in gangs) // 2))
            started = time.perf_counter()
            ours = plan_quota_eviction(gangs, shortfall)
            slowest = max(slowest, time.perf_counter() - started)
            theirs = kueue_order(gangs, shortfall)
            assert ours is not None and theirs is not None
            a, b = sum(e.gpus for e in ours), sum(e.gpus for e in theirs)
            assert a >= shortfall and b >= shortfall
            tidal_gpus, kueue_gpus = tidal_gpus + a, kueue_gpus + b
            tidal_victims, kueue_victims = tidal_victims + len(ours), kueue_victims + len(theirs)
            fewer, more, same = fewer + (a < b), more + (a > b), same + (a == b)
            worst = max(worst, b / a)
        rows.append(
            {
                "seed": seed,
                "instances": instances,
                "gpus_tidal": tidal_gpus,
                "gpus_kueue_order": kueue_gpus,
                "ratio": round(kueue_gpus / tidal_gpus, 3),
                "tidal_fewer": fewer,
                "tidal_more": more,
                "same": same,
                "worst_ratio": round(worst, 2),
                "victims_tidal": tidal_victims,
                "victims_kueue_order": kueue_victims,
                "slowest_ms": round(slowest * 1000, 1),
            }
        )
    return {"seeds": rows, "cost": cost()}


def cost(candidates: int = 500) -> list[dict]:
    rng = random.Random(1)
    gangs = namespace(rng, candidates)
    out = []
    for shortfall in (64, 512, 2048, 8192):
        started = time.perf_counter()
        plan = plan_quota_eviction(gangs, shortfall)
        elapsed = time.perf_counter() - started
        assert plan is not None
        out.append(
            {
                "candidates": candidates,
                "shortfall": shortfall,
                "ms": round(elapsed * 1000, 1),
                "gpus": sum(e.gpus for e in plan),
                "victims": len(plan),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--instances", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="one seed, 50 instances")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run([args.seeds[0]], 50) if args.quick else run(args.seeds, args.instances)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{'seed':>4} {'GPUs tidal':>10} {'GPUs kueue':>10} {'ratio':>6} {'fewer':>5} {'more':>4} {'same':>4}"
        f" {'worst':>5} {'victims t/k':>11} {'slowest ms':>10}"
    )
    for r in result["seeds"]:
        print(
            f"{r['seed']:>4} {r['gpus_tidal']:>10} {r['gpus_kueue_order']:>10} {r['ratio']:>6} {r['tidal_fewer']:>5}"
            f" {r['tidal_more']:>4} {r['same']:>4} {r['worst_ratio']:>5}"
            f" {r['victims_tidal']:>5}/{r['victims_kueue_order']:<5} {r['slowest_ms']:>10}"
        )
    print("\nexact cover's cost (500 candidates; past EXACT_MAX_WORK the greedy plans):")
    for c in result["cost"]:
        print(f"  shortfall {c['shortfall']:>5}: {c['ms']:>7} ms, {c['gpus']} GPUs, {c['victims']} victims")


if __name__ == "__main__":
    main()
