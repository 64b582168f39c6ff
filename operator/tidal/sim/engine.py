"""Discrete-event simulation of one scheduling policy on one fleet, deterministic for a seed.

Events: training arrivals, jobs finishing, restored (a restart/resize done), checkpoints written,
Live joins done, inference replicas warm, node failures and repairs, and a tick every minute: the
autoscaler's sync period (`SYNC_S`). Inference demand changes every minute; a policy sees it only
as an autoscaler would (`Simulation.observed`: the mean over the last `METRIC_WINDOW_S`), decides
at the tick, and a replica it adds serves after its cold start. Placement and rebalancing call
tidal.placement and tidal.rebalance unchanged.

Every cost in `Costs` is charged to every policy: a checkpoint takes time that grows with the
model; any start, restart, resize or re-admission stalls the job while it reloads; a job killed
without a checkpoint request loses the work since its last periodic checkpoint; periodic
checkpoints slow training a little; an inference replica serves only after its cold start.
Goodput (training progress after all of that) is what the results call training GPU-hours.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field

from tidal.placement import GangRequest, GroupAssignment, PlacementPlan, RunningGang, apply_plan, plan_gang
from tidal.placement.workload_mix import JobShape
from tidal.rebalance.resize_cost import ResizeCosts, ResizeKind
from tidal.sim.workload import WINDOW, TrainingArrival, Workload
from tidal.topology.snapshot import ClusterSnapshot

EPOCH = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # the traces' day 0, 00:00 local time
FLAP_WINDOW_S = 3600.0
"""A capacity eviction whose GPUs come back to the same job within this long of the eviction's
decision is a flap (`flaps_real`), and so is an inference replica added and removed within it."""
SYNC_S = 60.0
"""Every policy decides once a minute, as an HPA whose sync period and metric window are a minute
(HPA's own default sync is 15 s, over metrics that Prometheus adapters average over a minute or more)."""
METRIC_WINDOW_S = 60.0
"""What a policy knows of inference demand: its mean over the last minute, never the present."""


@dataclass(frozen=True)
class Costs(ResizeCosts):
    """What resizing, restarting and serving really cost. The checkpoint, restart and Live resize
    costs and their sources are `tidal.rebalance.resize_cost.ResizeCosts` (the planner weighs the
    same ones); the simulator adds:

    - checkpoint_every_s 1800 and periodic_blocking 0.1: periodic saves every 30 minutes,
      asynchronous (Llama 3, MegaScale, Gemini all save asynchronously), blocking training for a
      tenth of a full save (the device-to-host copy).
    - cold_start_s 180: an inference replica loads its model before serving; vLLM cold starts of
      tens of seconds to minutes (vLLM startup study, MLSys '26 "Breaking the Ice"; 70-460 s
      for a 27 B model on one GPU, tensorfuse and Modal measurements).
    - split_efficiency 0.3: a job with an HBD group split across supernodes runs its tensor
      parallelism over the scale-out network (~10x less bandwidth). An assumption.
    """

    checkpoint_every_s: float = 1800.0
    periodic_blocking: float = 0.1
    cold_start_s: float = 180.0
    split_efficiency: float = 0.3

    def checkpoint_bytes(self, shape: JobShape) -> float:
        return self.state_bytes(shape.replica_gpus)

    def save_s(self, shape: JobShape, gpus: int) -> float:
        return self.save_seconds(shape.replica_gpus, gpus)

    def restore_s(self, shape: JobShape, gpus: int) -> float:
        return self.restore_seconds(shape.replica_gpus, gpus)

    def periodic_overhead(self, shape: JobShape, gpus: int) -> float:
        """Share of the running time lost to periodic checkpoints."""
        if self.checkpoint_every_s <= 0:
            return 0.0
        return min(0.5, self.periodic_blocking * self.save_s(shape, gpus) / self.checkpoint_every_s)


FREE = Costs(
    bytes_per_param=0.0,
    restart_s=0.0,
    rebuild_s=0.0,
    periodic_blocking=0.0,
    cold_start_s=0.0,
    checkpoint_every_s=1800.0,
)
"""No resize, restart or cold-start cost (the old model; for tests that isolate one rule)."""


@dataclass(eq=False)
class Job:
    """Compared by identity: the queue's membership tests and removals then cost a pointer
    comparison, not a field-by-field one (which was most of a 72,000-GPU run's time)."""

    arrival: TrainingArrival
    dp: int
    state: str = "queued"  # queued | restoring | running | checkpointing | done
    groups: list[GroupAssignment] = field(default_factory=list)
    """Replaced on every change, never changed in place: running_gangs keys its cache on the list's identity."""
    remaining: float = 0.0  # GPU-seconds of work at full efficiency
    efficiency: float = 1.0
    running_since: float = 0.0  # periodic checkpoints every checkpoint_every_s from here
    last_update: float = 0.0
    version: int = 0
    first_start: float | None = None
    evicting: tuple[int, ...] = ()  # DP replicas to give back after the checkpoint; () = all
    split_groups: int = 0
    unsaved: float = 0.0  # work at risk while a requested checkpoint is being written
    recovery: bool = False  # queued after a failure: ahead of new work of its priority
    down_at: float | None = None  # last shrink or eviction for capacity, stamped once saved (the old flap count)
    down_decided_at: float | None = None  # when that eviction was decided (flaps_real)
    joining_gpus: int = 0  # GPUs of Live replicas still starting or fetching state: held, not training
    join_end: float = 0.0  # when those replicas will have fetched the state
    overhead: float = 0.0  # periodic-checkpoint share at the current size
    clock_kept: bool = False
    """The restore under way is a Live rebuild: nothing was written or loaded, so the periodic
    checkpoints keep their cadence (running_since moves on by the stall, not to its end)."""
    restore_from: float = 0.0  # when the restore under way began
    group_gpus: int = field(init=False)
    # (groups, dp, the RunningGang they make): the capacity planner asks for every running job's
    # gang at every tick and checkpoint round, and most jobs have not moved since the last time.
    gang: tuple[list[GroupAssignment], int, RunningGang] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.group_gpus = self.arrival.shape.group_gpus  # read at every event by the accounting

    @property
    def id(self) -> str:
        return f"job-{self.arrival.job_id}"

    @property
    def shape(self) -> JobShape:
        return self.arrival.shape

    @property
    def gpus_held(self) -> int:
        return len(self.groups) * self.group_gpus

    @property
    def rate(self) -> float:
        if self.state != "running":
            return 0.0
        return (self.gpus_held - self.joining_gpus) * self.efficiency * (1.0 - self.overhead)

    @property
    def model_gpus(self) -> int:
        return self.shape.replica_gpus

    @property
    def resize(self) -> ResizeKind:
        return ResizeKind.LIVE if self.arrival.live_resize else ResizeKind.RESTART

    @property
    def groups_per_replica(self) -> int:
        return self.shape.groups // self.shape.dp


@dataclass(eq=False)
class Replica:
    group: GroupAssignment
    ready_at: float
    added_at: float = 0.0


@dataclass
class Pool:
    name: str
    tp: int
    gpus_per_pod: int
    accelerator: str = "nvidia.com/gpu"
    replicas: list[Replica] = field(default_factory=list)
    # ready() is asked at every event; the count changes only when a replica warms up or the
    # list changes (the engine calls changed()), so it is kept until the next warm-up time.
    _ready: tuple[int, float, float] | None = field(default=None, repr=False, compare=False)

    def changed(self) -> None:
        self._ready = None

    def request(self, count: int) -> GangRequest:
        return GangRequest(
            f"pool/{self.name}",
            groups=count,
            group_gpus=self.tp,
            gpus_per_pod=self.gpus_per_pod,
            accelerator=self.accelerator,
            priority=1000,
        )

    def ready(self, now: float) -> int:
        cached = self._ready
        if cached is not None and cached[1] <= now < cached[2]:
            return cached[0]
        count, next_warm = 0, float("inf")
        for r in self.replicas:
            if r.ready_at <= now:
                count += 1
            elif r.ready_at < next_warm:
                next_warm = r.ready_at
        self._ready = (count, now, next_warm)
        return count


@dataclass
class Totals:
    useful_work: float = 0.0  # goodput, GPU-seconds
    training_gpu_s: float = 0.0  # GPUs held by training, whatever they do
    stalled_gpu_s: float = 0.0  # held while restoring or writing a requested checkpoint
    inference_used_gpu_s: float = 0.0  # warm replicas the demand needs
    inference_gpu_s: float = 0.0  # every GPU held by a replica: used, loading, or ahead of demand
    cold_gpu_s: float = 0.0  # replicas loading their model
    idle_gpu_s: float = 0.0
    lost_failures_gpu_s: float = 0.0
    lost_preemption_gpu_s: float = 0.0
    demanded_gpu_s: float = 0.0
    served_gpu_s: float = 0.0
    slo_violation_s: float = 0.0  # time some pool has fewer warm replicas than its demand
    split_groups: int = 0
    evictions: int = 0  # jobs suspended or shrunk to make room for inference
    shrinks: int = 0
    grow_backs: int = 0
    flaps: int = 0  # the old count: a grow-back or restart within the hour after the save
    flaps_jobs: int = 0  # GPUs back to the same job within the hour of the eviction's decision
    flaps_replicas: int = 0  # inference replicas added and removed within the hour
    live_shrinks: int = 0
    live_grow_backs: int = 0
    restarts: int = 0  # after failures
    group_restarts: int = 0  # of those, re-placing only the broken groups
    budget_limited: int = 0  # plans cut short by the disruption budget
    waits: list[float] = field(default_factory=list)
    waits_unstarted: list[float] = field(default_factory=list)  # jobs never started: arrival to the horizon
    samples: list[dict[str, float]] = field(default_factory=list)


class Simulation:
    def __init__(
        self,
        snapshot: ClusterSnapshot,
        workload: Workload,
        policy,
        check_every_event: bool = False,
        costs: Costs | None = None,
    ):
        self.check_every_event = check_every_event
        self.costs = costs or Costs()
        self.snapshot = snapshot
        self.workload = workload
        self.policy = policy
        self.now = 0.0
        self.end = workload.days * 86400.0
        self.jobs: dict[str, Job] = {}
        self.queue: list[Job] = []
        self.pools = {p.name: Pool(p.name, p.tp, p.gpus_per_pod, p.accelerator) for p in workload.pools}
        self.node_names = list(snapshot.nodes)
        self.totals = Totals()
        self.total_gpus = snapshot.total_gpus()
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._last_accounting = 0.0
        self.usable_gpus = self.total_gpus  # kept as nodes fail and come back
        self.active: dict[str, Job] = {}  # restoring, running or checkpointing
        self.holds: dict[str, Counter[str]] = {}  # queued job -> GPUs booked for it (policies: Room)

    # -- events ------------------------------------------------------------------------------
    def push(self, at: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self) -> Totals:
        for a in self.workload.arrivals:
            self.push(a.at, "arrival", a)
        for f in self.workload.failures:
            self.push(f.at, "failure", f)
        for k in range(int(self.end // SYNC_S)):
            self.push(k * SYNC_S, "tick", k)
        self.policy.start(self)
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            if at >= self.end:
                break
            self._account(at)
            self.now = at
            getattr(self, f"_on_{kind}")(payload)
            if self.check_every_event:
                self.check_conservation()
                self.check_accounting()
        self._account(self.end)
        self.now = self.end
        for job in self.active.values():
            self._progress(job)
        self.totals.waits_unstarted = [
            self.end - j.arrival.at for j in self.jobs.values() if j.first_start is None and j.arrival.at < self.end
        ]
        return self.totals

    def _on_arrival(self, arrival: TrainingArrival) -> None:
        job = Job(arrival, dp=arrival.shape.dp, remaining=arrival.duration_s * arrival.shape.gpus)
        self.jobs[job.id] = job
        self.queue.append(job)
        self.policy.admit(self)

    def _on_finish(self, payload: tuple[str, int]) -> None:
        job = self.jobs[payload[0]]
        if job.version != payload[1] or job.state != "running":
            return
        self._progress(job)
        job.state = "done"
        self.active.pop(job.id, None)
        self._release_groups(job, job.groups)
        job.groups = []
        self.policy.admit(self)

    def _on_restored(self, payload: tuple[str, int]) -> None:
        job = self.jobs[payload[0]]
        if job.version != payload[1] or job.state != "restoring":
            return
        job.state = "running"
        if job.clock_kept:  # the work since the last periodic save is still unsaved
            job.running_since += self.now - job.restore_from
        else:
            job.running_since = self.now
        job.last_update = self.now
        self._schedule_finish(job)

    def _on_warm(self, _payload: object) -> None:
        pass  # a replica finished its cold start: accounting up to here has been done

    def _on_tick(self, k: int) -> None:
        self.policy.tick(self)
        self.policy.admit(self)
        if (k * SYNC_S) % WINDOW == 0:
            self._sample()

    def _on_joined(self, payload: tuple[str, int]) -> None:
        """Live replicas have started and fetched the state: the world rebuilds its communicators."""
        job = self.jobs[payload[0]]
        if job.version != payload[1] or job.state != "running":
            return
        self._restore(job, self.costs.rebuild_s, live=True)  # the joiners become members there

    def _on_failure(self, failure) -> None:
        name = self.node_names[failure.node_index % len(self.node_names)]
        node = self.snapshot.nodes[name]
        if not node.ready:
            return
        self.snapshot.update_node(name, ready=False)
        self.usable_gpus -= node.gpus
        self.push(self.now + failure.down_s, "repair", name)
        for pool in self.pools.values():
            for r in [r for r in pool.replicas if name in r.group.nodes]:
                self._release_group(r.group, pool.gpus_per_pod)
                pool.replicas.remove(r)
                pool.changed()
        for job in list(self.active.values()):
            broken = [g for g in job.groups if name in g.nodes]
            if broken:
                self._fail(job, broken)
        self.policy.admit(self)

    def _on_repair(self, name: str) -> None:
        self.snapshot.update_node(name, ready=True)
        self.usable_gpus += self.snapshot.nodes[name].gpus
        self.policy.admit(self)

    def _on_checkpointed(self, payload: tuple[str, int]) -> None:
        job = self.jobs[payload[0]]
        if job.version != payload[1] or job.state != "checkpointing":
            return
        self.evict_now(job)
        self.policy.after_checkpoint(self)

    # -- job lifecycle -----------------------------------------------------------------------
    def _progress(self, job: Job) -> None:
        done = job.rate * (self.now - job.last_update)
        job.remaining = max(job.remaining - done, 0.0)
        self.totals.useful_work += done
        job.last_update = self.now

    def _schedule_finish(self, job: Job) -> None:
        job.version += 1
        if job.rate > 0:
            self.push(self.now + job.remaining / job.rate, "finish", (job.id, job.version))

    def _restore(self, job: Job, stall_s: float, live: bool = False) -> None:
        """The job holds its GPUs and makes no progress for `stall_s`, then runs (Live replicas
        still joining are then members: every restore re-forms the whole world). `live`: a
        communicator rebuild, no checkpoint written or loaded."""
        self._progress(job)
        job.clock_kept = live and (job.state == "running" or job.clock_kept)
        if not (live and job.state == "restoring"):  # a rebuild inside a restore extends it
            job.restore_from = self.now
        job.joining_gpus = 0
        job.state = "restoring"
        job.overhead = self.costs.periodic_overhead(job.shape, job.gpus_held)
        job.version += 1
        self.push(self.now + stall_s, "restored", (job.id, job.version))

    def _note_up(self, job: Job) -> None:
        if job.down_at is not None and self.now - job.down_at < FLAP_WINDOW_S:
            self.totals.flaps += 1
        if job.down_decided_at is not None and self.now - job.down_decided_at < FLAP_WINDOW_S:
            self.totals.flaps_jobs += 1
        job.down_at = job.down_decided_at = None

    def start(self, job: Job, plan: PlacementPlan, dp: int, split_groups: int = 0) -> None:
        apply_plan(self.snapshot, plan)
        if job in self.queue:
            self.queue.remove(job)
        fresh = job.first_start is None
        if fresh:
            job.first_start = self.now
            self.totals.waits.append(self.now - job.arrival.at)
        self._note_up(job)
        job.groups = list(plan.groups)
        job.dp = dp
        job.split_groups = split_groups
        job.recovery = False
        self.totals.split_groups += split_groups
        job.efficiency = self.costs.split_efficiency if split_groups else 1.0
        self.active[job.id] = job
        job.last_update = self.now
        # A first start loads no checkpoint; a re-admission reloads one at the new size.
        self._restore(job, self.costs.restart_s if fresh else self.costs.restore_s(job.shape, job.gpus_held))

    def _lost_since_checkpoint(self, job: Job) -> float:
        """Work done since the last periodic save (to be redone), in progress units."""
        if job.state == "checkpointing":
            return job.unsaved
        if job.state != "running":
            return 0.0
        since = (self.now - job.running_since) % self.costs.checkpoint_every_s
        return since * job.rate

    def _lose(self, job: Job, preemption: bool) -> None:
        self._progress(job)
        lost = self._lost_since_checkpoint(job)
        if preemption:
            self.totals.lost_preemption_gpu_s += lost
        else:
            self.totals.lost_failures_gpu_s += lost
        job.remaining += lost
        self.totals.useful_work -= lost

    def _fail(self, job: Job, broken: list[GroupAssignment]) -> None:
        """As the operator does (restartPolicy scope Group): re-place only the broken groups,
        hot spares of the same supernode first; the whole job restarts from its last checkpoint.
        If the groups do not fit, the whole gang is released and queued as a recovery."""
        self._lose(job, preemption=False)
        self.totals.restarts += 1
        if job.state != "checkpointing":
            self._release_groups(job, broken)
            request = GangRequest(
                job.id,
                groups=len(broken),
                group_gpus=job.shape.group_gpus,
                gpus_per_pod=job.shape.gpus_per_pod,
                accelerator=job.arrival.accelerator,
                priority=job.arrival.priority,
                recovery=True,
                prefer_supernodes=tuple(dict.fromkeys(g.supernode for g in broken)),
                group_ids=tuple(g.group for g in broken),
            )
            plan = plan_gang(self.snapshot, request)
            ids = {g.group for g in broken}
            job.groups = [g for g in job.groups if g.group not in ids]
            if isinstance(plan, PlacementPlan):
                apply_plan(self.snapshot, plan)
                job.groups = sorted(job.groups + list(plan.groups), key=lambda g: g.group)
                self.totals.group_restarts += 1
                self._restore(job, self.costs.restore_s(job.shape, job.gpus_held))
                return
        self._requeue(job)
        job.recovery = True

    def _requeue(self, job: Job) -> None:
        self._release_groups(job, job.groups)
        job.groups = []
        job.state = "queued"
        job.joining_gpus = 0
        self.active.pop(job.id, None)
        job.version += 1
        job.evicting = ()
        self.queue.append(job)

    def kill(self, job: Job) -> None:
        """Evict for capacity without a checkpoint: the work since the last periodic save is lost."""
        self._lose(job, preemption=True)
        self.totals.evictions += 1
        job.down_at = job.down_decided_at = self.now
        self._requeue(job)

    def request_checkpoint(self, job: Job, replicas: tuple[int, ...]) -> None:
        """Checkpoint first: the job stops and keeps its GPUs while its state is written (a
        time that grows with the model), then gives back the replicas (or all) and loses nothing.
        A Live job's shrink needs no checkpoint: the leaving replicas go at once (`live_shrink`)."""
        self._progress(job)
        job.down_decided_at = self.now
        if replicas and len(replicas) < job.dp and job.resize == ResizeKind.LIVE and job.state == "running":
            self.live_shrink(job, replicas)
            return
        if job.state == "restoring":  # nothing new to save: it is still loading the last one
            job.evicting = replicas
            self.evict_now(job)
            return
        job.unsaved = self._lost_since_checkpoint(job)
        job.state = "checkpointing"
        job.evicting = replicas
        job.version += 1
        self.push(self.now + self.costs.save_s(job.shape, job.gpus_held), "checkpointed", (job.id, job.version))

    def evict_now(self, job: Job) -> None:
        self.totals.evictions += 1
        job.down_at = self.now
        if job.evicting and len(job.evicting) < job.dp:
            self._give_back(job, job.evicting)
            # The remaining replicas restart from the checkpoint just written, at the new size.
            self._restore(job, self.costs.restore_s(job.shape, job.gpus_held))
        else:
            self._requeue(job)

    def _give_back(self, job: Job, replicas: tuple[int, ...]) -> None:
        """Release the DP replicas `replicas` of a shrinking job (a shrink, not a suspension)."""
        gone = set(replicas)
        per = job.groups_per_replica
        self._release_groups(job, [g for g in job.groups if g.group // per in gone])
        job.groups = [g for g in job.groups if g.group // per not in gone]
        job.dp -= len(gone)
        job.evicting = ()
        self.totals.shrinks += 1

    def live_shrink(self, job: Job, replicas: tuple[int, ...]) -> None:
        """Live: the leaving replicas go now; the survivors keep the state and stall only for a
        communicator rebuild. Nothing is written and nothing is lost."""
        self.totals.evictions += 1
        self.totals.live_shrinks += 1
        job.down_at = self.now
        self._give_back(job, replicas)
        # Replicas still joining (a Live grow under way) finish their start and transfer first.
        joining = max(job.join_end - self.now, 0.0) if job.joining_gpus else 0.0
        self._restore(job, joining + self.costs.rebuild_s, live=True)

    def grow(self, job: Job, plan: PlacementPlan, dp: int) -> None:
        """Add DP replicas to a running job. Restart: it checkpoints, then restarts at the new
        size. Live: the survivors train on while the new replicas start and fetch the state from
        peers (held, not training), then everyone stalls for one communicator rebuild."""
        self._progress(job)
        added = len(plan.groups) * job.group_gpus
        saving = self.costs.save_s(job.shape, job.gpus_held)
        apply_plan(self.snapshot, plan)
        job.groups = sorted(job.groups + list(plan.groups), key=lambda g: g.group)
        job.dp = dp
        self.totals.grow_backs += 1
        self._note_up(job)
        if job.resize == ResizeKind.LIVE and job.state == "running":
            self.totals.live_grow_backs += 1
            job.joining_gpus = added
            job.overhead = self.costs.periodic_overhead(job.shape, job.gpus_held)
            self._schedule_finish(job)  # the same work at the survivors' rate until the join
            join = self.costs.restart_s + self.costs.transfer_seconds(job.model_gpus)
            job.join_end = self.now + join
            self.push(job.join_end, "joined", (job.id, job.version))
            return
        job.joining_gpus = 0
        self._restore(job, saving + self.costs.restore_s(job.shape, job.gpus_held))

    def _release_group(self, group: GroupAssignment, gpus_per_pod: int) -> None:
        for node in group.nodes:
            self.snapshot.release(node, gpus_per_pod)

    def _release_groups(self, job: Job, groups: list[GroupAssignment]) -> None:
        for g in groups:
            self._release_group(g, job.shape.gpus_per_pod)

    # -- inference replicas ------------------------------------------------------------------
    def add_replicas(self, pool: Pool, groups: tuple[GroupAssignment, ...] | list[GroupAssignment]) -> None:
        ready = self.now + self.costs.cold_start_s
        pool.replicas += [Replica(g, ready, self.now) for g in groups]
        pool.changed()
        if groups and self.costs.cold_start_s > 0:
            self.push(ready, "warm")

    def remove_replicas(self, pool: Pool, target: int) -> None:
        """Down to `target` replicas: those still loading go first (the last started first),
        then the newest. One pass from the end, in the order the replicas are released."""
        excess = len(pool.replicas) - target
        if excess <= 0:
            return
        replicas = pool.replicas
        gone: list[int] = []
        for i in range(len(replicas) - 1, -1, -1):
            if len(gone) == excess:
                break
            if replicas[i].ready_at > self.now:
                gone.append(i)
        if len(gone) < excess:
            cold = set(gone)
            for i in range(len(replicas) - 1, -1, -1):
                if len(gone) == excess:
                    break
                if i not in cold:
                    gone.append(i)
        for i in gone:
            self._release_group(replicas[i].group, pool.gpus_per_pod)
            if self.now - replicas[i].added_at < FLAP_WINDOW_S:
                self.totals.flaps_replicas += 1
        dropped = set(gone)
        pool.replicas = [r for i, r in enumerate(replicas) if i not in dropped]
        pool.changed()

    def running_gangs(self) -> list[RunningGang]:
        gangs = []
        for job in self.active.values():
            if job.state not in ("running", "restoring") or not job.groups:
                continue
            cached = job.gang
            if cached is not None and cached[0] is job.groups and cached[1] == job.dp:
                gangs.append(cached[2])
                continue
            per = job.groups_per_replica
            replicas: list[list[tuple[str, int]]] = [[] for _ in range(job.dp)]
            for g in job.groups:
                replicas[min(g.group // per, job.dp - 1)].extend((n, job.shape.gpus_per_pod) for n in g.nodes)
            gang = RunningGang(
                job.id,
                job.arrival.priority,
                job.arrival.preemptible,
                tuple(tuple(r) for r in replicas),
                job.arrival.min_dp,
                resize=job.resize,
            )
            job.gang = (job.groups, job.dp, gang)
            gangs.append(gang)
        return gangs

    # -- accounting --------------------------------------------------------------------------
    def inference_gpus(self) -> int:
        return sum(len(p.replicas) * p.tp for p in self.pools.values())

    def training_gpus(self) -> int:
        return sum(j.gpus_held for j in self.active.values())

    def demand(self, pool: Pool, at: float | None = None) -> int:
        """The true demand: for the accounting only. A policy reads `observed`."""
        return self.workload.desired_at(pool.name, self.now if at is None else at)

    def observed(self, pool: Pool) -> int:
        """Replicas an autoscaler asks for now: the demand's mean over the last metric window
        (rounded up, since a replica serves whole; the last minute at the default).
        Before a minute has passed, the first minute stands for the steady state the run starts in."""
        start = max(self.now - METRIC_WINDOW_S, 0.0)
        step = self.workload.demand_step_s
        points = {start + k * step for k in range(int(METRIC_WINDOW_S // step) + 1) if start + k * step < self.now}
        if not points:
            return self.workload.desired_at(pool.name, start)
        values = [self.workload.desired_at(pool.name, t) for t in points]
        return math.ceil(sum(values) / len(values) - 1e-9)

    def _account(self, until: float) -> None:
        dt_s = until - self._last_accounting
        if dt_s <= 0:
            return
        t = self._last_accounting
        training = stalled = 0
        for job in self.active.values():  # every event: the property calls inlined
            held = len(job.groups) * job.group_gpus
            training += held
            if job.state != "running":
                stalled += held
            else:
                stalled += job.joining_gpus
        inference = short = 0
        tot = self.totals
        for pool in self.pools.values():
            warm = pool.ready(t) * pool.tp
            demanded = self.demand(pool, t) * pool.tp
            inference += len(pool.replicas) * pool.tp
            tot.cold_gpu_s += (len(pool.replicas) * pool.tp - warm) * dt_s
            tot.inference_used_gpu_s += min(warm, demanded) * dt_s
            tot.demanded_gpu_s += demanded * dt_s
            tot.served_gpu_s += min(warm, demanded) * dt_s
            short = short or warm < demanded
        tot.training_gpu_s += training * dt_s
        tot.inference_gpu_s += inference * dt_s
        tot.stalled_gpu_s += stalled * dt_s
        tot.idle_gpu_s += max(self.usable_gpus - training - inference, 0) * dt_s
        if short:
            tot.slo_violation_s += dt_s
        self._last_accounting = until

    def _sample(self) -> None:
        free_by_supernode = [self.snapshot.largest_free_slice(s) for s in self.snapshot.supernodes]
        stranded = sum(f for f in free_by_supernode if f < 64)
        failed = sum(n.gpus for n in self.snapshot.nodes.values() if not n.ready)
        self.totals.samples.append(
            {
                "t": self.now,
                "training": self.training_gpus(),
                "inference": self.inference_gpus(),
                "failed": failed,
                "idle": max(self.total_gpus - failed - self.training_gpus() - self.inference_gpus(), 0),
                "stranded_free": stranded,
                "queued": len(self.queue),
            }
        )

    def hold(self, job_id: str, wanted: Counter[str]) -> None:
        """Book for queued `job_id` the free GPUs of `wanted` (node -> GPUs) it does not hold yet:
        room its preemption made, kept from every other job until it starts."""
        have = self.holds.setdefault(job_id, Counter())
        for name, gpus in wanted.items():
            node = self.snapshot.nodes.get(name)
            take = min(node.free, gpus - have[name]) if node is not None else 0
            if take > 0:
                self.snapshot.allocate(name, take)
                have[name] += take

    def release_hold(self, job_id: str) -> None:
        for name, gpus in self.holds.pop(job_id, Counter()).items():
            self.snapshot.release(name, gpus)

    def check_conservation(self) -> None:
        """Every booked GPU belongs to exactly one job or replica (or is held for a queued job
        room is made for), and no node is over-booked."""
        held: Counter[str] = Counter()
        for hold in self.holds.values():
            held.update(hold)
        for job in self.jobs.values():
            for g in job.groups:
                for n in g.nodes:
                    held[n] += job.shape.gpus_per_pod
        for pool in self.pools.values():
            for r in pool.replicas:
                for n in r.group.nodes:
                    held[n] += pool.gpus_per_pod
        for name, node in self.snapshot.nodes.items():
            assert node.allocated == held[name], f"{name}: booked {node.allocated}, held {held[name]}"
            assert node.allocated <= node.gpus, f"{name} over-booked"

    def check_accounting(self) -> None:
        """Every job that arrived is in exactly one place: queued, active, or done."""
        queued = {j.id for j in self.queue}
        assert len(queued) == len(self.queue), "a job is queued twice"
        assert not queued & set(self.active), "a job is both queued and running"
        for job in self.jobs.values():
            where = "queued" if job.id in queued else "active" if job.id in self.active else job.state
            assert where in ("queued", "active", "done"), f"{job.id} is lost ({job.state})"
            if job.state == "done":
                assert not job.groups and job.remaining <= 1e-6 * job.arrival.duration_s * job.shape.gpus + 1
            if job.id in self.active:
                assert job.state in ("restoring", "running", "checkpointing") and job.groups

    def wall_clock(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.now)
