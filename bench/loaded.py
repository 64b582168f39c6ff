"""A cluster brought to ~99% allocation by churn (arrivals and departures), for planner timings.

Jobs of the calibrated mix that fit the fleet's domains arrive at 1.3x the cluster's capacity and
leave after an exponential time, placed by tidal's planner (an arrival that does not fit is
turned away); after `arrivals` jobs, single-group 4- and 8-GPU jobs top the cluster up to the
target. So the free GPUs left are scattered as churn leaves them, not packed by a fresh fill.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from tidal.placement import GangRequest, PlacementPlan, apply_plan, plan_gang, release_plan
from tidal.placement.leftover import ArrivalHistory, GroupDemand
from tidal.placement.workload_mix import TRAINING_MIX, JobShape
from tidal.topology import SHAPES, ClusterSnapshot, fleet_for_gpus, snapshot_from_fleet


@dataclass
class LoadedCluster:
    snapshot: ClusterSnapshot
    running: dict[str, PlacementPlan]
    demand: GroupDemand
    mix: tuple[JobShape, ...]
    accelerator: str
    shapes: dict[str, JobShape]
    """The mix shape of every running job, by name."""

    def request(self, name: str, shape: JobShape, priority: int = 0) -> GangRequest:
        return GangRequest(name, shape.groups, shape.group_gpus, shape.gpus_per_pod, self.accelerator, priority)


def mix_for(shape: str, cluster_gpus: int) -> tuple[JobShape, ...]:
    domain = SHAPES[shape].gpus
    return tuple(s for s in TRAINING_MIX if s.group_gpus <= domain and s.gpus <= cluster_gpus // 8)


def churned_cluster(shape: str, gpus: int, seed: int, target: float = 0.99, arrivals: int = 4000) -> LoadedCluster:
    rng = random.Random(seed)
    snapshot = snapshot_from_fleet(fleet_for_gpus(shape, gpus))
    accelerator = SHAPES[shape].accelerator
    total = snapshot.total_gpus()
    mix = mix_for(shape, total)
    weights = [s.weight for s in mix]
    mean_gpus = sum(s.gpus * w for s, w in zip(mix, weights, strict=True)) / sum(weights)
    mean_duration = 4 * 3600.0
    rate = 1.3 * total / (mean_gpus * mean_duration)
    arrived = ArrivalHistory()  # the operator's ageing of arrivals' group sizes
    demand = arrived.history
    loaded = LoadedCluster(snapshot, {}, demand, mix, accelerator, {})
    departures: list[tuple[float, str]] = []
    now = 0.0
    for i in range(arrivals):
        now += rng.expovariate(rate)
        while departures and departures[0][0] <= now:
            _, name = heapq.heappop(departures)
            gone = loaded.running.pop(name)
            release_plan(snapshot, gone)
            snapshot.add_residents(gone.supernodes, -1)
            del loaded.shapes[name]
        shape_i = rng.choices(mix, weights)[0]
        arrived.arrive(i, accelerator, shape_i.group_gpus)
        plan = plan_gang(snapshot, loaded.request(f"job-{i}", shape_i), demand)
        if isinstance(plan, PlacementPlan):
            apply_plan(snapshot, plan)
            snapshot.add_residents(plan.supernodes)
            loaded.running[plan.request.name] = plan
            loaded.shapes[plan.request.name] = shape_i
            heapq.heappush(departures, (now + rng.expovariate(1 / mean_duration), plan.request.name))
    fillers = [s for s in mix if s.gpus <= 8]
    misses = 0
    while snapshot.allocated_gpus() < target * total and misses < 50:
        filler = rng.choice(fillers)
        plan = plan_gang(snapshot, loaded.request(f"fill-{len(loaded.running)}", filler), demand)
        if isinstance(plan, PlacementPlan):
            apply_plan(snapshot, plan)
            snapshot.add_residents(plan.supernodes)
            loaded.running[plan.request.name] = plan
            loaded.shapes[plan.request.name] = filler
        else:
            misses += 1
    return loaded
