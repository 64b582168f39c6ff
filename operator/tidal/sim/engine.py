"""Discrete-event simulation of one scheduling policy on one fleet, deterministic for a seed.

Events: training arrivals, job completions, node failures and repairs, checkpoints finishing, and
a tick every 10 minutes (the traces' resolution) when inference demand changes. Placement and
rebalancing call tidal.placement and tidal.rebalance unchanged.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field

from tidal.placement import GangRequest, GroupAssignment, PlacementPlan, RunningGang, apply_plan
from tidal.sim.workload import POOLS, WINDOW, TrainingArrival, Workload
from tidal.topology.snapshot import ClusterSnapshot

CHECKPOINT_EVERY_S = 1800.0
"""Jobs save progress every 30 minutes; a failure loses what was done since the last save."""
CHECKPOINT_WAIT_S = 120.0
"""A checkpoint requested before an eviction takes this long; the GPUs stay busy meanwhile."""
SPLIT_EFFICIENCY = 0.3
"""Throughput of a job with an HBD group split across supernodes: its tensor-parallel traffic
crosses the scale-out network (~10x less bandwidth). An assumption, stated with the results."""
EPOCH = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # the traces' day 0, 00:00 local time


@dataclass
class Job:
    arrival: TrainingArrival
    dp: int
    state: str = "queued"  # queued | running | checkpointing | done
    groups: list[GroupAssignment] = field(default_factory=list)
    remaining: float = 0.0  # GPU-seconds of work at full efficiency and full DP
    efficiency: float = 1.0
    segment_start: float = 0.0  # progress is saved every CHECKPOINT_EVERY_S from here
    last_update: float = 0.0
    version: int = 0
    first_start: float | None = None
    evicting: tuple[int, ...] = ()  # DP replicas to give back after the checkpoint; () = all
    split_groups: int = 0

    @property
    def id(self) -> str:
        return f"job-{self.arrival.job_id}"

    @property
    def shape(self):
        return self.arrival.shape

    @property
    def gpus_held(self) -> int:
        return len(self.groups) * self.shape.group_gpus

    @property
    def rate(self) -> float:
        if self.state != "running":
            return 0.0
        return self.gpus_held * self.efficiency

    @property
    def groups_per_replica(self) -> int:
        return self.shape.groups // self.shape.dp


@dataclass
class Pool:
    name: str
    tp: int
    gpus_per_pod: int
    replicas: list[GroupAssignment] = field(default_factory=list)
    waiting: int = 0  # replicas whose room is being freed by checkpointing training

    def request(self, count: int) -> GangRequest:
        return GangRequest(
            f"pool/{self.name}", groups=count, group_gpus=self.tp, gpus_per_pod=self.gpus_per_pod, priority=1000
        )


@dataclass
class Totals:
    training_gpu_s: float = 0.0
    inference_used_gpu_s: float = 0.0
    idle_gpu_s: float = 0.0
    useful_work: float = 0.0
    lost_failures_gpu_s: float = 0.0
    lost_preemption_gpu_s: float = 0.0
    demanded_gpu_windows: float = 0.0
    served_gpu_windows: float = 0.0
    split_groups: int = 0
    waits: list[float] = field(default_factory=list)
    samples: list[dict[str, float]] = field(default_factory=list)


class Simulation:
    def __init__(self, snapshot: ClusterSnapshot, workload: Workload, policy, check_every_event: bool = False):
        self.check_every_event = check_every_event
        self.snapshot = snapshot
        self.workload = workload
        self.policy = policy
        self.now = 0.0
        self.end = workload.days * 86400.0
        self.jobs: dict[str, Job] = {}
        self.queue: list[Job] = []
        self.pools = {p.name: Pool(p.name, p.tp, p.gpus_per_pod) for p in POOLS}
        self.node_names = list(snapshot.nodes)
        self.totals = Totals()
        self.total_gpus = snapshot.total_gpus()
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._last_accounting = 0.0
        self.usable_gpus = self.total_gpus  # kept as nodes fail and come back
        self.active: dict[str, Job] = {}  # running or checkpointing

    # -- events ------------------------------------------------------------------------------
    def push(self, at: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self) -> Totals:
        for a in self.workload.arrivals:
            self.push(a.at, "arrival", a)
        for f in self.workload.failures:
            self.push(f.at, "failure", f)
        for w in range(int(self.end // WINDOW)):
            self.push(w * WINDOW, "tick", w)
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
        for job in self.active.values():
            self._progress(job)
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

    def _on_tick(self, window: int) -> None:
        self.policy.tick(self)
        self.policy.admit(self)
        # Demand met is judged once the policy has acted on the window's demand.
        for pool in self.pools.values():
            desired = self.workload.desired_at(pool.name, self.now) * pool.tp
            self.totals.demanded_gpu_windows += desired
            self.totals.served_gpu_windows += min(len(pool.replicas) * pool.tp, desired)
        self._sample()

    def _on_failure(self, failure) -> None:
        name = self.node_names[failure.node_index % len(self.node_names)]
        node = self.snapshot.nodes[name]
        if not node.ready:
            return
        self.snapshot.update_node(name, ready=False)
        self.usable_gpus -= node.gpus
        self.push(self.now + failure.down_s, "repair", name)
        for pool in self.pools.values():
            lost = [r for r in pool.replicas if name in r.nodes]
            for r in lost:
                self._release_group(r, pool.gpus_per_pod)
                pool.replicas.remove(r)
        for job in list(self.active.values()):
            if any(name in g.nodes for g in job.groups):
                self._fail(job)
        self.policy.admit(self)

    def _on_repair(self, name: str) -> None:
        self.snapshot.update_node(name, ready=True)
        self.usable_gpus += self.snapshot.nodes[name].gpus
        self.policy.admit(self)

    def _on_checkpointed(self, payload: tuple[str, int]) -> None:
        job = self.jobs[payload[0]]
        if job.version != payload[1] or job.state != "checkpointing":
            return
        self.evict_now(job, checkpointed=True)
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

    def start(self, job: Job, plan: PlacementPlan, dp: int, split_groups: int = 0) -> None:
        apply_plan(self.snapshot, plan)
        if job in self.queue:
            self.queue.remove(job)
        if job.first_start is None:
            job.first_start = self.now
            self.totals.waits.append(self.now - job.arrival.at)
        job.groups = list(plan.groups)
        job.dp = dp
        job.split_groups = split_groups
        self.totals.split_groups += split_groups
        job.efficiency = SPLIT_EFFICIENCY if split_groups else 1.0
        job.state = "running"
        self.active[job.id] = job
        job.last_update = job.segment_start = self.now
        self._schedule_finish(job)

    def _lost_since_checkpoint(self, job: Job) -> float:
        """GPU-seconds done since the last periodic save (to be redone)."""
        since = (self.now - job.segment_start) % CHECKPOINT_EVERY_S
        return since * job.gpus_held

    def _fail(self, job: Job) -> None:
        self._progress(job)
        lost = self._lost_since_checkpoint(job) if job.state == "running" else 0.0
        self.totals.lost_failures_gpu_s += lost
        job.remaining += lost * job.efficiency
        self.totals.useful_work -= lost * job.efficiency
        self._requeue(job)

    def _requeue(self, job: Job) -> None:
        self._release_groups(job, job.groups)
        job.groups = []
        job.state = "queued"
        self.active.pop(job.id, None)
        job.version += 1
        job.evicting = ()
        self.queue.append(job)

    def kill(self, job: Job) -> None:
        """Evict without a checkpoint (schedulers that do not know about checkpoints)."""
        self._progress(job)
        lost = self._lost_since_checkpoint(job)
        self.totals.lost_preemption_gpu_s += lost
        job.remaining += lost * job.efficiency
        self.totals.useful_work -= lost * job.efficiency
        self._requeue(job)

    def request_checkpoint(self, job: Job, replicas: tuple[int, ...]) -> None:
        """Checkpoint first: the job stops, keeps its GPUs for CHECKPOINT_WAIT_S, loses nothing."""
        self._progress(job)
        job.state = "checkpointing"
        job.evicting = replicas
        job.version += 1
        self.push(self.now + CHECKPOINT_WAIT_S, "checkpointed", (job.id, job.version))

    def evict_now(self, job: Job, checkpointed: bool) -> None:
        if job.evicting and len(job.evicting) < job.dp:
            gone = set(job.evicting)
            keep = [g for g in job.groups if g.group // job.groups_per_replica not in gone]
            self._release_groups(job, [g for g in job.groups if g.group // job.groups_per_replica in gone])
            job.groups = keep
            job.dp -= len(gone)
            job.evicting = ()
            job.state = "running"
            job.last_update = job.segment_start = self.now
            self._schedule_finish(job)
        else:
            self._requeue(job)

    def grow(self, job: Job, plan: PlacementPlan, dp: int) -> None:
        self._progress(job)
        apply_plan(self.snapshot, plan)
        job.groups += list(plan.groups)
        job.dp = dp
        job.last_update = self.now
        self._schedule_finish(job)

    def _release_group(self, group: GroupAssignment, gpus_per_pod: int) -> None:
        for node in group.nodes:
            self.snapshot.release(node, gpus_per_pod)

    def _release_groups(self, job: Job, groups: list[GroupAssignment]) -> None:
        for g in groups:
            self._release_group(g, job.shape.gpus_per_pod)

    def running_gangs(self) -> list[RunningGang]:
        gangs = []
        for job in self.active.values():
            if job.state != "running" or not job.groups:
                continue
            per = job.groups_per_replica
            replicas: list[list[tuple[str, int]]] = [[] for _ in range(job.dp)]
            for g in job.groups:
                replicas[min(g.group // per, job.dp - 1)].extend((n, job.shape.gpus_per_pod) for n in g.nodes)
            gangs.append(
                RunningGang(
                    job.id,
                    job.arrival.priority,
                    job.arrival.preemptible,
                    tuple(tuple(r) for r in replicas),
                    job.arrival.min_dp,
                )
            )
        return gangs

    # -- accounting --------------------------------------------------------------------------
    def inference_gpus(self) -> int:
        return sum(len(p.replicas) * p.tp for p in self.pools.values())

    def training_gpus(self) -> int:
        return sum(j.gpus_held for j in self.active.values())

    def _account(self, until: float) -> None:
        dt_s = until - self._last_accounting
        if dt_s <= 0:
            return
        training, inference = self.training_gpus(), self.inference_gpus()
        usable = self.usable_gpus
        demanded = sum(self.workload.desired_at(p.name, self._last_accounting) * p.tp for p in self.pools.values())
        self.totals.training_gpu_s += training * dt_s
        self.totals.inference_used_gpu_s += min(inference, demanded) * dt_s
        self.totals.idle_gpu_s += max(usable - training - inference, 0) * dt_s
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

    def check_conservation(self) -> None:
        """Every booked GPU belongs to exactly one job or replica, and no node is over-booked."""
        held: Counter[str] = Counter()
        for job in self.jobs.values():
            for g in job.groups:
                for n in g.nodes:
                    held[n] += job.shape.gpus_per_pod
        for pool in self.pools.values():
            for r in pool.replicas:
                for n in r.nodes:
                    held[n] += pool.gpus_per_pod
        for name, node in self.snapshot.nodes.items():
            assert node.allocated == held[name], f"{name}: booked {node.allocated}, held {held[name]}"
            assert node.allocated <= node.gpus, f"{name} over-booked"

    def check_accounting(self) -> None:
        """Every job that arrived is in exactly one place: queued, running/checkpointing, or done."""
        queued = {j.id for j in self.queue}
        assert len(queued) == len(self.queue), "a job is queued twice"
        assert not queued & set(self.active), "a job is both queued and running"
        for job in self.jobs.values():
            where = "queued" if job.id in queued else "active" if job.id in self.active else job.state
            assert where in ("queued", "active", "done"), f"{job.id} is lost ({job.state})"
            if job.state == "done":
                assert not job.groups and job.remaining <= 1e-6 * job.arrival.duration_s * job.shape.gpus + 1
            if job.id in self.active:
                assert job.state in ("running", "checkpointing") and job.groups

    def wall_clock(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.now)
