"""Preemption benchmark: optimality against brute force, and speed at 100,000 GPUs.

    python -m bench.preemption [--json] [--quick] [--instances N] [--repeats N] [--seed S]

Optimality: small random clusters (a few supernodes of a few 4- or 8-GPU nodes, some cordoned
or spare), random running gangs (multi-pod-per-node, elastic ones with random minDP, random
priorities and preemptible flags, plus non-preemptible background), and a request that does not
fit now but fits with evictions. Brute force enumerates every combination of options (nothing,
shrink by the top 1..K replicas, suspend whole) and counts room node by node. Reported: how
often plan_preemption evicts the minimum number of GPUs, the worst and mean excess, victims.
Baseline: the greedy planner this module replaced (a copy is kept here), on the same instances.

Speed: 100,000-GPU NVL72, CM384-like and HGX-8 fleets ~99% allocated by gangs of the calibrated
mix (tidal.placement.workload_mix), mixed priorities, most preemptible, some elastic; a
16,384-GPU gang and a 1,024-replica pool request through plan_preemption, and the pool request
through plan_capacity with a disruption budget small enough to bind (also with every gang made
rigid, so that the suspension tiers decide rather than the shrink stage). The old planner is timed
once on the same snapshots (`--no-baseline` skips it: it takes seconds to minutes per call).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from tidal.placement import (
    Eviction,
    GangRequest,
    PlacementPlan,
    PreemptionPlan,
    RunningGang,
    Unplaceable,
    apply_plan,
    plan_gang,
    plan_preemption,
)
from tidal.placement.workload_mix import TRAINING_MIX, JobShape, sample_shapes
from tidal.rebalance import CapacityPlan, plan_capacity
from tidal.topology import ClusterSnapshot, fleet_for_gpus, snapshot_from_fleet
from tidal.topology.fleet import SHAPES
from tidal.topology.snapshot import NodeState, SupernodeState

# -- brute force ----------------------------------------------------------------------------------


def options(gang: RunningGang) -> list[tuple[int, dict[str, int], bool]]:
    """Every option for one gang: (GPUs evicted, GPUs released per node, counts as a victim)."""
    n = len(gang.replicas)
    firsts: list[int] = []
    if gang.min_replicas is not None:
        firsts += [n - k for k in range(1, n - min(gang.min_replicas, n) + 1)]  # give back the top k
    firsts.append(0)  # suspend whole
    out: list[tuple[int, dict[str, int], bool]] = [(0, {}, False)]
    for first in sorted(set(firsts), reverse=True):
        released: dict[str, int] = defaultdict(int)
        gpus = 0
        for replica in gang.replicas[first:]:
            for node, g in replica:
                released[node] += g
                gpus += g
        out.append((gpus, dict(released), True))
    return out


def groups_with(snapshot: ClusterSnapshot, request: GangRequest, released: dict[str, int]) -> int:
    """Groups of the request that fit once `released` is given back, counted node by node."""
    total = 0
    for sn in snapshot.supernodes.values():
        if sn.accelerator != request.accelerator:
            continue
        pods = 0
        for name in sn.nodes:
            node = snapshot.nodes[name]
            if not node.ready or node.cordoned or (node.spare and not request.recovery):
                continue
            held = max(node.allocated - released.get(name, 0), 0)
            pods += max(node.gpus - held, 0) // request.gpus_per_pod
        total += pods // request.pods_per_group
    return total


def brute_force(snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang]) -> tuple[int, int] | None:
    """(fewest GPUs evicted, fewest victims at that many GPUs) over every combination; None if none fits."""
    eligible = [g for g in running if g.preemptible and g.priority < request.priority and g.replicas]
    best: tuple[int, int] | None = None
    for combo in itertools.product(*(options(g) for g in eligible)):
        gpus = sum(o[0] for o in combo)
        victims = sum(o[2] for o in combo)
        if best is not None and (gpus, victims) >= best:
            continue
        released: dict[str, int] = defaultdict(int)
        for _, rel, _ in combo:
            for node, g in rel.items():
                released[node] += g
        if groups_with(snapshot, request, released) >= request.groups:
            best = (gpus, victims)
    return best


# -- small random instances -------------------------------------------------------------------------


def random_instance(rng: random.Random) -> tuple[ClusterSnapshot, GangRequest, list[RunningGang]]:
    """A few supernodes of a few nodes, running gangs of several kinds, and a request."""
    snapshot = ClusterSnapshot()
    names: list[str] = []
    for s in range(rng.randint(1, 4)):
        sn = f"s{s}"
        node_gpus = rng.choice([4, 8])
        members = [f"{sn}-n{i}" for i in range(rng.randint(2, 5))]
        snapshot.add_supernode(SupernodeState(sn, "nvidia.com/gpu", list(members), block=f"b{s // 2}"))
        for name in members:
            roll = rng.random()
            snapshot.add_node(
                NodeState(name, sn, node_gpus, cordoned=roll < 0.05, spare=0.05 <= roll < 0.1, ready=roll < 0.97)
            )
        names += members
    running: list[RunningGang] = []
    for g in range(rng.randint(2, 7)):
        pod = rng.choice([2, 4, 4])
        replicas = rng.randint(1, 3)
        per_replica = rng.randint(1, 3)
        # Concentrated on one supernode or scattered over the cluster.
        home = rng.choice(list(snapshot.supernodes))
        pool = list(snapshot.supernodes[home].nodes) if rng.random() < 0.6 else list(names)
        allocations: list[tuple[tuple[str, int], ...]] = []
        for _ in range(replicas):
            pods = []
            for _ in range(per_replica):
                fits = [n for n in pool if snapshot.nodes[n].gpus - snapshot.nodes[n].allocated >= pod]
                if not fits:
                    break
                node = rng.choice(fits)
                snapshot.update_node(node, allocated=snapshot.nodes[node].allocated + pod)
                pods.append((node, pod))  # one entry per pod, as the operator passes them
            if pods:
                allocations.append(tuple(pods))
        if not allocations:
            continue
        elastic = len(allocations) > 1 and rng.random() < 0.5
        running.append(
            RunningGang(
                f"g{g}",
                priority=rng.randint(0, 3),
                preemptible=rng.random() < 0.8,
                replicas=tuple(allocations),
                min_replicas=rng.randint(0, len(allocations) - 1) if elastic else None,
            )
        )
    gpp = rng.choice([2, 4, 4])
    request = GangRequest(
        "req",
        groups=rng.randint(1, 3),
        group_gpus=gpp * rng.randint(1, 4),
        gpus_per_pod=gpp,
        priority=rng.randint(2, 4),
        recovery=rng.random() < 0.15,
    )
    return snapshot, request, running


@dataclass
class Tally:
    instances: int = 0
    at_minimum: int = 0
    worst_ratio: float = 1.0
    excess: int = 0
    victims: int = 0
    victims_min: int = 0
    misses: int = 0
    """Instances where the planner found nothing although brute force did."""

    def add(self, evicted: int | None, victims: int, minimum: tuple[int, int]) -> None:
        self.instances += 1
        self.victims_min += minimum[1]
        if evicted is None:
            self.misses += 1
            self.worst_ratio = float("inf")
            return
        self.at_minimum += evicted == minimum[0]
        self.worst_ratio = max(self.worst_ratio, evicted / minimum[0])
        self.excess += evicted - minimum[0]
        self.victims += victims

    def figures(self, prefix: str) -> dict[str, float]:
        n = max(self.instances, 1)
        return {
            f"{prefix}_instances": self.instances,
            f"{prefix}_at_minimum_share": round(self.at_minimum / n, 4),
            f"{prefix}_worst_excess_ratio": round(self.worst_ratio, 3),
            f"{prefix}_mean_excess_gpus": round(self.excess / n, 3),
            f"{prefix}_mean_victims": round(self.victims / n, 3),
            f"{prefix}_mean_victims_min": round(self.victims_min / n, 3),
            f"{prefix}_misses": self.misses,
        }


def optimality(instances: int = 500, seed: int = 7) -> dict:
    """plan_preemption (and the old greedy) against brute force on `instances` instances that need evictions."""
    rng = random.Random(seed)
    new, old = Tally(), Tally()
    infeasible = unsafe = 0
    errors: dict[str, int] = {"preemption": 0, "legacy_preemption": 0}
    while new.instances < instances:
        snapshot, request, running = random_instance(rng)
        if not isinstance(plan_gang(snapshot, request), Unplaceable):
            continue  # fits without evictions: nothing to compare
        minimum = brute_force(snapshot, request, running)
        result = _guarded(plan_preemption, snapshot, request, running, errors, "preemption")
        legacy = _guarded(legacy_plan_preemption, snapshot, request, running, errors, "legacy_preemption")
        if result is _ERROR or legacy is _ERROR:
            continue  # counted in errors; not an answer to compare
        if minimum is None:
            infeasible += 1
            unsafe += isinstance(result, PreemptionPlan)
            continue
        if isinstance(result, PreemptionPlan):
            new.add(result.evicted_gpus, len(result.evictions), minimum)
        else:
            new.add(None, 0, minimum)
        if isinstance(legacy, PreemptionPlan):
            old.add(legacy.evicted_gpus, len(legacy.evictions), minimum)
        else:
            old.add(None, 0, minimum)
    return {
        **new.figures("preemption"),
        **old.figures("legacy_preemption"),
        "preemption_errors": errors["preemption"],
        "legacy_preemption_errors": errors["legacy_preemption"],
        "preemption_infeasible_instances": infeasible,
        "preemption_infeasible_but_evicted": unsafe,
        "optimality_seed": seed,
    }


_ERROR = object()


def _guarded(
    planner: Callable[[ClusterSnapshot, GangRequest, list[RunningGang]], object],
    snapshot: ClusterSnapshot,
    request: GangRequest,
    running: list[RunningGang],
    errors: dict[str, int],
    key: str,
) -> object:
    """The planner's answer, or _ERROR (counted) if it raised: a plan_gang bug must not end the run."""
    try:
        return planner(snapshot, request, running)
    except Exception:
        errors[key] += 1
        return _ERROR


# -- loaded clusters at scale -----------------------------------------------------------------------

ACCELERATOR = {name: shape.accelerator for name, shape in SHAPES.items()}


def loaded_cluster(
    shape: str, gpus: int, load: float, seed: int, mix: tuple[JobShape, ...] = TRAINING_MIX
) -> tuple[ClusterSnapshot, list[RunningGang]]:
    """A `shape` fleet of at least `gpus` accelerators filled to `load` by gangs of the calibrated mix.

    Gangs are placed by plan_gang in arrival order (larger shapes give way to smaller ones as the
    cluster fills); ~85% preemptible, priorities 0..4, a third of the multi-replica ones elastic
    with minDP = half their DP. Allocations are listed one entry per pod, as the operator does.
    On 8-GPU nodes some gangs use 8-GPU pods and some 4-GPU pods (two pods of a gang may share a node).
    """
    rng = random.Random(seed)
    snapshot = snapshot_from_fleet(fleet_for_gpus(shape, gpus))
    accelerator = ACCELERATOR[shape]
    node_gpus = SHAPES[shape].gpus_per_node
    total = snapshot.total_gpus()
    running: list[RunningGang] = []
    failures = 0
    while snapshot.allocated_gpus() < load * total:
        job = sample_shapes(rng, 1, mix)[0]
        gpp = job.gpus_per_pod
        if node_gpus == 8 and job.group_gpus % 8 == 0 and rng.random() < 0.5:
            gpp = 8
        request = GangRequest(f"job{len(running)}", job.groups, job.group_gpus, gpp, accelerator=accelerator)
        plan = plan_gang(snapshot, request)
        if not isinstance(plan, PlacementPlan):
            failures += 1
            if failures > 20:  # the big shapes no longer fit: top up with smaller ones
                mix = tuple(s for s in mix if s.gpus < max(s.gpus for s in mix)) or mix
                failures = 0
                if len(mix) == 1 and not isinstance(plan_gang(snapshot, _smallest(mix, accelerator)), PlacementPlan):
                    break
            continue
        failures = 0
        apply_plan(snapshot, plan)
        running.append(_running(rng, job, plan))
    return snapshot, running


def churned_running(shape: str, gpus: int, seed: int) -> tuple[ClusterSnapshot, list[RunningGang]]:
    """The cluster `bench.loaded.churned_cluster` leaves at ~99% (arrivals and departures, so the
    free GPUs are scattered as churn leaves them), its jobs given priorities and flags as above."""
    from bench.loaded import churned_cluster

    loaded = churned_cluster(shape, gpus, seed)
    rng = random.Random(seed)
    running = [_running(rng, loaded.shapes[name], plan) for name, plan in sorted(loaded.running.items())]
    return loaded.snapshot, running


def _smallest(mix: tuple[JobShape, ...], accelerator: str) -> GangRequest:
    job = min(mix, key=lambda s: s.gpus)
    return GangRequest("probe", job.groups, job.group_gpus, job.gpus_per_pod, accelerator=accelerator)


def _running(rng: random.Random, job: JobShape, plan: PlacementPlan) -> RunningGang:
    dp = job.dp
    per_replica = len(plan.groups) // dp
    gpp = plan.request.gpus_per_pod
    replicas = tuple(
        tuple((node, gpp) for g in plan.groups[r * per_replica : (r + 1) * per_replica] for node in g.nodes)
        for r in range(dp)
    )
    elastic = dp > 1 and rng.random() < 0.33
    return RunningGang(
        plan.request.name,
        priority=rng.randint(0, 4),
        preemptible=rng.random() < 0.85,
        replicas=replicas,
        min_replicas=max(1, dp // 2) if elastic else None,
    )


def requests_for(shape: str, gpus: int) -> tuple[GangRequest, GangRequest]:
    """The 16,384-GPU gang and the 1,024-replica pool request on a 100,000-GPU fleet (scaled with `gpus`)."""
    scale = gpus / 100_000
    accelerator = ACCELERATOR[shape]
    gang_gpus = max(int(16_384 * scale), 512)
    replicas = max(int(1024 * scale), 16)
    if shape == "nvl72":  # tp=4 x ep=16 groups of 64 GPUs, 4 GPUs per pod: one group per rack
        gang = GangRequest("gang", gang_gpus // 64, 64, 4, accelerator=accelerator, priority=10)
        pool = GangRequest("pool", replicas, 8, 4, accelerator=accelerator, priority=1000)
    elif shape == "cm384":  # groups of 128 NPUs, 8 per pod: three per domain
        gang = GangRequest("gang", gang_gpus // 128, 128, 8, accelerator=accelerator, priority=10)
        pool = GangRequest("pool", replicas, 4, 4, accelerator=accelerator, priority=1000)
    else:  # HGX: a group is one 8-GPU server
        gang = GangRequest("gang", gang_gpus // 8, 8, 8, accelerator=accelerator, priority=10)
        pool = GangRequest("pool", replicas, 8, 8, accelerator=accelerator, priority=1000)
    return gang, pool


def _timed(fn: Callable[[], object], repeats: int) -> tuple[list[float], list[float], object]:
    """Wall-clock and CPU milliseconds per call (CPU time shows the work when the machine is shared)."""
    wall, cpu = [], []
    result: object = None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return wall, cpu, result


def _summary(result: object) -> tuple[int, int]:
    if isinstance(result, PreemptionPlan):
        return result.evicted_gpus, len(result.evictions)
    return -1, -1


def timings_100k(
    seed: int = 7,
    repeats: int = 5,
    gpus: int = 100_000,
    shapes: tuple[str, ...] = ("nvl72", "cm384", "hgx8"),
    baseline: bool = True,
    churned: bool = True,
) -> dict:
    """p50s of plan_preemption (gang, pool) and plan_capacity (pool, binding budget) per shape."""
    out: dict[str, float | int | str] = {"cluster_gpus_target": gpus, "timing_repeats": repeats, "timing_seed": seed}
    worst = {"preempt": 0.0, "preempt_cpu": 0.0, "capacity": 0.0, "capacity_cpu": 0.0}
    for shape in shapes:
        snapshot, running = churned_running(shape, gpus, seed) if churned else loaded_cluster(shape, gpus, 0.99, seed)
        before = {n: v.allocated for n, v in snapshot.nodes.items()}
        out[f"{shape}_cluster_gpus"] = snapshot.total_gpus()
        out[f"{shape}_load"] = round(snapshot.allocated_gpus() / snapshot.total_gpus(), 4)
        out[f"{shape}_running_gangs"] = len(running)
        gang, pool = requests_for(shape, gpus)
        budget = pool.total_gpus // 4
        for label, request in (("gang", gang), ("pool", pool)):
            wall, cpu, result = _timed(lambda s=snapshot, r=request, g=running: plan_preemption(s, r, g), repeats)
            evicted, victims = _summary(result)
            out[f"{shape}_{label}_p50_ms"] = round(statistics.median(wall), 1)
            out[f"{shape}_{label}_cpu_p50_ms"] = round(statistics.median(cpu), 1)
            out[f"{shape}_{label}_evicted_gpus"] = evicted
            out[f"{shape}_{label}_victims"] = victims
            out[f"{shape}_{label}_request_gpus"] = request.total_gpus
            worst["preempt"] = max(worst["preempt"], statistics.median(wall))
            worst["preempt_cpu"] = max(worst["preempt_cpu"], statistics.median(cpu))
            if baseline:
                wall, _, result = _timed(lambda s=snapshot, r=request, g=running: legacy_plan_preemption(s, r, g), 1)
                evicted, victims = _summary(result)
                out[f"{shape}_{label}_legacy_ms"] = round(wall[0], 1)
                out[f"{shape}_{label}_legacy_evicted_gpus"] = evicted
                out[f"{shape}_{label}_legacy_victims"] = victims
        wall, cpu, result = _timed(lambda s=snapshot, r=pool, g=running, b=budget: plan_capacity(s, r, g, b), repeats)
        assert isinstance(result, CapacityPlan)
        out[f"{shape}_capacity_p50_ms"] = round(statistics.median(wall), 1)
        out[f"{shape}_capacity_cpu_p50_ms"] = round(statistics.median(cpu), 1)
        out[f"{shape}_capacity_budget_gpus"] = budget
        out[f"{shape}_capacity_replicas"] = result.replicas
        out[f"{shape}_capacity_evicted_gpus"] = result.evicted_gpus
        out[f"{shape}_capacity_reason"] = result.reason
        worst["capacity"] = max(worst["capacity"], statistics.median(wall))
        worst["capacity_cpu"] = max(worst["capacity_cpu"], statistics.median(cpu))
        # The same with no elastic training: no shrink stage helps, the suspension tiers decide.
        rigid = [replace(g, min_replicas=None) for g in running]
        wall, cpu, result = _timed(lambda s=snapshot, r=pool, g=rigid, b=budget: plan_capacity(s, r, g, b), repeats)
        assert isinstance(result, CapacityPlan)
        out[f"{shape}_capacity_rigid_p50_ms"] = round(statistics.median(wall), 1)
        out[f"{shape}_capacity_rigid_cpu_p50_ms"] = round(statistics.median(cpu), 1)
        out[f"{shape}_capacity_rigid_replicas"] = result.replicas
        out[f"{shape}_capacity_rigid_evicted_gpus"] = result.evicted_gpus
        out[f"{shape}_capacity_rigid_reason"] = result.reason
        worst["capacity"] = max(worst["capacity"], statistics.median(wall))
        worst["capacity_cpu"] = max(worst["capacity_cpu"], statistics.median(cpu))
        assert before == {n: v.allocated for n, v in snapshot.nodes.items()}, "a planner mutated the snapshot"
    out["plan_preemption_p50_ms_100k"] = round(worst["preempt"], 1)
    out["plan_preemption_cpu_p50_ms_100k"] = round(worst["preempt_cpu"], 1)
    out["plan_capacity_p50_ms_100k"] = round(worst["capacity"], 1)
    out["plan_capacity_cpu_p50_ms_100k"] = round(worst["capacity_cpu"], 1)
    return out


# -- the planner this module replaced, kept as the baseline -------------------------------------------


def legacy_plan_preemption(
    snapshot: ClusterSnapshot, request: GangRequest, running: list[RunningGang]
) -> PreemptionPlan | Unplaceable:
    """The greedy planner before issue 10: room per GPU with partial credit, uncapped, per-entry gains,
    ties to the smallest gangs, a full snapshot copy and scan per step; then a pruning pass."""
    direct = plan_gang(snapshot, request)
    if not isinstance(direct, Unplaceable):
        return PreemptionPlan((), direct)
    if direct.permanent:
        return direct
    eligible = [g for g in running if g.preemptible and g.priority < request.priority and g.replicas]
    if not eligible:
        return direct
    room = _LegacyRoom(snapshot.copy(), request)
    for gang in eligible:
        room.release(_LegacyMove(gang, tuple(range(len(gang.replicas))), True).allocation())
    if room.groups() < request.groups:
        return direct
    room = _LegacyRoom(snapshot.copy(), request)
    evicted: dict[str, set[int]] = defaultdict(set)
    whole: set[str] = set()
    chosen: list[_LegacyMove] = []
    while room.groups() < request.groups:
        best = max(
            _legacy_moves(eligible, evicted, whole),
            key=lambda m: (room.gain(m.allocation()) / max(m.gpus, 1), -m.gang.priority, -m.gpus, m.gang.name),
        )
        room.release(best.allocation())
        chosen.append(best)
        evicted[best.gang.name].update(best.replicas)
        if best.whole:
            whole.add(best.gang.name)
    chosen = _legacy_prune(room, chosen)
    plan = plan_gang(room.snapshot, request)
    assert isinstance(plan, PlacementPlan)
    return PreemptionPlan(_legacy_evictions(chosen), plan)


@dataclass
class _LegacyMove:
    gang: RunningGang
    replicas: tuple[int, ...]
    whole: bool

    def allocation(self) -> list[tuple[str, int]]:
        return [a for r in self.replicas for a in self.gang.replicas[r]]

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.allocation())


def _legacy_moves(eligible: list[RunningGang], evicted: dict[str, set[int]], whole: set[str]) -> list[_LegacyMove]:
    moves = []
    for gang in eligible:
        if gang.name in whole:
            continue
        remaining = tuple(r for r in range(len(gang.replicas)) if r not in evicted[gang.name])
        if gang.min_replicas is not None and len(remaining) > gang.min_replicas:
            moves.append(_LegacyMove(gang, (remaining[-1],), False))
        moves.append(_LegacyMove(gang, remaining, True))
    return moves


def _legacy_prune(room: _LegacyRoom, chosen: list[_LegacyMove]) -> list[_LegacyMove]:
    kept = list(chosen)
    for move in sorted(chosen, key=lambda m: (-m.gang.priority, -m.gpus)):
        if not move.whole and any(
            m is not move and m.gang.name == move.gang.name and not m.whole and m.replicas[0] < move.replicas[0]
            for m in kept
        ):
            continue
        room.take(move.allocation())
        if room.groups() >= room.request.groups:
            kept.remove(move)
        else:
            room.release(move.allocation())
    return kept


def _legacy_evictions(chosen: list[_LegacyMove]) -> tuple[Eviction, ...]:
    by_gang: dict[str, list[_LegacyMove]] = defaultdict(list)
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


class _LegacyRoom:
    def __init__(self, snapshot: ClusterSnapshot, request: GangRequest):
        self.snapshot = snapshot
        self.request = request
        self.matching = {name for name, sn in snapshot.supernodes.items() if sn.accelerator == request.accelerator}

    def _slots(self, supernode: str) -> int:
        return self.snapshot.pod_slots(supernode, self.request.gpus_per_pod, self.request.recovery)

    def groups(self) -> int:
        return sum(self._slots(s) // self.request.pods_per_group for s in self.matching)

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
            total += _legacy_potential(before + added, per_group) - _legacy_potential(before, per_group)
        return total

    def release(self, allocation: list[tuple[str, int]]) -> None:
        for name, gpus in allocation:
            self.snapshot.release(name, gpus)

    def take(self, allocation: list[tuple[str, int]]) -> None:
        for name, gpus in allocation:
            node = self.snapshot.nodes.get(name)
            if node is not None:
                self.snapshot.update_node(name, allocated=node.allocated + gpus)


def _legacy_potential(slots: int, per_group: int) -> float:
    return slots // per_group + 0.5 * (slots % per_group) / per_group


# -- main -------------------------------------------------------------------------------------------


def run(instances: int, repeats: int, seed: int, gpus: int, baseline: bool) -> dict:
    started = time.perf_counter()
    result = {**optimality(instances, seed)}
    result["optimality_seconds"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    result.update(timings_100k(seed, repeats, gpus=gpus, baseline=baseline))
    result["timing_seconds"] = round(time.perf_counter() - started, 1)
    return result


def _print_tables(result: dict) -> None:
    print("Optimality vs brute force")
    print(f"  {'':<22}{'tidal':>12}{'old greedy':>12}")
    for key, label in (
        ("instances", "instances"),
        ("at_minimum_share", "at minimum GPUs"),
        ("worst_excess_ratio", "worst evicted/min"),
        ("mean_excess_gpus", "mean excess GPUs"),
        ("mean_victims", "mean victims"),
        ("mean_victims_min", "brute-force victims"),
        ("misses", "missed (found none)"),
    ):
        print(f"  {label:<22}{result[f'preemption_{key}']:>12}{result[f'legacy_preemption_{key}']:>12}")
    print(
        f"  infeasible instances {result['preemption_infeasible_instances']}, evicted anyway "
        f"{result['preemption_infeasible_but_evicted']}; planner errors {result['preemption_errors']} "
        f"(old {result['legacy_preemption_errors']})"
    )
    print(f"\nSpeed at {result['cluster_gpus_target']:,} GPUs, ~99% allocated (p50 of {result['timing_repeats']})")
    header = f"  {'shape':<7}{'request':<9}{'wall ms':>9}{'cpu ms':>8}{'old ms':>9}{'ratio':>7}{'evicted':>9}{'old':>7}"
    print(header + f"{'victims':>9}{'old':>5}")
    shapes = [k.removesuffix("_cluster_gpus") for k in result if k.endswith("_cluster_gpus")]
    for shape in shapes:
        for label in ("gang", "pool"):
            ms = result[f"{shape}_{label}_p50_ms"]
            old = result.get(f"{shape}_{label}_legacy_ms")
            ratio = f"{old / ms:.0f}x" if old else "-"
            old_evicted = result.get(f"{shape}_{label}_legacy_evicted_gpus", "-")
            old_victims = result.get(f"{shape}_{label}_legacy_victims", "-")
            print(
                f"  {shape:<7}{label:<9}{ms:>9}{result[f'{shape}_{label}_cpu_p50_ms']:>8}{old or '-':>9}{ratio:>7}"
                f"{result[f'{shape}_{label}_evicted_gpus']:>9}{old_evicted:>7}"
                f"{result[f'{shape}_{label}_victims']:>9}{old_victims:>5}"
            )
        print(
            f"  {shape:<7}{'capacity':<9}{result[f'{shape}_capacity_p50_ms']:>9}"
            f"{result[f'{shape}_capacity_cpu_p50_ms']:>8}  budget {result[f'{shape}_capacity_budget_gpus']} GPUs: "
            f"{result[f'{shape}_capacity_replicas']} replicas, {result[f'{shape}_capacity_evicted_gpus']} GPUs evicted"
        )
        print(
            f"  {shape:<7}{'rigid':<9}{result[f'{shape}_capacity_rigid_p50_ms']:>9}"
            f"{result[f'{shape}_capacity_rigid_cpu_p50_ms']:>8}  the same with no elastic training: "
            f"{result[f'{shape}_capacity_rigid_replicas']} replicas ({result[f'{shape}_capacity_rigid_reason']})"
        )
    print(
        f"\nslowest shape, p50 wall (cpu): plan_preemption {result['plan_preemption_p50_ms_100k']} ms "
        f"({result['plan_preemption_cpu_p50_ms_100k']}), plan_capacity {result['plan_capacity_p50_ms_100k']} ms "
        f"({result['plan_capacity_cpu_p50_ms_100k']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="CI smoke: 50 instances, 10,000 GPUs")
    parser.add_argument("--instances", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-baseline", action="store_true", help="do not time the old planner at scale")
    args = parser.parse_args()
    instances = args.instances or (50 if args.quick else 500)
    repeats = args.repeats or (3 if args.quick else 5)
    gpus = 10_000 if args.quick else 100_000
    result = run(instances, repeats, args.seed, gpus, baseline=not args.no_baseline)
    if args.json:
        print(json.dumps(result))
    else:
        _print_tables(result)


if __name__ == "__main__":
    main()
