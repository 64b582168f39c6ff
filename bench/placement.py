"""Placement benchmark: quality under churn, preemption optimality, and speed at 100,000 GPUs.

    python -m bench.placement [--json] [--repeats N] [--seed S] [--quick]

Sections (each also runnable alone):
- churn (`bench.churn`): arrivals and departures near full, several seeds, tidal against
  constrained first-fit (groups inside one supernode, supernodes in name order: Kueue TAS
  required slices, Slurm's block plugin) and topology-unaware first-fit;
- preemption optimality against brute force on small random instances (`bench.preemption`), and
  against an exact MILP among many small victims (`bench.preemption_small`: every gang on one node,
  15-200 candidates);
- plan_capacity with a binding disruption budget at 100,000 GPUs of ~2,300-4,700 small gangs
  (`bench.capacity_budget`);
- planner timings at 100,000 GPUs ~99% allocated by churn (`bench.loaded`) on NVL72,
  CloudMatrix384-like and HGX-8 fleets; the slowest shape's p50 is reported;
- the original 16,384-GPU gang on a 50%-loaded NVL72 snapshot and the FIFO fill run.

Baseline: gang-aware, topology-unaware first-fit (plan_first_fit), measured in the same run on
the same snapshots. The fill run places jobs of the calibrated mix in arrival order until the
first one that does not fit (a strict-FIFO gang queue blocks there). Fill ratios count GPUs of
gangs whose every HBD group is whole; a group split across racks would run tensor parallelism
over the scale-out network, so its GPUs are not useful. The baseline's raw ratio (split gangs
included) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

from tidal.placement import GangRequest, PlacementPlan, apply_plan, plan_first_fit, plan_gang, split_groups
from tidal.placement.workload_mix import TRAINING_MIX, sample_shapes
from tidal.sim.run import percentile
from tidal.topology import ClusterSnapshot, fleet_for_gpus, snapshot_from_fleet

Planner = Callable[[ClusterSnapshot, GangRequest], object]


def big_gang() -> GangRequest:
    # tp=8, ep=8, pp=4, dp=64, gpusPerPod=4: 256 groups of 64 GPUs.
    return GangRequest("big", groups=4 * 64, group_gpus=8 * 8, gpus_per_pod=4, priority=10)


def background(snapshot: ClusterSnapshot, rng: random.Random, target: float) -> int:
    """Place mixed jobs with tidal's planner until `target` of the GPUs are allocated."""
    total = snapshot.total_gpus()
    placed = 0
    small_mix = tuple(s for s in TRAINING_MIX if s.gpus <= 1024)
    while snapshot.allocated_gpus() < target * total:
        shape = sample_shapes(rng, 1, small_mix)[0]
        plan = plan_gang(snapshot, GangRequest(f"bg-{placed}", shape.groups, shape.group_gpus, shape.gpus_per_pod))
        if isinstance(plan, PlacementPlan):
            apply_plan(snapshot, plan)
            placed += 1
    return placed


def time_planner(planner: Planner, snapshot: ClusterSnapshot, request: GangRequest, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        planner(snapshot, request)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def fill(planner: Planner, snapshot: ClusterSnapshot, seed: int) -> tuple[int, int, int, int]:
    """Place jobs from the mix in arrival order until the first one that does not fit.

    A gang queue in strict FIFO order (no backfill) blocks there, so the ratio reached is what
    fragmentation leaves usable. Returns (useful GPUs, raw allocated GPUs, split groups, jobs).
    """
    rng = random.Random(seed)
    useful = raw = splits = jobs = 0
    while True:
        shape = sample_shapes(rng, 1)[0]
        request = GangRequest(f"fill-{jobs}", shape.groups, shape.group_gpus, shape.gpus_per_pod)
        plan = planner(snapshot, request)
        if not isinstance(plan, PlacementPlan):
            return useful, raw, splits, jobs
        jobs += 1
        split = split_groups(snapshot, plan)
        apply_plan(snapshot, plan)
        raw += request.total_gpus
        splits += split
        if split == 0:
            useful += request.total_gpus


def run(repeats: int, seed: int, cluster_gpus: int = 100_000, load: float = 0.5) -> dict[str, object]:
    snapshot = snapshot_from_fleet(fleet_for_gpus("nvl72", cluster_gpus))
    background(snapshot, random.Random(seed), load)
    request = big_gang()
    plan = plan_gang(snapshot, request)
    baseline_plan = plan_first_fit(snapshot, request)
    assert isinstance(plan, PlacementPlan) and isinstance(baseline_plan, PlacementPlan)
    tidal_ms = time_planner(plan_gang, snapshot, request, repeats)
    baseline_ms = time_planner(plan_first_fit, snapshot, request, repeats)

    fill_total = snapshot.total_gpus()

    def empty() -> ClusterSnapshot:
        return snapshot_from_fleet(fleet_for_gpus("nvl72", cluster_gpus))

    useful, raw, fill_splits, fill_jobs = fill(plan_gang, empty(), seed)
    b_useful, b_raw, b_splits, b_jobs = fill(plan_first_fit, empty(), seed)
    return {
        "cluster_gpus": snapshot.total_gpus(),
        "background_load": round(snapshot.allocated_gpus() / snapshot.total_gpus(), 3),
        "gang_gpus": request.total_gpus,
        "repeats": repeats,
        "median_ms": round(statistics.median(tidal_ms), 3),
        "p99_ms": round(percentile(tidal_ms, 0.99), 3),
        "hbd_split_groups": split_groups(snapshot, plan),
        "gang_supernodes": len(plan.supernodes),
        "gang_blocks": len({snapshot.supernodes[s].block for s in plan.supernodes}),
        "baseline_median_ms": round(statistics.median(baseline_ms), 3),
        "baseline_p99_ms": round(percentile(baseline_ms, 0.99), 3),
        "baseline_hbd_split_groups": split_groups(snapshot, baseline_plan),
        "baseline_gang_blocks": len({snapshot.supernodes[g.supernode].block for g in baseline_plan.groups}),
        "fill_allocation_ratio": round(useful / fill_total, 4),
        "fill_raw_allocation_ratio": round(raw / fill_total, 4),
        "fill_hbd_split_groups": fill_splits,
        "fill_jobs": fill_jobs,
        "baseline_fill_allocation_ratio": round(b_useful / fill_total, 4),
        "baseline_fill_raw_allocation_ratio": round(b_raw / fill_total, 4),
        "baseline_fill_hbd_split_groups": b_splits,
        "baseline_fill_jobs": b_jobs,
        "fill_ratio_vs_baseline": round(useful / max(b_useful, 1), 3),
        "seed": seed,
    }


def timings_100k(seed: int, gpus: int = 100_000, samples: int = 200) -> dict[str, object]:
    """plan_gang p50 per fleet shape on a churned ~99% allocated cluster, with constrained first-fit's."""
    from bench.loaded import churned_cluster
    from tidal.placement import plan_constrained_first_fit

    out: dict[str, object] = {}
    slowest = 0.0
    for shape in ("nvl72", "cm384", "hgx8"):
        loaded = churned_cluster(shape, gpus, seed)
        rng = random.Random(seed)
        requests = [loaded.request(f"probe-{i}", s) for i, s in enumerate(sample_shapes(rng, samples, loaded.mix))]
        tidal_ms, baseline_ms = [], []
        for request in requests:
            start = time.perf_counter()
            plan_gang(loaded.snapshot, request, loaded.demand)
            tidal_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            plan_constrained_first_fit(loaded.snapshot, request)
            baseline_ms.append((time.perf_counter() - start) * 1000)
        p50 = statistics.median(tidal_ms)
        slowest = max(slowest, p50)
        snap = loaded.snapshot
        out[f"plan_gang_{shape}"] = {
            "gpus": snap.total_gpus(),
            "nodes": len(snap.nodes),
            "allocated": round(snap.allocated_gpus() / snap.total_gpus(), 4),
            "p50_ms": round(p50, 3),
            "p99_ms": round(percentile(tidal_ms, 0.99), 3),
            "constrained_first_fit_p50_ms": round(statistics.median(baseline_ms), 3),
        }
    out["plan_gang_p50_ms_100k"] = round(slowest, 3)
    return out


def run_all(repeats: int, seed: int, quick: bool) -> dict[str, object]:
    from bench import capacity_budget, churn, preemption, preemption_small

    result: dict[str, object] = {}
    if quick:
        result.update(churn.run([1], 2_592, 600, 1.2))
        result.update(preemption.optimality(instances=40, seed=seed))
        result.update(preemption_small.run(20, seed))
        result.update(capacity_budget.run(gpus=10_000, repeats=1, seed=seed))
        result.update(timings_100k(seed, gpus=10_000, samples=20))
        result.update(run(max(repeats // 10, 2), seed, cluster_gpus=40_000))
        return result
    result.update(churn.run([1, 2, 3, 4, 5], 10_368, 16_000, 1.2))
    result.update(preemption.optimality(instances=500, seed=seed))
    result.update(preemption_small.run(200, seed))
    result.update(capacity_budget.run(seed=seed))
    result.update(timings_100k(seed))
    preempt = preemption.timings_100k(seed)
    result.update(preempt)
    result.update(run(repeats, seed))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a CI-sized smoke of every section")
    args = parser.parse_args()
    result = run_all(args.repeats, args.seed, args.quick)
    if args.json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
