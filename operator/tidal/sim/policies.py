"""The four policies compared side by side.

- tidal: topology-aware gang placement, inference sized by demand every 10 minutes, capacity
  taken from training with tidal.rebalance.plan_capacity (free, elastic shrink, suspension),
  checkpoint first, and elastic jobs grown back when pools shrink. The same functions the
  operator's rebalancer calls.
- topology-only: topology-aware placement; inference holds a static reservation sized for its peak.
- static-split: fixed day (08:00-23:00) and night partitions for inference, sized for each part's
  peak; at the switch, training in the way is killed without a checkpoint.
- first-fit: like topology-only, but training is placed topology-unaware (first fit), so HBD
  groups split across supernodes and those jobs run at SPLIT_EFFICIENCY.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from tidal.placement import (
    GangRequest,
    PlacementPlan,
    PreemptionPlan,
    RunningGang,
    apply_plan,
    plan_first_fit,
    plan_gang,
    plan_preemption,
    split_groups,
)
from tidal.rebalance import DemandTracker, plan_capacity
from tidal.sim.engine import Job, Pool, Simulation
from tidal.sim.workload import WINDOW

ADMIT_TRIES = 32
EXPAND_COOLDOWN_S = 600.0
DAY_START_H, DAY_END_H = 8, 23


def job_request(job: Job, dp: int) -> GangRequest:
    shape = job.shape
    return GangRequest(
        job.id,
        groups=shape.groups * dp // shape.dp,
        group_gpus=shape.group_gpus,
        gpus_per_pod=shape.gpus_per_pod,
        priority=job.arrival.priority,
    )


class Policy:
    name = "base"
    planner: Callable = staticmethod(plan_gang)
    elastic = False

    def start(self, sim: Simulation) -> None:
        pass

    def tick(self, sim: Simulation) -> None:
        pass

    def after_checkpoint(self, sim: Simulation) -> None:
        self.admit(sim)

    def admit(self, sim: Simulation) -> None:
        """Best-effort FIFO by priority: a bounded number of tries per pass, backfill allowed."""
        free = sim.snapshot.free_gpus()
        tries = 0
        for job in sorted(sim.queue, key=lambda j: (-j.arrival.priority, j.arrival.at, j.arrival.job_id)):
            if tries >= ADMIT_TRIES or free <= 0:
                break
            dps = [job.shape.dp]
            if self.elastic and job.arrival.min_dp:
                dps += list(range(job.shape.dp - 1, job.arrival.min_dp - 1, -1))
            if job.shape.gpus * dps[-1] // job.shape.dp > free:
                continue
            tries += 1
            for dp in dps:
                plan = self.planner(sim.snapshot, job_request(job, dp))
                if isinstance(plan, PlacementPlan):
                    sim.start(job, plan, dp, split_groups(sim.snapshot, plan))
                    free -= job.gpus_held
                    break

    # -- inference helpers -------------------------------------------------------------------
    @staticmethod
    def place_free(sim: Simulation, pool: Pool, count: int) -> int:
        if count <= 0:
            return 0
        plan = plan_capacity(sim.snapshot, pool.request(count), [], None)
        if plan.placement is None:
            return 0
        apply_plan(sim.snapshot, plan.placement)
        pool.replicas += list(plan.placement.groups)
        return plan.replicas

    @staticmethod
    def shrink_pool(sim: Simulation, pool: Pool, target: int) -> None:
        while len(pool.replicas) > target:
            replica = pool.replicas.pop()  # newest first
            for node in replica.nodes:
                sim.snapshot.release(node, pool.gpus_per_pod)


class TopologyOnly(Policy):
    """A static inference reservation sized for the week's peak; training gets the rest."""

    name = "topology-only"

    def __init__(self) -> None:
        self.reserved: dict[str, int] = {}

    def start(self, sim: Simulation) -> None:
        for pool in sim.pools.values():
            self.reserved[pool.name] = max(sim.workload.inference_replicas[pool.name])
            self.place_free(sim, pool, self.reserved[pool.name])

    def tick(self, sim: Simulation) -> None:
        for pool in sim.pools.values():  # replicas lost to failures come back when there is room
            self.place_free(sim, pool, self.reserved[pool.name] - len(pool.replicas))


class FirstFit(TopologyOnly):
    name = "first-fit"
    planner = staticmethod(plan_first_fit)


def is_day(sim: Simulation, at: float | None = None) -> bool:
    hour = ((at if at is not None else sim.now) % 86400) / 3600
    return DAY_START_H <= hour < DAY_END_H


class StaticSplit(Policy):
    """Inference partition sized for the day's peak by day and the night's peak by night."""

    name = "static-split"

    def __init__(self) -> None:
        self.size: dict[tuple[str, bool], int] = {}

    def start(self, sim: Simulation) -> None:
        for pool in sim.pools.values():
            series = sim.workload.inference_replicas[pool.name]
            for day in (True, False):
                self.size[(pool.name, day)] = max(
                    (r for w, r in enumerate(series) if is_day(sim, w * WINDOW) == day), default=0
                )
        self.tick(sim)

    def tick(self, sim: Simulation) -> None:
        day = is_day(sim)
        for pool in sim.pools.values():
            target = self.size[(pool.name, day)]
            self.shrink_pool(sim, pool, target)
            need = target - len(pool.replicas) - self.place_free(sim, pool, target - len(pool.replicas))
            if need <= 0:
                continue
            # The partition switch kills whatever training is in the way, without a checkpoint.
            gangs = [RunningGang(g.name, -1, True, g.replicas, None) for g in sim.running_gangs()]
            result = plan_preemption(sim.snapshot, pool.request(need), gangs)
            if not isinstance(result, PreemptionPlan):
                continue
            for eviction in result.evictions:
                sim.kill(sim.jobs[eviction.gang])
            self.place_free(sim, pool, need)


class Tidal(Policy):
    name = "tidal"
    elastic = True

    def __init__(self, stabilization: dt.timedelta = dt.timedelta(minutes=5)) -> None:
        self.tracker = DemandTracker(window=stabilization)
        self.shrunk_at: dict[str, float] = {}
        self.waiting = False

    def start(self, sim: Simulation) -> None:
        self.tick(sim)

    def desired(self, sim: Simulation, pool: Pool) -> int:
        raw = sim.workload.desired_at(pool.name, sim.now)
        return self.tracker.stabilized(pool.name, sim.wall_clock(), raw)

    def tick(self, sim: Simulation) -> None:
        self.waiting = False
        for pool in sim.pools.values():
            target = self.desired(sim, pool)
            self.shrink_pool(sim, pool, target)
            self.grow(sim, pool, target)
        if not self.waiting:
            self.expand(sim)

    def after_checkpoint(self, sim: Simulation) -> None:
        self.waiting = False
        for pool in sim.pools.values():
            self.grow(
                sim,
                pool,
                self.tracker.stabilized(pool.name, sim.wall_clock(), sim.workload.desired_at(pool.name, sim.now)),
            )
        self.admit(sim)

    def grow(self, sim: Simulation, pool: Pool, target: int) -> None:
        need = target - len(pool.replicas)
        need -= self.place_free(sim, pool, need)
        if need <= 0:
            return
        checkpointing = [j for j in sim.active.values() if j.state == "checkpointing"]
        if checkpointing:
            self.waiting = True  # room is being made; decide again once those checkpoints finish
            return
        plan = plan_capacity(sim.snapshot, pool.request(need), sim.running_gangs(), None)
        for eviction in plan.evictions:
            job = sim.jobs[eviction.gang]
            sim.request_checkpoint(job, () if eviction.whole else eviction.replicas)
            if not eviction.whole:
                self.shrunk_at[job.id] = sim.now
        if plan.evictions:
            self.waiting = True

    def expand(self, sim: Simulation) -> None:
        """Grow shrunk elastic jobs back when their replicas fit in free GPUs."""
        for job in sorted(sim.active.values(), key=lambda j: (-j.arrival.priority, j.arrival.at)):
            if job.state != "running" or job.dp >= job.shape.dp:
                continue
            if sim.now - self.shrunk_at.get(job.id, -1e18) < EXPAND_COOLDOWN_S:
                continue
            have = len(job.groups)
            want = job.shape.groups
            request = GangRequest(
                job.id,
                groups=want - have,
                group_gpus=job.shape.group_gpus,
                gpus_per_pod=job.shape.gpus_per_pod,
                priority=job.arrival.priority,
                group_ids=tuple(range(have, want)),
            )
            plan = plan_gang(sim.snapshot, request)
            if isinstance(plan, PlacementPlan):
                sim.grow(job, plan, job.shape.dp)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (Tidal, TopologyOnly, StaticSplit, FirstFit)}
