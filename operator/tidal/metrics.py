"""Prometheus metrics, refreshed after every controller cycle from what the cycle saw and did.

Gauges describe the cluster as of the last cycle; counters and histograms accumulate events.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client import Counter as PromCounter

from tidal.clock import parse_time
from tidal.k8s.pools import pool_allocations
from tidal.k8s.training import allocations

if TYPE_CHECKING:
    from tidal.k8s.controller import Controller, CycleReport
    from tidal.k8s.state import ClusterState

MOVES = (
    ("to-inference", "free"),
    ("from-training", "shrink"),
    ("from-training", "suspend"),
    ("to-training", "scale-down"),
    ("to-training", "expand"),
)
PENDING_REASONS = (
    "InsufficientFreeCapacity",
    "WaitingForPreemption",
    "LargerThanCluster",
    "GroupLargerThanSupernodes",
    "PodLargerThanNodes",
    "NoMatchingSupernodes",
    "InvalidSpec",
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.supernode_gpus = Gauge(
            "tidal_supernode_gpus", "Accelerators of a supernode by state", ["supernode", "state"], registry=r
        )
        self.largest_free_slice = Gauge(
            "tidal_supernode_largest_free_slice_gpus",
            "Free accelerators one HBD group could use in the supernode",
            ["supernode"],
            registry=r,
        )
        self.supernode_fragmentation = Gauge(
            "tidal_supernode_fragmentation_ratio",
            "Share of the supernode's free accelerators that sit on partly used nodes",
            ["supernode"],
            registry=r,
        )
        self.fragmentation = Gauge(
            "tidal_fragmentation_ratio", "1 - (largest free slice / all free accelerators), cluster-wide", registry=r
        )
        self.gpus = Gauge("tidal_gpus", "Accelerators in supernodes by workload class", ["class"], registry=r)
        self.jobs = Gauge("tidal_jobs", "tidal workloads by kind and phase", ["kind", "phase"], registry=r)
        self.placement = Histogram(
            "tidal_placement_duration_seconds", "Time to plan one gang", buckets=LATENCY_BUCKETS, registry=r
        )
        self.pending = Histogram(
            "tidal_pending_duration_seconds",
            "Time a workload waited before admission",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.oldest_pending = Gauge(
            "tidal_oldest_pending_seconds", "Age of the longest-waiting pending job", registry=r
        )
        self.preemptions = PromCounter(
            "tidal_preemptions_total", "Gangs or DP replicas chosen for eviction", ["reason"], registry=r
        )
        self.rebalance_moves = PromCounter(
            "tidal_rebalance_moves_total", "Capacity moved by the rebalancer", ["direction", "reason"], registry=r
        )
        self.checkpoint_wait = Histogram(
            "tidal_checkpoint_wait_seconds", "From checkpoint request to eviction", buckets=WAIT_BUCKETS, registry=r
        )
        self.hbd_violations = PromCounter(
            "tidal_hbd_violations_total",
            "HBD groups seen running across more than one supernode (must stay 0)",
            registry=r,
        )
        self.restarts = PromCounter("tidal_restarts_total", "Workload restarts after failures", registry=r)
        self.overbooked = Gauge(
            "tidal_overbooked_gpus", "Accelerators booked beyond node capacity (must be 0)", registry=r
        )
        self.api_requests = Gauge(
            "tidal_api_requests", "API requests made by the operator since start", ["verb"], registry=r
        )
        self.cycle = Histogram(
            "tidal_cycle_duration_seconds",
            "Duration of one controller cycle",
            buckets=(*LATENCY_BUCKETS, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.cycles = PromCounter("tidal_cycles_total", "Controller cycles run", registry=r)
        self.pending_jobs = Gauge(
            "tidal_pending_jobs", "Pending TrainingJobs by the reason they wait", ["reason"], registry=r
        )
        self._violating: set[tuple[str, str, int]] = set()
        # Every known series exists from the start, so dashboards and alerts see 0, not "no data".
        for direction, reason in MOVES:
            self.rebalance_moves.labels(direction=direction, reason=reason)
        self.preemptions.labels(reason="priority")
        for reason in PENDING_REASONS:
            self.pending_jobs.labels(reason=reason)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    # -- per cycle --------------------------------------------------------------------------
    def observe(self, controller: Controller, state: ClusterState, report: CycleReport) -> None:
        cyc = report.cycle
        if cyc is None:
            return
        snapshot = cyc.snapshot
        self.cycles.inc()
        self.cycle.observe(report.seconds)
        self.overbooked.set(report.overbooked_gpus)
        for ms in cyc.placements_ms:
            self.placement.observe(ms / 1000)
        for waited in cyc.pending_waits:
            self.pending.observe(waited)
        for waited in cyc.checkpoint_waits:
            self.checkpoint_wait.observe(waited)
        for key, n in cyc.counters.items():
            if key == "preemptions":
                self.preemptions.labels(reason="priority").inc(n)
            elif key == "restarts":
                self.restarts.inc(n)
            elif key.startswith("moves:"):
                _, direction, reason = key.split(":", 2)
                self.rebalance_moves.labels(direction=direction, reason=reason).inc(n)
        for verb, n in controller.api.requests.items():
            self.api_requests.labels(verb=verb).set(n)

        total_free = 0
        largest = 0
        for name in snapshot.supernodes:
            t = snapshot.supernode_totals(name)
            for state_name, value in (
                ("total", t.total),
                ("allocated", t.allocated),
                ("free", t.free),
                ("failed", t.failed),
                ("spare", t.spare),
            ):
                self.supernode_gpus.labels(supernode=name, state=state_name).set(value)
            free_slice = snapshot.largest_free_slice(name)
            self.largest_free_slice.labels(supernode=name).set(free_slice)
            on_partial = sum(n.free for n in snapshot.member_nodes(name) if n.allocated > 0 and n.free)
            self.supernode_fragmentation.labels(supernode=name).set(on_partial / t.free if t.free else 0.0)
            total_free += t.free
            largest = max(largest, free_slice)
        self.fragmentation.set(1 - largest / total_free if total_free else 0.0)

        classes = self._gpus_by_class(report, snapshot)
        for cls, value in classes.items():
            self.gpus.labels(**{"class": cls}).set(value)
        self._jobs(report, state)
        self._hbd_violations(state, cyc.members)

    def _gpus_by_class(self, report: CycleReport, snapshot: Any) -> dict[str, int]:
        # The same bookkeeping as the snapshot: a workload being deleted no longer holds GPUs.
        training = sum(
            g for view, status in report.statuses.values() if not view.deleting for _, g in allocations(view, status)
        )
        inference = sum(
            g for view, status in report.pools.values() if not view.deleting for _, g in pool_allocations(view, status)
        )
        allocated = snapshot.allocated_gpus()
        usable = sum(n.gpus for n in snapshot.nodes.values() if n.usable)
        failed = sum(n.gpus for n in snapshot.nodes.values() if not n.usable)
        return {
            "training": training,
            "inference": inference,
            "other": max(allocated - training - inference, 0),
            "idle": max(usable - allocated, 0),
            "failed": failed,
        }

    def _jobs(self, report: CycleReport, state: ClusterState) -> None:
        counts: Counter[tuple[str, str]] = Counter()
        oldest = 0.0
        cyc = report.cycle
        for _, status in report.statuses.values():
            phase = status.get("phase") or "Pending"
            counts[("TrainingJob", phase)] += 1
            if phase == "Pending" and cyc is not None:
                since = parse_time(status.get("pendingSince"))
                if since is not None:
                    oldest = max(oldest, (cyc.now - since).total_seconds())
        for _, status in report.pools.values():
            scaled = status.get("placedReplicas", 0) >= status.get("desiredReplicas", 0)
            counts[("InferencePool", "Scaled" if scaled else "BelowDesired")] += 1
        pending: Counter[str] = Counter()
        for _, status in report.statuses.values():
            if (status.get("phase") or "Pending") == "Pending":
                cond = next((c for c in status.get("conditions", []) if c.get("type") == "Schedulable"), None)
                pending[(cond or {}).get("reason") or "Queued"] += 1
        for reason in {*PENDING_REASONS, *pending}:
            self.pending_jobs.labels(reason=reason).set(pending.get(reason, 0))
        self.jobs.clear()
        for (kind, phase), n in counts.items():
            self.jobs.labels(kind=kind, phase=phase).set(n)
        self.oldest_pending.set(oldest)

    def _hbd_violations(self, state: ClusterState, members: dict[str, Any]) -> None:
        """Count each (workload, group) seen bound across two supernodes once."""
        supernode_of = {node: m.supernode for m in members.values() for node in m.nodes}
        seen: dict[tuple[str, str, int], set[str]] = {}
        for pod in state.pods.values():
            if pod.owner is None or pod.group is None or not pod.bound or not pod.active:
                continue
            key = (pod.namespace, pod.owner[1], pod.group)
            seen.setdefault(key, set()).add(supernode_of.get(pod.node or "", "?"))
        for key, supernodes in seen.items():
            if len(supernodes) > 1 and key not in self._violating:
                self._violating.add(key)
                self.hbd_violations.inc()
