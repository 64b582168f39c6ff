"""Prometheus metrics.

Gauges (supernode GPUs, fragmentation, workload classes and phases, pending reasons, over-booking,
HBD violations) are computed at scrape time by a custom collector over the controller's cache and
snapshot, never inside the cycle: a cycle at 25,000 nodes and 100,000 pods must not also walk them
for metrics. The collector takes the controller's lock (a scrape waits for a running cycle to end;
a cycle that finds a scrape running skips that tick). Counters and histograms of things that
happened (placements, preemptions, restarts, moves, cycle durations) are fed after each cycle from
the cycle's own short lists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidal.clock import parse_time
from tidal.k8s.admission import is_queued
from tidal.k8s.cycle import LOST_PODS_DELETED
from tidal.k8s.live_resize import LIVE_RESIZE_FALLBACKS, LIVE_RESIZES
from tidal.k8s.pools import pool_allocations
from tidal.k8s.training import allocations
from tidal.placement.defrag import stranded_free_gpus
from tidal.placement.shape import GangShape

if TYPE_CHECKING:
    from tidal.k8s.controller import Controller, CycleReport

MOVES = (
    ("to-inference", "free"),
    ("from-training", "shrink"),
    ("from-training", "suspend"),
    ("to-training", "scale-down"),
    ("to-training", "expand"),
)
EVICTION_REASONS = ("Preempted", "Defragmented", "Rebalanced", "Suspended")
EVICTION_OUTCOMES = ("whole", "shrink", "cancelled", "taken_over")
PENDING_REASONS = (
    "InsufficientFreeCapacity",
    "WaitingForPreemption",
    "WaitingForDefragmentation",
    "LargerThanCluster",
    "GroupLargerThanSupernodes",
    "PodLargerThanNodes",
    "NoMatchingSupernodes",
    "InvalidSpec",
)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)


SCRAPE_LOCK_SECONDS = 5.0


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.placement = Histogram(
            "tidal_placement_duration_seconds", "Time to plan one gang", buckets=LATENCY_BUCKETS, registry=r
        )
        self.pending = Histogram(
            "tidal_pending_duration_seconds",
            "Time a workload waited before admission",
            buckets=WAIT_BUCKETS,
            registry=r,
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
        self.restarts = PromCounter("tidal_restarts_total", "Workload restarts after failures", registry=r)
        self.live_resizes = PromCounter(
            "tidal_live_resizes_total",
            "Live shrinks started (spec.elastic.resize: Live; no checkpoint request), by reason",
            ["reason"],
            registry=r,
        )
        self.live_fallbacks = PromCounter(
            "tidal_live_resize_fallbacks_total",
            "Live shrinks that fell back to checkpoint-first: a survivor did not acknowledge in time",
            registry=r,
        )
        self.pods_forced = PromCounter(
            "tidal_lost_pods_deleted_total",
            "Pods deleted by force (grace 0) because their node is gone or fenced (NotReady, out-of-service)",
            registry=r,
        )
        self.cycle = Histogram(
            "tidal_cycle_duration_seconds",
            "Duration of one controller cycle",
            buckets=(*LATENCY_BUCKETS, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.cycles = PromCounter("tidal_cycles_total", "Controller cycles run", registry=r)
        self.defrag_moves = PromCounter(
            "tidal_defrag_moves_total",
            "Gangs (or elastic DP replicas) moved checkpoint-first so a fragmentation-blocked gang fits",
            registry=r,
        )
        self.evictions = PromCounter(
            "tidal_evictions_total",
            "Checkpoint-first evictions by how they ended: whole, shrink, cancelled (called off before any "
            "pod went) or taken_over (called off, then taken over by another plan on the same request)",
            ["reason", "outcome"],
            registry=r,
        )
        # Every known series exists from the start, so dashboards and alerts see 0, not "no data".
        for reason in EVICTION_REASONS:
            for outcome in EVICTION_OUTCOMES:
                self.evictions.labels(reason=reason, outcome=outcome)
        for direction, reason in MOVES:
            self.rebalance_moves.labels(direction=direction, reason=reason)
        self.preemptions.labels(reason="priority")
        self.collector = ClusterCollector()
        r.register(self.collector)

    def attach(self, controller: Controller) -> None:
        self.collector.controller = controller
        controller.listeners.append(self.observe)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    # -- per cycle: only what the cycle itself recorded ---------------------------------------
    def observe(self, controller: Controller, report: CycleReport) -> None:
        cyc = report.cycle
        if cyc is None:
            return
        self.cycles.inc()
        self.cycle.observe(report.seconds)
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
            elif key == LOST_PODS_DELETED:
                self.pods_forced.inc(n)
            elif key.startswith(LIVE_RESIZES):
                self.live_resizes.labels(reason=key.removeprefix(LIVE_RESIZES)).inc(n)
            elif key == LIVE_RESIZE_FALLBACKS:
                self.live_fallbacks.inc(n)
            elif key == "defrag_moves":
                self.defrag_moves.inc(n)
            elif key.startswith("evictions:"):
                _, reason, how = key.split(":", 2)
                self.evictions.labels(reason=reason, outcome=how).inc(n)
            elif key.startswith(("evictions_cancelled:", "evictions_taken_over:")):
                kind, reason = key.split(":", 1)
                self.evictions.labels(reason=reason, outcome=kind.removeprefix("evictions_")).inc(n)
            elif key.startswith("moves:"):
                _, direction, reason = key.split(":", 2)
                self.rebalance_moves.labels(direction=direction, reason=reason).inc(n)


class ClusterCollector:
    """The cluster gauges, computed from the controller's cache and snapshot when scraped."""

    NAMES = (
        "tidal_supernode_gpus",
        "tidal_supernode_largest_free_slice_gpus",
        "tidal_supernode_fragmentation_ratio",
        "tidal_fragmentation_ratio",
        "tidal_gpus",
        "tidal_jobs",
        "tidal_oldest_pending_seconds",
        "tidal_hbd_violations",
        "tidal_overbooked_gpus",
        "tidal_api_requests",
        "tidal_pending_jobs",
        "tidal_stranded_gpus",
        "tidal_nodes_not_ready",
        "tidal_mass_not_ready",
    )

    def __init__(self, controller: Controller | None = None):
        self.controller = controller
        self._violating: set[tuple[str, str, int]] = set()
        self._last: list[Metric] | None = None

    def describe(self) -> Iterator[Metric]:
        return iter(self._families(None))

    def collect(self) -> Iterator[Metric]:
        controller = self.controller
        if controller is None:
            return iter(self._families(None))
        if not controller.lock.acquire(timeout=SCRAPE_LOCK_SECONDS):
            # A cycle longer than the scrape's patience: serve the previous scrape's values.
            return iter(self._last if self._last is not None else self._families(None))
        try:
            self._last = self._families(controller)
        finally:
            controller.lock.release()
        return iter(self._last)

    def _families(self, controller: Controller | None) -> list[Metric]:
        sn_gpus = GaugeMetricFamily(
            "tidal_supernode_gpus", "Accelerators of a supernode by state", labels=["supernode", "state"]
        )
        largest_slice = GaugeMetricFamily(
            "tidal_supernode_largest_free_slice_gpus",
            "Free accelerators one HBD group could use in the supernode",
            labels=["supernode"],
        )
        sn_frag = GaugeMetricFamily(
            "tidal_supernode_fragmentation_ratio",
            "Share of the supernode's free accelerators that sit on partly used nodes",
            labels=["supernode"],
        )
        frag = GaugeMetricFamily(
            "tidal_fragmentation_ratio", "1 - (largest free slice / all free accelerators), cluster-wide"
        )
        gpus = GaugeMetricFamily("tidal_gpus", "Accelerators in supernodes by workload class", labels=["class"])
        jobs = GaugeMetricFamily("tidal_jobs", "tidal workloads by kind and phase", labels=["kind", "phase"])
        oldest = GaugeMetricFamily("tidal_oldest_pending_seconds", "Age of the longest-waiting pending job")
        violations = CounterMetricFamily(
            "tidal_hbd_violations", "HBD groups seen running across more than one supernode (must stay 0)"
        )
        overbooked = GaugeMetricFamily("tidal_overbooked_gpus", "Accelerators booked beyond node capacity (must be 0)")
        api = GaugeMetricFamily("tidal_api_requests", "API requests made by the operator since start", labels=["verb"])
        pending_jobs = GaugeMetricFamily(
            "tidal_pending_jobs", "Pending TrainingJobs by the reason they wait", labels=["reason"]
        )
        stranded = GaugeMetricFamily(
            "tidal_stranded_gpus",
            "Free accelerators no pending HBD-group size can use (per supernode, summed; 0 when nothing is pending)",
        )
        not_ready = GaugeMetricFamily("tidal_nodes_not_ready", "Nodes whose Ready condition is not True")
        mass = GaugeMetricFamily(
            "tidal_mass_not_ready",
            "1 while most nodes are NotReady at once (a control-plane outage): NotReady alone restarts no group",
        )
        families: list[Metric] = [
            sn_gpus,
            largest_slice,
            sn_frag,
            frag,
            gpus,
            jobs,
            oldest,
            violations,
            overbooked,
            api,
            pending_jobs,
            stranded,
            not_ready,
            mass,
        ]
        report = controller.last_report if controller is not None else None
        cyc = report.cycle if report is not None else None
        if controller is None or report is None or cyc is None:
            frag.add_metric([], 0.0)
            oldest.add_metric([], 0.0)
            violations.add_metric([], float(len(self._violating)))
            overbooked.add_metric([], 0.0)
            stranded.add_metric([], 0.0)
            not_ready.add_metric([], 0.0)
            mass.add_metric([], 0.0)
            for reason in PENDING_REASONS:
                pending_jobs.add_metric([reason], 0.0)
            if controller is not None:
                for verb, n in controller.api.requests.items():
                    api.add_metric([verb], float(n))
            return families
        snapshot = cyc.snapshot
        total_free = largest = 0
        for name in snapshot.supernodes:
            t = snapshot.supernode_totals(name)
            for state_name, value in (
                ("total", t.total),
                ("allocated", t.allocated),
                ("free", t.free),
                ("failed", t.failed),
                ("spare", t.spare),
            ):
                sn_gpus.add_metric([name, state_name], value)
            free_slice = snapshot.largest_free_slice(name)
            largest_slice.add_metric([name], free_slice)
            on_partial = sum(n.free for n in snapshot.member_nodes(name) if n.allocated > 0 and n.free)
            sn_frag.add_metric([name], on_partial / t.free if t.free else 0.0)
            total_free += t.free
            largest = max(largest, free_slice)
        frag.add_metric([], 1 - largest / total_free if total_free else 0.0)
        for cls, value in _gpus_by_class(report, snapshot).items():
            gpus.add_metric([cls], value)
        counts, pending, oldest_s = _jobs(report)
        for (kind, phase), n in sorted(counts.items()):
            jobs.add_metric([kind, phase], n)
        oldest.add_metric([], oldest_s)
        for reason in sorted({*PENDING_REASONS, *pending}):
            pending_jobs.add_metric([reason], pending.get(reason, 0))
        stranded.add_metric([], float(stranded_free_gpus(snapshot, _pending_sizes(report))))
        self._hbd_violations(controller, cyc.members)
        violations.add_metric([], float(len(self._violating)))
        overbooked.add_metric([], float(sum(max(n.allocated - n.gpus, 0) for n in snapshot.nodes.values())))
        for verb, n in controller.api.requests.items():
            api.add_metric([verb], float(n))
        not_ready.add_metric([], float(len(controller.cache.not_ready)))
        mass.add_metric([], 1.0 if cyc.mass_not_ready else 0.0)
        return families

    def _hbd_violations(self, controller: Controller, members: dict[str, Any]) -> None:
        """Count each (workload, group) seen bound across two supernodes once."""
        supernode_of = {node: m.supernode for m in members.values() for node in m.nodes}
        seen: dict[tuple[str, str, int], set[str]] = {}
        for pod in controller.cache.pods.values():
            if pod.owner is None or pod.group is None or not pod.bound or not pod.active:
                continue
            key = (pod.namespace, pod.owner[1], pod.group)
            seen.setdefault(key, set()).add(supernode_of.get(pod.node or "", "?"))
        for key, supernodes in seen.items():
            if len(supernodes) > 1:
                self._violating.add(key)


def _gpus_by_class(report: CycleReport, snapshot: Any) -> dict[str, int]:
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


def _pending_sizes(report: CycleReport) -> dict[str, set[int]]:
    """Accelerator -> HBD-group sizes (GPUs) of the queued TrainingJobs."""
    sizes: dict[str, set[int]] = {}
    for view, status in report.statuses.values():
        if not is_queued(view, status):
            continue
        try:
            size = GangShape.of(view.spec, view.spec.get("dp", 1)).group_gpus
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue  # an invalid spec waits with InvalidSpec; it has no group size
        sizes.setdefault(view.spec.get("accelerator", "nvidia.com/gpu"), set()).add(size)
    return sizes


def _jobs(report: CycleReport) -> tuple[Counter[tuple[str, str]], Counter[str], float]:
    counts: Counter[tuple[str, str]] = Counter()
    pending: Counter[str] = Counter()
    oldest = 0.0
    cyc = report.cycle
    for _, status in report.statuses.values():
        phase = status.get("phase") or "Pending"
        counts[("TrainingJob", phase)] += 1
        if phase == "Pending":
            since = parse_time(status.get("pendingSince"))
            if since is not None and cyc is not None:
                oldest = max(oldest, (cyc.now - since).total_seconds())
            cond = next((c for c in status.get("conditions", []) if c.get("type") == "Schedulable"), None)
            pending[(cond or {}).get("reason") or "Queued"] += 1
    for _, status in report.pools.values():
        scaled = status.get("placedReplicas", 0) >= status.get("desiredReplicas", 0)
        counts[("InferencePool", "Scaled" if scaled else "BelowDesired")] += 1
    return counts, pending, oldest
