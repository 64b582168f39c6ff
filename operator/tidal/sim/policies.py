"""The policies compared side by side. All share the placement engine (tidal.placement), the
admission order (priority, then recoveries, then arrival; backfill allowed) and every cost in
`engine.Costs`; they differ only where the policy does.

- autoscale-preempt: what Kueue/KAI/GKE users run today. Inference pools follow demand (the
  same stabilized autoscaler as tidal, without forecasting); room for a replica comes from free
  GPUs, then from plain priority preemption of whole lower-priority preemptible gangs, killed at
  once without a checkpoint request (the work since their last periodic checkpoint is lost); no
  elastic shrink or grow.
- static-split: fixed day (08:00-23:00) and night partitions for inference, each sized for its
  part's peak; at the switch, training in the way is killed without a checkpoint.
- topology-only: topology-aware placement; inference holds a static reservation sized for its peak.
- first-fit: like topology-only, but training is placed topology-unaware (first fit), so HBD
  groups split across supernodes and those jobs run at Costs.split_efficiency.
- tidal: inference sized by demand and by the diurnal profile learned from the previous days
  (scaling ahead of the ramp by the time making room takes: a checkpoint write, a decision period
  and a cold start), capacity taken with tidal.rebalance.plan_capacity (free GPUs, elastic shrink,
  then suspension, lowest priority first; when that plan shrinks a Restart job, the plan sparing
  Restart jobs if it stalls fewer GPU-seconds by `resize_cost`) within a disruption budget,
  checkpoint first unless a job resizes Live; shrunk jobs grow back (partially if need be) in
  priority order with admission, after a cooldown, only into GPUs the forecast does not need and
  only when the added replicas' work before the forecast wants the GPUs back outweighs the
  grow-back's cost. Ablations: `tidal-reactive` (no forecast), `tidal-no-restart-shrink`
  (Restart jobs suspended whole, never shrunk) and both at once.

Every policy sees inference demand only as an autoscaler does: `Simulation.observed`, the last
minute's mean, at each one-minute sync; what it adds serves after the cold start.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from tidal.placement import (
    GangRequest,
    PlacementPlan,
    PreemptionPlan,
    RunningGang,
    Unplaceable,
    apply_plan,
    plan_first_fit,
    plan_gang,
    plan_preemption,
    split_groups,
)
from tidal.rebalance import DemandTracker, plan_capacity
from tidal.rebalance.capacity import restart_jobs_whole
from tidal.sim.engine import FLAP_WINDOW_S, SYNC_S, Job, Pool, Simulation
from tidal.sim.workload import WINDOW

ADMIT_TRIES = 32
DAY_START_H, DAY_END_H = 8, 23
STABILIZATION = dt.timedelta(minutes=30)
"""Scale-down waits until demand has stayed lower for 30 minutes (thirty one-minute ticks)."""
GROW_COOLDOWN_S = 3600.0
"""A shrunk job grows back no sooner than an hour after the shrink's decision."""
FORECAST_DAYS = 7
GROW_HORIZON_S = 12 * 3600.0
"""How far ahead a grow-back looks for the forecast wanting its GPUs back."""
BUDGET_SHARE = 0.20
"""Disruption budget, as the operator's --disruption-budget-gpus-per-hour: at most 20% of the
cluster's GPUs asked to checkpoint (suspend or shrink) in any hour. At 10% (the setting before
demand came per minute with its bursts) tidal met less of the inference demand than the
baseline (98.82% against 99.10% at 24,048 GPUs, seed 7): a burst could not be met within it."""


@dataclass(frozen=True)
class Room:
    """Room being made for a queued job by preempting training checkpoint-first."""

    victims: tuple[tuple[str, int], ...]
    """(victim, its version once asked to save): the room is ready once none of them still saves."""
    nodes: Counter[str]
    """GPUs per node of the job's planned placement, held for it as they come free."""


def job_request(job: Job, dp: int) -> GangRequest:
    shape = job.shape
    return GangRequest(
        job.id,
        groups=shape.groups * dp // shape.dp,
        group_gpus=shape.group_gpus,
        gpus_per_pod=shape.gpus_per_pod,
        accelerator=job.arrival.accelerator,
        priority=job.arrival.priority,
    )


def order(job: Job) -> tuple:
    return (-job.arrival.priority, not job.recovery, job.arrival.at, job.arrival.job_id)


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

    def grow_candidates(self, sim: Simulation) -> list[Job]:
        return []

    training_preemption = False
    """Whether a queued training job may evict lower-priority training (Scenario.training_preemption)."""

    whole_starts_only = False
    """An elastic policy that still starts every job whole (tidal-whole)."""

    @property
    def partial_starts(self) -> bool:
        return self.elastic and not self.whole_starts_only

    def admit(self, sim: Simulation) -> None:
        self.before_admission(sim)
        self.admit_pass(sim, partial=self.partial_starts)
        if self.training_preemption:
            self.preempt_for_waiting(sim)

    def before_admission(self, sim: Simulation) -> None:
        """What comes before queued jobs take free GPUs (CheckpointFirst: the room being made)."""

    def preempt_for_waiting(self, sim: Simulation) -> None:
        """Room for queued jobs that lower-priority preemptible training is in the way of, in queue
        order, as the operator's admission plans it for every queued job each cycle (the first
        ADMIT_TRIES here); a job whose room is already being made waits for it."""
        gangs: list[RunningGang] | None = None  # built once, again only after an eviction changed them
        # Requests (but for the job's name) whose preemption found no room on these gangs: the same
        # request meets the same cluster until an eviction changes it, so it is refused again
        # without planning (at 72,000 GPUs seven in ten plans of a pass were such repeats).
        refused: set[GangRequest] = set()
        for job in sorted(sim.queue, key=order)[:ADMIT_TRIES]:
            if job.state != "queued" or self.making_room_for(job):
                continue
            if gangs is None:
                gangs = sim.running_gangs()
                lowest = min((g.priority for g in gangs if g.preemptible), default=None)
                refused.clear()
            if lowest is None or lowest >= job.arrival.priority:
                continue
            same = replace(job_request(job, job.shape.dp), name="")
            if same in refused:
                continue
            if self.preempt_for(sim, job, gangs):
                gangs = None
            else:
                refused.add(same)

    def making_room_for(self, job: Job) -> bool:
        return False

    def preempt_for(self, sim: Simulation, job: Job, gangs: list[RunningGang]) -> bool:
        """Evict for `job` if that makes room; True if it did. Policies without priority
        preemption of training never do."""
        return False

    def admit_pass(self, sim: Simulation, partial: bool) -> None:
        """Best-effort FIFO by priority: a bounded number of tries per pass, backfill allowed;
        with `partial`, an elastic job that does not fit whole starts at the largest DP that
        fits (down to its minDP). Shrunk jobs that may grow back take their turn in the same order."""
        free = sim.snapshot.free_gpus()
        tries = 0
        # The planner's count of what fits now (room_key), from its last refusal of a request of
        # that kind in this pass: a request for more is refused without asking. Only allocations
        # follow in the pass, so the count can only have fallen since.
        fitting: dict[tuple, int] = {}
        for job in sorted(sim.queue + self.grow_candidates(sim), key=order):
            if tries >= ADMIT_TRIES or free <= 0:
                break
            if job.state != "queued":
                tries += 1
                free -= self.grow_back(sim, job, free)
                continue
            dps = [job.shape.dp]
            if partial and job.arrival.min_dp:
                dps += list(range(job.shape.dp - 1, job.arrival.min_dp - 1, -1))
            if job.shape.gpus * dps[-1] // job.shape.dp > free:
                continue
            tries += 1
            for dp in dps:
                request = job_request(job, dp)
                key, size = self.room_key(request)
                if size > fitting.get(key, size):
                    continue
                plan = self.planner(sim.snapshot, request)
                if isinstance(plan, PlacementPlan):
                    sim.start(job, plan, dp, split_groups(sim.snapshot, plan))
                    free -= job.gpus_held
                    break
                fitting[key] = self.room_now(plan)

    @staticmethod
    def room_key(request: GangRequest) -> tuple[tuple, int]:
        """What the planner counts for a request and how many it asks for: for plan_gang, groups of
        its shape (a policy with another planner says what that one counts)."""
        kind = (
            request.accelerator,
            request.group_gpus,
            request.gpus_per_pod,
            request.recovery,
            request.prefer_supernodes,
        )
        return kind, request.groups

    @staticmethod
    def room_now(refusal: Unplaceable) -> int:
        """How many of room_key's units fit now, by the planner's refusal."""
        return refusal.groups_fitting_now

    def grow_back(self, sim: Simulation, job: Job, free: int) -> int:
        return 0

    # -- inference helpers -------------------------------------------------------------------
    @staticmethod
    def place_free(sim: Simulation, pool: Pool, count: int) -> int:
        if count <= 0:
            return 0
        plan = plan_capacity(sim.snapshot, pool.request(count), [], None)
        if plan.placement is None:
            return 0
        apply_plan(sim.snapshot, plan.placement)
        sim.add_replicas(pool, plan.placement.groups)
        return plan.replicas


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

    @staticmethod
    def room_key(request: GangRequest) -> tuple[tuple, int]:
        """First fit counts pods of the request's size anywhere, groups aside."""
        return (request.accelerator, request.gpus_per_pod, request.recovery), request.groups * request.pods_per_group

    @staticmethod
    def room_now(refusal: Unplaceable) -> int:
        return refusal.details["pods_fitting_now"]


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
            step = sim.workload.demand_step_s
            for day in (True, False):
                self.size[(pool.name, day)] = max(
                    (r for w, r in enumerate(series) if is_day(sim, w * step) == day), default=0
                )
        self.tick(sim)

    def tick(self, sim: Simulation) -> None:
        day = is_day(sim)
        for pool in sim.pools.values():
            target = self.size[(pool.name, day)]
            sim.remove_replicas(pool, target)
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


class Autoscaled(Policy):
    """Inference pools sized by observed demand every tick, scale-down stabilized."""

    forecasting = False

    def lead_s(self, sim: Simulation) -> float:
        """How far ahead the forecast looks: the time making room takes (0: no forecast)."""
        if not self.forecasting:
            return 0.0
        return sim.costs.room_lead_s(SYNC_S, sim.costs.cold_start_s)

    def __init__(self, stabilization: dt.timedelta = STABILIZATION) -> None:
        self.tracker = DemandTracker(window=stabilization)
        # pool -> (workload, time, forecast): a function of the workload's past demand and the
        # time alone, and grow-back asks for it for every candidate job at every admission pass.
        self.forecasts: dict[str, tuple[object, float, int]] = {}

    def start(self, sim: Simulation) -> None:
        self.tick(sim)

    def forecast(self, sim: Simulation, pool: Pool) -> int:
        """Replicas needed within the lead (`lead_s`): the observed demand plus the largest rise
        the previous days showed from this time of day over the lead (the mean over up to
        FORECAST_DAYS days). Only past demand is read."""
        cached = self.forecasts.get(pool.name)
        if cached is not None and cached[0] is sim.workload and cached[1] == sim.now:
            return cached[2]
        value = self._forecast(sim, pool)
        self.forecasts[pool.name] = (sim.workload, sim.now, value)
        return value

    def _forecast(self, sim: Simulation, pool: Pool) -> int:
        lead = self.lead_s(sim)
        if lead <= 0 or not self.past_days(sim):
            return 0
        base = self.past(sim, pool, sim.now)
        steps = max(math.ceil(lead / WINDOW), 1)
        rise = max(self.past(sim, pool, sim.now + k * lead / steps) - base for k in range(steps + 1))
        return sim.observed(pool) + math.ceil(rise - 1e-9)

    @staticmethod
    def past_days(sim: Simulation) -> int:
        return min(int(sim.now // 86400), FORECAST_DAYS)

    def past(self, sim: Simulation, pool: Pool, at: float) -> float:
        """The mean demand of the previous days at this time of day (10-minute means: only the
        past is read, `at` - d days is before now for every d >= 1 within the lead)."""
        days = self.past_days(sim)
        return sum(sim.workload.window_mean(pool.name, at - d * 86400) for d in range(1, days + 1)) / days

    def desired(self, sim: Simulation, pool: Pool) -> int:
        """Unstabilized: the observed demand, or the forecast if higher."""
        return max(sim.observed(pool), self.forecast(sim, pool))

    def target(self, sim: Simulation, pool: Pool) -> int:
        return self.tracker.stabilized(pool.name, sim.wall_clock(), self.desired(sim, pool))

    def tick(self, sim: Simulation) -> None:
        for pool in sim.pools.values():
            target = self.target(sim, pool)
            sim.remove_replicas(pool, target)
            self.make_room(sim, pool, target)

    def make_room(self, sim: Simulation, pool: Pool, target: int) -> None:
        raise NotImplementedError


class AutoscalePreempt(Autoscaled):
    name = "autoscale-preempt"

    def make_room(self, sim: Simulation, pool: Pool, target: int) -> None:
        need = target - len(pool.replicas)
        need -= self.place_free(sim, pool, need)
        if need <= 0:
            return
        # Plain priority preemption: whole gangs, lowest priority first, no elastic shrink.
        gangs = [replace(g, min_replicas=None) for g in sim.running_gangs()]
        plan = plan_capacity(sim.snapshot, pool.request(need), gangs, None)
        if not plan.evictions or plan.placement is None:
            return
        for eviction in plan.evictions:
            sim.kill(sim.jobs[eviction.gang])  # no checkpoint request
        apply_plan(sim.snapshot, plan.placement)
        sim.add_replicas(pool, plan.placement.groups)

    def preempt_for(self, sim: Simulation, job: Job, gangs: list[RunningGang]) -> bool:
        """Plain priority preemption of training for training (Kueue's withinClusterQueue:
        LowerPriority, KAI's): whole lower-priority gangs killed, the job started at once."""
        request = job_request(job, job.shape.dp)
        result = plan_preemption(sim.snapshot, request, [replace(g, min_replicas=None) for g in gangs])
        if not isinstance(result, PreemptionPlan) or not result.evictions:
            return False
        for eviction in result.evictions:
            sim.kill(sim.jobs[eviction.gang])
        plan = self.planner(sim.snapshot, request)
        if isinstance(plan, PlacementPlan):
            sim.start(job, plan, job.shape.dp, split_groups(sim.snapshot, plan))
        return True


class CheckpointFirst(Autoscaled):
    """Room for replicas comes from victims that save first: each tick's targets are kept, and asked
    for again once those saves finish (`after_checkpoint`)."""

    def __init__(self, stabilization: dt.timedelta = STABILIZATION) -> None:
        super().__init__(stabilization)
        self.targets: dict[str, int] = {}
        self.rooms: dict[str, Room] = {}
        """Queued job -> the room its preemption is making (victims saving, GPUs held for it)."""
        self.saving_for: dict[str, list[tuple[str, int]]] = {}
        """Pool -> (victim, its version once asked to save) for the room being made for it."""

    def still_saving(self, sim: Simulation, pool: Pool) -> bool:
        """Whether victims asked to save for `pool` still write (the pool decides again once they
        are gone); other pools' and jobs' victims do not hold it up, as in Kueue, whose
        preemptions for one workload do not wait on another's."""
        victims = self.saving_for.get(pool.name, [])
        victims[:] = [
            (v, at) for v, at in victims if sim.jobs[v].state == "checkpointing" and sim.jobs[v].version == at
        ]
        return bool(victims)

    def asked_to_save(self, sim: Simulation, pool: Pool, job: Job, replicas: tuple[int, ...]) -> None:
        sim.request_checkpoint(job, replicas)
        if job.state == "checkpointing":  # (a Live shrink or a restoring job goes at once)
            self.saving_for.setdefault(pool.name, []).append((job.id, job.version))

    def tick(self, sim: Simulation) -> None:
        self.release_rooms(sim)
        for pool in sim.pools.values():
            self.targets[pool.name] = self.target(sim, pool)
            sim.remove_replicas(pool, self.targets[pool.name])
            self.make_room(sim, pool, self.targets[pool.name])

    def after_checkpoint(self, sim: Simulation) -> None:
        self.release_rooms(sim)
        for pool in sim.pools.values():
            self.make_room(sim, pool, self.targets.get(pool.name, 0))
        self.admit(sim)

    # -- training preemption, checkpoint first ----------------------------------------------------
    def victims_of(self, gangs: list[RunningGang]) -> list[RunningGang]:
        """The running gangs as this policy may evict them (tidal: shrink first)."""
        return gangs

    def making_room_for(self, job: Job) -> bool:
        return job.id in self.rooms

    def preempt_for(self, sim: Simulation, job: Job, gangs: list[RunningGang]) -> bool:
        """plan_preemption, every victim checkpoint first (the operator's admission: shrink before
        suspension; the graceful baseline: whole gangs). The nodes the plan places the job on are
        held for it as its victims free them (the operator's held nodes), and it starts once the
        last victim is gone (`before_admission`)."""
        result = plan_preemption(sim.snapshot, job_request(job, job.shape.dp), self.victims_of(gangs))
        if not isinstance(result, PreemptionPlan) or not result.evictions:
            return False
        victims = []
        for eviction in result.evictions:
            victim = sim.jobs[eviction.gang]
            sim.request_checkpoint(victim, () if eviction.whole else eviction.replicas)
            victims.append((victim.id, victim.version))
        self.rooms[job.id] = Room(tuple(victims), result.placement.gpus_by_node())
        self.before_admission(sim)  # a Live shrink frees its GPUs at once
        return True

    def before_admission(self, sim: Simulation) -> None:
        """Hold for each waiting job the GPUs its victims have freed on its planned nodes, and start
        it, before anyone else, once every victim is gone."""
        for job_id, room in list(self.rooms.items()):
            job = sim.jobs[job_id]
            if job.state != "queued":  # started another way meanwhile
                sim.release_hold(job_id)
                del self.rooms[job_id]
                continue
            sim.hold(job_id, room.nodes)
            if any(sim.jobs[v].state == "checkpointing" and sim.jobs[v].version == at for v, at in room.victims):
                continue
            sim.release_hold(job_id)
            del self.rooms[job_id]
            request = job_request(job, job.shape.dp)
            plan = self.planner(sim.snapshot, request)
            if isinstance(plan, PlacementPlan):
                sim.start(job, plan, job.shape.dp, split_groups(sim.snapshot, plan))

    def release_rooms(self, sim: Simulation) -> None:
        """Pools outrank training: before they take room, the GPUs held for waiting jobs are free
        (held again at the next admission)."""
        for job_id in self.rooms:
            sim.release_hold(job_id)


class AutoscalePreemptGraceful(CheckpointFirst):
    """autoscale-preempt as a careful Kueue or KAI user runs it: a preempted pod gets SIGTERM and a
    termination grace period long enough for the training loop to save (so no work is lost, but
    the victim holds its GPUs while it writes, and the replicas wait), and elastic jobs are
    admitted at a smaller size when the full one does not fit (Kueue's partial admission). Still
    whole-gang preemption only: no shrink, no grow-back, no disruption budget, no forecast."""

    name = "autoscale-preempt-graceful"
    elastic = True

    def make_room(self, sim: Simulation, pool: Pool, target: int) -> None:
        need = target - len(pool.replicas)
        need -= self.place_free(sim, pool, need)
        if need <= 0 or self.still_saving(sim, pool):
            return  # done, or its victims are still saving: decided again once they are gone
        gangs = [replace(g, min_replicas=None) for g in sim.running_gangs()]
        plan = plan_capacity(sim.snapshot, pool.request(need), gangs, None)
        if not plan.evictions or plan.placement is None:
            return
        for eviction in plan.evictions:
            self.asked_to_save(sim, pool, sim.jobs[eviction.gang], ())  # SIGTERM: save, then go
        # A victim still restoring gives its GPUs back at once: the pool takes them now, before
        # admission could hand them to queued training (as tidal does).
        self.place_free(sim, pool, target - len(pool.replicas))

    def victims_of(self, gangs: list[RunningGang]) -> list[RunningGang]:
        """Training for training the same way: whole lower-priority gangs, each saving within its
        grace period before it goes."""
        return [replace(g, min_replicas=None) for g in gangs]


class BurstHistory:
    """Per pool, the demand an autoscaler observed each minute over the last day, and from it how
    far a minute rose above the mean of the ten before it: what warm replicas ahead of a burst
    must cover. Only observed values are kept (a policy never sees the present minute)."""

    SPAN = 1440  # minutes: one day
    MEAN_OF = 10  # minutes: the mean a burst is measured against

    def __init__(self) -> None:
        self.seen: dict[str, list[int]] = {}
        self.ratios: dict[str, list[float]] = {}

    def observe(self, pool: str, value: int) -> None:
        seen = self.seen.setdefault(pool, [])
        if len(seen) >= self.MEAN_OF:
            mean = sum(seen[-self.MEAN_OF :]) / self.MEAN_OF
            if mean > 0:
                ratios = self.ratios.setdefault(pool, [])
                ratios.append(value / mean)
                del ratios[: -self.SPAN]
        seen.append(value)
        del seen[: -self.SPAN]

    def ahead(self, pool: str, quantile: float) -> int:
        """Replicas for a burst at `quantile` of the observed factors on the last ten minutes'
        mean; 0 until 60 factors have been observed (70 minutes: each needs the ten before it)."""
        ratios = self.ratios.get(pool, [])
        if len(ratios) < 60:
            return 0
        factor = sorted(ratios)[int(quantile * (len(ratios) - 1))]
        mean = sum(self.seen[pool][-self.MEAN_OF :]) / self.MEAN_OF
        return math.ceil(mean * factor - 1e-9)


class Tidal(CheckpointFirst):
    name = "tidal"
    elastic = True
    forecasting = True

    def __init__(
        self,
        stabilization: dt.timedelta = STABILIZATION,
        budget_share: float | None = BUDGET_SHARE,
        grow_cooldown_s: float = GROW_COOLDOWN_S,
        burst_quantile: float | None = None,
    ) -> None:
        super().__init__(stabilization)
        self.budget_share = budget_share
        self.grow_cooldown_s = grow_cooldown_s
        self.burst_quantile = burst_quantile
        self.bursts = BurstHistory()
        self.shrunk_at: dict[str, float] = {}
        self.waiting = False
        self.evicted: list[tuple[float, int]] = []  # (when, GPUs) for the disruption budget
        self.stuck: set[str] = set()

    def budget_left(self, sim: Simulation) -> int | None:
        if self.budget_share is None:
            return None
        self.evicted = [(t, g) for t, g in self.evicted if sim.now - t < 3600]
        return max(int(self.budget_share * sim.total_gpus) - sum(g for _, g in self.evicted), 0)

    def tick(self, sim: Simulation) -> None:
        self.waiting = False
        self.stuck.clear()
        if self.burst_quantile is not None:
            for pool in sim.pools.values():
                self.bursts.observe(pool.name, sim.observed(pool))
        super().tick(sim)

    def desired(self, sim: Simulation, pool: Pool) -> int:
        """With `burst_quantile`, at least the last ten minutes' mean times the burst factor the
        pool's own observed minutes reached at that quantile over the last day."""
        desired = super().desired(sim, pool)
        if self.burst_quantile is not None:
            desired = max(desired, self.bursts.ahead(pool.name, self.burst_quantile))
        return desired

    def after_checkpoint(self, sim: Simulation) -> None:
        self.waiting = False
        super().after_checkpoint(sim)

    def make_room(self, sim: Simulation, pool: Pool, target: int) -> None:
        need = target - len(pool.replicas)
        need -= self.place_free(sim, pool, need)
        if need <= 0:
            return
        if self.still_saving(sim, pool):
            self.waiting = True  # room is being made; decide again once those checkpoints finish
            return
        if pool.name in self.stuck:
            return  # no room to be had this tick; ask again at the next one
        budget = self.budget_left(sim)
        if budget == 0:
            sim.totals.budget_limited += 1
            self.stuck.add(pool.name)
            return
        plan = plan_capacity(sim.snapshot, pool.request(need), self.victims_of(sim.running_gangs()), budget, sim.costs)
        if "budget" in plan.reason:
            sim.totals.budget_limited += 1
        if not plan.evictions:
            self.stuck.add(pool.name)
        for eviction in plan.evictions:
            job = sim.jobs[eviction.gang]
            if not eviction.whole:
                self.shrunk_at[job.id] = sim.now
            self.evicted.append((sim.now, eviction.gpus))
            self.asked_to_save(sim, pool, job, () if eviction.whole else eviction.replicas)
        if plan.evictions:
            self.waiting = True
            # A Live shrink (or a job still restoring) gives its GPUs back at once: the pool takes
            # them now, before admission could hand them to queued training.
            self.place_free(sim, pool, target - len(pool.replicas))

    def headroom(self, sim: Simulation, accelerator: str) -> int:
        """GPUs the pools will want within the forecast lead beyond what they hold now."""
        want = 0
        for pool in sim.pools.values():
            if pool.accelerator == accelerator:
                ahead = max(self.forecast(sim, pool), sim.observed(pool))
                want += max(ahead - len(pool.replicas), 0) * pool.tp
        return want

    def grow_candidates(self, sim: Simulation) -> list[Job]:
        if self.waiting:
            return []
        return [
            j
            for j in sim.active.values()
            if j.state == "running"
            and j.dp < j.shape.dp
            and not j.joining_gpus
            and sim.now - self.shrunk_at.get(j.id, -1e18) >= self.grow_cooldown_s
        ]

    def calm_s(self, sim: Simulation, accelerator: str, spare_gpus: int) -> float:
        """How long, by the previous days' profile, until the pools of `accelerator` want more
        than `spare_gpus` GPUs beyond what they want now (GROW_HORIZON_S if not within it; the
        hour a grow-back must hold not to be a flap when there is no past to learn from)."""
        if not self.forecasting or not self.past_days(sim):
            return max(self.grow_cooldown_s, FLAP_WINDOW_S)
        pools = [p for p in sim.pools.values() if p.accelerator == accelerator]
        base = sum(self.past(sim, p, sim.now) * p.tp for p in pools)
        for k in range(1, int(GROW_HORIZON_S // WINDOW) + 1):
            at = sim.now + k * WINDOW
            if sum(self.past(sim, p, at) * p.tp for p in pools) - base > spare_gpus:
                return k * WINDOW
        return GROW_HORIZON_S

    def grow_pays(self, sim: Simulation, job: Job, added: int, room: int) -> bool:
        """The added replicas' work until the forecast wants the GPUs back outweighs what the
        grow-back stalls, and the shrink that gives them back if the forecast wants them within
        the horizon (resize_cost, by how the job resizes). The job's own end is not known, as in
        the operator (k8s/rebalancing.py, _grow_pays): its remaining work is never read here."""
        calm = self.calm_s(sim, job.arrival.accelerator, room - added)
        return sim.costs.grow_pays(
            job.resize, job.gpus_held, added, job.model_gpus, calm, shrunk_again=calm < GROW_HORIZON_S
        )

    def grow_back(self, sim: Simulation, job: Job, free: int) -> int:
        """Grow a shrunk job by as many of its missing DP replicas as fit, leaving the GPUs the
        inference forecast needs, when it pays; returns the GPUs taken."""
        per = job.groups_per_replica
        replica_gpus = per * job.shape.group_gpus
        room = free - self.headroom(sim, job.arrival.accelerator)
        missing = min(job.shape.dp - job.dp, room // replica_gpus)
        while missing > 0:
            if not self.grow_pays(sim, job, missing * replica_gpus, room):
                missing //= 2  # a smaller grow-back stalls as much and gains less, but may still pay
                continue
            have = job.dp * per
            request = GangRequest(
                job.id,
                groups=missing * per,
                group_gpus=job.shape.group_gpus,
                gpus_per_pod=job.shape.gpus_per_pod,
                accelerator=job.arrival.accelerator,
                priority=job.arrival.priority,
                group_ids=tuple(range(have, have + missing * per)),
            )
            plan = plan_gang(sim.snapshot, request)
            if isinstance(plan, PlacementPlan):
                sim.grow(job, plan, job.dp + missing)
                return missing * replica_gpus
            missing //= 2
        return 0


class TidalReactive(Tidal):
    name = "tidal-reactive"
    forecasting = False


BURST_QUANTILE = 0.9
"""tidal-burst's quantile of the observed burst factors (about 1.2-1.3x the ten-minute mean)."""


class TidalBurst(Tidal):
    """tidal with warm replicas ahead of bursts (`burst_quantile`): more inference demand met
    for fewer training GPU-hours. A simulator variant: the operator has no such setting yet."""

    name = "tidal-burst"

    def __init__(self, stabilization: dt.timedelta = STABILIZATION, budget_share: float | None = BUDGET_SHARE) -> None:
        super().__init__(stabilization, budget_share, burst_quantile=BURST_QUANTILE)


class TidalWhole(Tidal):
    """tidal starting jobs only whole (no smaller elastic starts): shorter waits, at the goodput
    the smaller starts win. A simulator variant: the operator always starts an elastic job
    smaller when it does not fit whole."""

    name = "tidal-whole"
    whole_starts_only = True


class TidalNoRestartShrink(Tidal):
    """An ablation: tidal that never shrinks a Restart job; it suspends it whole, checkpoint
    first, for pools and queued training alike (Live jobs still shrink). Not an operator setting
    as such: a job without spec.elastic is never shrunk, but it also never starts smaller."""

    name = "tidal-no-restart-shrink"

    def victims_of(self, gangs: list[RunningGang]) -> list[RunningGang]:
        return restart_jobs_whole(gangs)


class TidalReactiveNoRestartShrink(TidalNoRestartShrink):
    """An ablation: tidal-reactive and tidal-no-restart-shrink at once (no forecast, no Restart
    job shrunk)."""

    name = "tidal-reactive-no-restart-shrink"
    forecasting = False


POLICIES: dict[str, type[Policy]] = {
    p.name: p
    for p in (
        AutoscalePreempt,
        AutoscalePreemptGraceful,
        StaticSplit,
        TopologyOnly,
        FirstFit,
        Tidal,
        TidalReactive,
        TidalBurst,
        TidalWhole,
        TidalNoRestartShrink,
        TidalReactiveNoRestartShrink,
    )
}
DEFAULT_POLICIES = ("autoscale-preempt", "static-split", "topology-only", "first-fit", "tidal")
