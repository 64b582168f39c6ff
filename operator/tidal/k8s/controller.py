"""One controller cycle: snapshot from the watched state, then reconcile placed jobs, admit queued
ones, write statuses, and create/delete/ungate pods. Cycles never overlap and are rate limited.

The cycle works on the incremental watch cache (`k8s/watch.py`): the snapshot is patched, not
rebuilt; only workloads whose pods, nodes or objects changed are reconciled; a queued job that did
not fit is tried again only when free capacity went up, a possible victim appeared, or it changed.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from tidal.clock import Clock, SystemClock
from tidal.k8s.admission import admit_queued, is_queued, placement_demand
from tidal.k8s.api import Api
from tidal.k8s.cache import Membership
from tidal.k8s.compute_domains import ComputeDomainSupport, domain_supernodes
from tidal.k8s.cycle import Cycle, Hold, log
from tidal.k8s.cycle_log import CycleLog
from tidal.k8s.deletions import DeletionNudger
from tidal.k8s.disruption_ledger import LedgerStore
from tidal.k8s.gate_ledger import GateLedger
from tidal.k8s.outage import NotReadyTracker, down_for_repair
from tidal.k8s.pools import LoadPoller, pool_allocations, pool_domain_held_nodes
from tidal.k8s.priority import Priorities
from tidal.k8s.quota import Quotas
from tidal.k8s.rebalancing import RebalanceSettings, budget_left, expand_elastic, rebalance_pools
from tidal.k8s.return_rooms import (
    book_return_rooms,
    free_untaken_rooms,
    hold_room_quota_shares,
    top_up_return_rooms,
)
from tidal.k8s.state import ClusterState, ResourceView
from tidal.k8s.status import StatusWriter
from tidal.k8s.supernodes import supernode_status
from tidal.k8s.training import (
    EVICTIONS_STARTED,
    allocations,
    domain_held_nodes,
    holds_gpus,
    pods_ready_due,
    prune_domains,
    reconcile_placed,
    tell_called_off,
)
from tidal.k8s.watch import SnapshotKeeper, WatchCache
from tidal.k8s.write import Applied, apply_actions
from tidal.placement.leftover import ArrivalHistory
from tidal.placement.types import Packing
from tidal.rebalance import DemandTracker

TICKING_SECONDS = 10.0
"""A tick within this long means timers are running (they fire every second)."""


@dataclass
class ControllerSettings:
    min_cycle_seconds: float = 0.5
    supernode_label: str = "tidal.dev/supernode"
    """Node label that selects a Supernode's members when its spec has no nodeSelector."""
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)
    max_cycle_age_seconds: float = 120.0
    """/healthz fails when timers fire but no cycle has finished for this long."""
    defragment: bool = True
    """Move preemptible work (checkpoint-first) when a queued gang is blocked only by fragmentation."""
    spec_priority: bool = False
    """Honour the deprecated integer spec.priority (operator flag --spec-priority): only where every
    tenant may outrank every other; otherwise priorities come from PriorityClasses alone."""
    resync_seconds: float = 300.0
    """How often the cache is brought to a full copy of the kopf indices (also at the first tick)."""
    admission_timeout_seconds: float = 600.0
    """Operator flag --admission-timeout: a gang's pods not all bound and Running this long after
    they were placed have their groups placed again (Kueue's waitForPodsReady); 0 turns it off."""
    state_namespace: str | None = None
    """Operator flag --state-namespace: where the disruption ledger's ConfigMap lives (None: kept
    in memory only, so a restart forgets deleted jobs' evictions of the last hour)."""
    not_ready_grace_seconds: float = 30.0
    """Operator flag --not-ready-grace: while more than 2 nodes are NotReady, how long one must be
    before its groups are placed again (k8s/outage.py)."""
    packing: Packing = Packing.KEEP_WHOLE
    """Operator flag --packing: which refusals a full cluster trades for which (placement.types.Packing)."""
    cycle_log_seconds: float = 30.0
    """Operator flag --cycle-log-seconds: the "cycle done" summary at most this often, summing the
    cycles since the last one (0: one line per cycle that admitted or made pod calls). Every
    decision has its own "event" line whatever this is."""
    state_name: str = "tidal-disruptions"
    """The ledger ConfigMap's name: the peering name + "-disruptions" (one per release)."""


@dataclass
class CycleReport:
    """What a cycle saw and did, for metrics and benchmarks."""

    cycle: Cycle | None = None
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]] = field(default_factory=dict)
    pools: dict[str, tuple[ResourceView, dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0
    decide_seconds: float = 0.0
    """Reconcile, rebalance and admission: the plan of actions (no API call is made)."""
    write_seconds: float = 0.0
    """Applying the plan: statuses, events, pod and Service calls."""
    supernodes_seconds: float = 0.0
    """Writing the Supernode statuses that changed (after the plan)."""
    applied: Applied | None = None
    overbooked_gpus: int = 0


class Controller:
    def __init__(self, api: Api, clock: Clock | None = None, settings: ControllerSettings | None = None):
        self.api = api
        self.clock = clock or SystemClock()
        self.settings = settings or ControllerSettings()
        self.writer = StatusWriter(api)
        self.deleted_uids: set[str] = set()
        self.forced_uids: set[str] = set()
        self.demand = DemandTracker(self.settings.rebalance.stabilization_window)
        self.last_report = CycleReport()
        self.cycles = 0
        self.lock = threading.Lock()
        """Held by a cycle, and by a metrics scrape reading the cache (the scrape waits, a cycle skips)."""
        self._last_start = 0.0
        self.last_tick = 0.0
        self.last_finished = time.monotonic()
        """When the last cycle ended (or the controller was made): /healthz checks its age."""
        self._next_resync = 0.0
        """When the cache is next brought to a full listing (0: at the first tick)."""
        self.relisted: set[str] = set()
        """Cache kinds kopf listed again since the last index audit (`handlers._feed`)."""
        self._next_audit = 0.0
        """When the kopf indices may next be checked against a fresh LIST (0: at once)."""
        self.failures = 0
        """Cycles failed in a row (reset by one that finishes)."""
        self.cycle_log = CycleLog(self.settings.cycle_log_seconds)
        self.gate_ledger = GateLedger()
        self._stuck_logged = 0.0
        self.listeners: list[Any] = []
        self.cache = WatchCache(self.settings.supernode_label)
        self.keeper = SnapshotKeeper()
        self._settled: dict[str, tuple[ResourceView, dict[str, Any]]] = {}
        self._supernodes_seen: dict[str, tuple[ResourceView, Any]] = {}
        self._overbooked: dict[str, int] = {}
        self.pending_memo: dict[str, tuple] = {}
        self.arrivals = ArrivalHistory()
        self.holds: dict[str, Hold] = {}
        self.victims_added: Counter[int] = Counter()
        self.evictions_started = 0
        self.applied_services: dict[tuple[str, str], dict[str, Any]] = {}
        """Pool Services as last brought about: an unchanged one is not even read again until the
        next resync (or a failed cycle) forgets this, so a user's edit or deletion is repaired then."""
        self.service_conflicts: dict[tuple[str, str], float] = {}
        """(namespace, name) -> when (monotonic) to look again at a Service name another owner holds."""
        self.domains = ComputeDomainSupport(self._probe_domains)
        self._domain_supernodes: tuple[Any, frozenset[str]] = (None, frozenset())
        self.loads = LoadPoller(self.settings.rebalance.load_sources)
        """Pools' Prometheus loads, sampled off the cycle (its thread starts when a pool names a source)."""
        self.domains_deleted: frozenset[tuple[str, str]] = frozenset()
        """ComputeDomain deletes the last flush saw succeed (see Cycle.domains_deleted_before)."""
        self.nudger = DeletionNudger()
        """Deleted objects kopf's finalizer still holds: see deletions.py."""
        self.not_ready = NotReadyTracker(dt.timedelta(seconds=self.settings.not_ready_grace_seconds))
        """NotReady nodes: failed machines or a control-plane outage (k8s/outage.py)."""
        self.failed_not_ready: frozenset[str] = frozenset()
        self._member_nodes: tuple[Any, frozenset[str]] = (None, frozenset())
        self.disruptions = LedgerStore(self.settings.state_namespace, self.settings.state_name)
        """The disruption budget's records of deleted jobs (k8s/disruption_ledger.py)."""

    def _probe_domains(self) -> bool:
        probe = getattr(self.api, "compute_domains_installed", None)  # test doubles may lack it
        return bool(probe()) if probe is not None else False

    def domain_supernodes(self, members: dict[str, Any]) -> frozenset[str]:
        """Recomputed only when membership was (any node relabel or Supernode change does that)."""
        if self._domain_supernodes[0] is not members:
            self._domain_supernodes = (
                members,
                domain_supernodes(members, self.cache.supernodes, self.cache.nodes),
            )
        return self._domain_supernodes[1]

    def due(self) -> bool:
        return not self.lock.locked() and time.monotonic() - self._last_start >= self.settings.min_cycle_seconds

    def ticking(self) -> bool:
        """Whether timers tick now (not standing by, paused by peering or starting): the pod and
        node informers queue events only then (k8s/informer.py)."""
        return bool(self.last_tick) and time.monotonic() - self.last_tick < TICKING_SECONDS

    def claim(self) -> bool:
        """On the event loop: True if a cycle may start now. The slot is taken at once, so the ticks
        of many objects in the same instant start one cycle, not one each."""
        if not self.due():
            return False
        self._last_start = time.monotonic()
        return True

    def resync_due(self) -> bool:
        """True (once per `resync_seconds`, at the first call, and after a failed cycle) when the
        caller should queue a full listing (`cache.resync`)."""
        now = time.monotonic()
        if now < self._next_resync:
            return False
        self._next_resync = now + self.settings.resync_seconds
        # With the full listing, every pool Service is read again and repaired.
        self.applied_services, self.service_conflicts = {}, {}
        return True

    def audit_due(self) -> bool:
        """True at most once per `resync_seconds`: time to look for objects deleted while a watch
        was down (`handlers.audit_indices`), asked only once kopf listed some kind again."""
        now = time.monotonic()
        if now < self._next_audit:
            return False
        self._next_audit = now + self.settings.resync_seconds
        return True

    def cycle(self, state: ClusterState | None = None) -> CycleReport | None:
        """One cycle over the watch cache: queued watch events are applied first; `state` (a full
        listing: tests and the benchmark) supersedes the events queued before it.

        Returns None when another cycle or a metrics scrape holds the lock (the queue, listings
        included, waits for the next cycle), or when the cycle failed: that is logged as an error,
        the next cycle starts from a full listing and rebuilt derived state, and /healthz fails
        if no cycle finishes for `max_cycle_age_seconds`."""
        if state is not None:
            self.cache.resync(state)
        if not self.lock.acquire(blocking=False):
            return None
        try:
            self._last_start = time.monotonic()
            try:
                self.cache.drain()
                report = self._cycle()
            except Exception:
                # Never let one bad cycle make kopf back off the timers: log it, restart from the truth.
                self.failures += 1
                self.cycle_log.flush()  # what the cycles before it did comes before the error
                log.exception("cycle failed", failures_in_a_row=self.failures)
                self._restart()
                return None
            report.seconds = time.monotonic() - self._last_start
            self._log_cycle(report)
            self.last_report = report
            self.cycles += 1
            self.failures = 0
            self.last_finished = time.monotonic()
            for listener in self.listeners:
                try:
                    listener(self, report)
                except Exception:  # metrics must never stop the cycle (nor make kopf back off the timer)
                    log.exception("cycle listener failed", listener=getattr(listener, "__qualname__", repr(listener)))
            return report
        finally:
            self.lock.release()

    def _log_cycle(self, report: CycleReport) -> None:
        """The "cycle done" summary (k8s/cycle_log.py): the first cycle at once, then the cycles
        that admitted or made pod calls, at most every --cycle-log-seconds."""
        cyc = report.cycle
        if cyc is None:
            return
        plan = cyc.plan
        self.cycle_log.record(
            first=not self.cycles,
            counts={
                "admitted": cyc.counters.get("admitted", 0),
                "statuses": len(plan.statuses),
                "pod_creates": len(plan.pod_creates),
                "ungates": len(plan.ungates),
                "pod_deletes": len(plan.pod_deletes),
            },
            seconds={
                "seconds": report.seconds,
                "decide_seconds": report.decide_seconds,
                "write_seconds": report.write_seconds,
                "supernodes_seconds": report.supernodes_seconds,
            },
            nodes=len(self.cache.nodes),
            pods=len(self.cache.pods),
        )

    def _restart(self) -> None:
        """After a failed cycle: whatever it half-updated is rebuilt. The next tick queues a full
        listing; the snapshot, bookings, settled jobs, supernode statuses and queue marks start over."""
        self._next_resync = 0.0
        self.cache.invalidate_memberships()
        self.keeper = SnapshotKeeper()
        self._settled.clear()
        self._supernodes_seen.clear()
        self._overbooked.clear()
        self.pending_memo.clear()
        self.applied_services, self.service_conflicts = {}, {}

    def stuck_report(self) -> str | None:
        """A message to log when the cycle is stuck (at most once per `max_cycle_age_seconds`)."""
        if not self.stuck():
            return None
        now = time.monotonic()
        if now - self._stuck_logged < self.settings.max_cycle_age_seconds:
            return None
        self._stuck_logged = now
        what = "a cycle has been running" if self.lock.locked() else "cycles keep failing or being skipped"
        return f"no controller cycle finished for {self.seconds_since_cycle():.0f}s: {what}"

    def seconds_since_cycle(self) -> float:
        return time.monotonic() - self.last_finished

    def stuck(self) -> bool:
        """Ticks arrive (this replica is active) yet no cycle finished within the bound. A standby
        replica (timers paused by peering) or an idle cluster (no timers) is never stuck."""
        bound = self.settings.max_cycle_age_seconds
        return self.last_tick - self.last_finished > bound and self.seconds_since_cycle() > bound

    @staticmethod
    def _reconcile_job(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> dict[str, Any] | None:
        if holds_gpus(status):
            return reconcile_placed(cyc, view, status)
        out = None
        if status.get("staleComputeDomains"):  # released domains whose delete is not confirmed yet
            pruned = prune_domains(cyc, view, status)
            if pruned != status:
                status = out = pruned
        if status.get("phase") == "Suspended" and not view.spec.get("suspend"):
            return {**status, "phase": "Pending", "reason": "resumed", "pendingSince": cyc.stamp}
        if status.get("phase", "Pending") in ("Pending", "") and view.spec.get("suspend"):
            return {**status, "phase": "Suspended", "reason": "spec.suspend is true"}
        return out

    def _watch_outage(self, now: dt.datetime, members: dict[str, Membership]) -> frozenset[str]:
        """Nodes that newly count as failed; logs an outage's start and end. Counted: the
        Supernodes' members, less those down for repair (their groups are always placed again, as
        are those of NotReady nodes outside every Supernode)."""
        if self._member_nodes[0] is not members:
            self._member_nodes = (members, frozenset(n for m in members.values() for n in m.nodes))
        member_nodes = self._member_nodes[1]
        repair = frozenset(
            n for n in self.cache.not_ready if n in member_nodes and down_for_repair(self.cache.nodes[n])
        )
        watched = [n for n in self.cache.not_ready if n in member_nodes and n not in repair]
        was = self.not_ready.mass
        newly = self.not_ready.update(watched, len(member_nodes) - len(repair), now)
        # A node out of every Supernode (its Supernode deleted, its label changed) is not held: no
        # outage rule covers it, and the taint manager no longer evicts tidal's pods from it.
        outside = frozenset(n for n in self.cache.not_ready if n not in member_nodes)
        newly |= outside - self.failed_not_ready
        self.failed_not_ready = self.not_ready.failed | repair | outside
        if self.not_ready.mass and not was:
            log.warning(
                "most nodes are NotReady at once: a control-plane outage, not failed nodes; "
                "NotReady alone restarts no group until it ends",
                not_ready=len(watched),
                nodes=len(member_nodes) - len(repair),
            )
        elif was and not self.not_ready.mass:
            log.warning("the mass NotReady is over: NotReady nodes restart their groups again", not_ready=len(watched))
        return newly

    def _cycle(self) -> CycleReport:
        started = time.monotonic()
        cache = self.cache
        now = self.clock.now()
        deleted, cache.deleted_jobs = cache.deleted_jobs, []
        # Before the writer forgets them: its status of a deleted job may be newer than the watch's.
        self.disruptions.update(self.api, [(view, self.writer.effective(view)) for view in deleted], now)
        statuses: dict[str, tuple[ResourceView, dict[str, Any]]] = {
            view.uid: (view, self.writer.effective(view)) for view in cache.jobs.values()
        }
        pools: dict[str, tuple[ResourceView, dict[str, Any]]] = {
            view.uid: (view, self.writer.effective(view)) for view in cache.pools.values()
        }
        self.writer.forget({v.uid for v in (*cache.jobs.values(), *cache.supernodes.values(), *cache.pools.values())})
        members = cache.memberships()
        failed_now = self._watch_outage(now, members)
        dirty_owners, dirty_nodes = cache.take_dirty()
        self._book(statuses, pools, {m.accelerator for m in members.values()})
        snapshot = self.keeper.refresh(cache, dirty_nodes)
        ungated = self.gate_ledger.recent(pod.uid for pod in cache.pods.values() if pod.gated)
        self.deleted_uids &= cache.pod_uids  # forget pods that are gone for good
        self.forced_uids &= cache.pod_uids
        cache.forget_departed(set(statuses) | set(pools))
        cyc = Cycle(
            cache,
            members,
            snapshot,
            self.api,
            self.writer,
            now,
            deleted_uids=self.deleted_uids,
            forced_uids=self.forced_uids,
            ungated_uids=ungated,
            pending_memo=self.pending_memo,
            held_before=dict(self.holds),
            holds_mark=hash(frozenset(self.holds.items())),
            victims_added=self.victims_added,
            evictions_started=self.evictions_started,
            mass_not_ready=self.not_ready.mass,
            failed_not_ready=self.failed_not_ready,
            deleted_disruption_gpus=self.disruptions.gpus(
                now, statuses.keys(), self.settings.rebalance.disruption_budget_gpus_per_hour
            ),
            domain_supernodes=self.domain_supernodes(members),
            domains_installed=self.domains.installed,
            priorities=self.priorities(),
            domains_deleted_before=self.domains_deleted,
            admission_timeout=self.admission_timeout(),
            demand=placement_demand(statuses, self.arrivals, snapshot),
            packing=self.settings.packing,
        )
        # A holder that waits no more (deleted or suspended) frees its nodes and quota share before
        # anything is planned: pools are grown before admission, which would drop it too late.
        waiting = {uid for uid, item in statuses.items() if is_queued(*item)}
        waiting.update(uid for uid, (view, _) in pools.items() if not view.deleting)
        for uid in [u for u in cyc.held_before if u not in waiting]:
            cyc.release_hold(uid)
        # Before any decision: a restart that finds these pods terminating does not delete them again.
        cyc.delete_lost_pods()
        book_return_rooms(cyc, statuses)  # before any recovery, pool or admission could take them
        log.debug(
            "cycle",
            nodes=len(cache.nodes),
            pods=len(cache.pods),
            supernodes=len(cache.supernodes),
            jobs=len(statuses),
            pools=len(pools),
        )

        moved = self.keeper.jobs_on(dirty_nodes | failed_now)
        for uid, (view, status) in sorted(statuses.items(), key=lambda kv: kv[1][0].key):
            if view.deleting:
                continue
            if self._settled_job(view, status, dirty_owners, moved) and not pods_ready_due(cyc, status):
                cyc.count("reconciles_skipped")
                continue
            actions = cyc.actions
            # Only a placed job places anything here (a queued one waits for admission): flipping
            # every held node for each queued job cost O(queued x held) a cycle while a hold lasted.
            held = cyc.held_from(uid, cyc.priorities.of(view)) if holds_gpus(status) else ()
            try:
                with cyc.avoiding(held):
                    new = self._reconcile_job(cyc, view, status)
            except Exception:
                log.exception("reconcile failed", namespace=view.namespace, name=view.name)
                continue
            finally:
                if cyc.return_rooms:  # what this reconcile released on a mover's way back is the mover's
                    top_up_return_rooms(cyc)
            if (new is None or new == status) and cyc.actions == actions:
                self._settled[uid] = (view, status)  # nothing to do until its pods, nodes or object move
            else:
                self._settled.pop(uid, None)
            if new is None:
                continue
            statuses[uid] = (view, new)
            cyc.write_status(view, new)

        book_return_rooms(cyc, statuses)  # what leaving work freed in the reconciles; called-off rooms freed
        cyc.quotas = self._quotas(statuses, pools)
        cyc.quotas.carry(cyc.held_before, cyc.priorities.of)
        hold_room_quota_shares(cyc, statuses)
        self.loads.forget(set(pools))
        pools_waiting = rebalance_pools(cyc, pools, statuses, self.demand, self.settings.rebalance, self.loads)
        rebalance = self.settings.rebalance
        defrag_budget = (lambda: budget_left(cyc, statuses, rebalance)) if self.settings.defragment else None
        admit_queued(cyc, statuses, defrag_budget)
        expand_elastic(cyc, statuses, self.settings.rebalance, pools_waiting, pools)
        tell_called_off(cyc, statuses)  # after every plan that might have taken one over
        free_untaken_rooms(cyc)
        self.holds = cyc.holds
        decided = time.monotonic()
        applied = apply_actions(cyc.plan, self.api, self.writer, self.applied_services, self.service_conflicts)
        for key, n in applied.counters.items():
            cyc.count(key, n)
        written = time.monotonic()
        self.domains_deleted = frozenset(applied.deleted_domains)
        self.gate_ledger.sent(applied.gates_sent)
        for delete in applied.failed_pod_deletes:
            cyc.deleted_uids.discard(delete.uid)
            cyc.forced_uids.discard(delete.uid)
        self._update_supernodes(cyc)
        supernodes_written = time.monotonic()
        self.nudger.nudge(self.api, chain(cache.jobs.values(), cache.pools.values(), cache.supernodes.values()))
        self.keeper.end_cycle()
        self.evictions_started += sum(n for k, n in cyc.counters.items() if k.startswith(EVICTIONS_STARTED))
        for uid in [u for u in self.pending_memo if u not in statuses]:
            del self.pending_memo[uid]
        for uid in [u for u in self._settled if u not in statuses]:
            del self._settled[uid]
        for memo in (self.applied_services, self.service_conflicts):
            for key in [k for k in memo if k not in cache.pools]:
                del memo[key]  # the garbage collector removes a gone pool's Service
        report = CycleReport(
            cycle=cyc,
            statuses=statuses,
            pools=pools,
            decide_seconds=decided - started,
            write_seconds=written - decided,
            supernodes_seconds=supernodes_written - written,
            applied=applied,
            overbooked_gpus=self._overbooked_gpus(cyc),
        )
        if report.overbooked_gpus:
            log.warning("overbooked", gpus=report.overbooked_gpus)
        return report

    def _quotas(self, statuses: Statuses, pools: Statuses) -> Quotas:
        """Quotas of the namespaces that have any, with the GPUs held there: bookings from the
        recorded placements (pods may not exist yet) and every other active GPU pod."""
        cache = self.cache
        limited = {q.namespace for q in cache.quotas.values() if q.hard}
        if not limited:
            return Quotas(version=cache.quota_version)
        held: list[tuple[str, str, int, str | None]] = []
        priorities = self.priorities()
        for items, allocs in ((statuses, allocations), (pools, pool_allocations)):
            for view, status in items.values():
                if view.namespace in limited and not view.deleting:
                    gpus = sum(n for _, n in allocs(view, status))
                    accelerator = view.spec.get("accelerator", "nvidia.com/gpu")
                    held.append((view.namespace, accelerator, gpus, priorities.class_name(view)))
        for pod in cache.pods.values():
            if pod.owner is None and pod.active and pod.namespace in limited:
                held.extend((pod.namespace, r, n, pod.priority_class) for r, n in pod.requests.items())
        return Quotas.build(cache.quotas.values(), held, cache.quota_version, priorities.class_name)

    def admission_timeout(self) -> dt.timedelta | None:
        seconds = self.settings.admission_timeout_seconds
        return dt.timedelta(seconds=seconds) if seconds > 0 else None

    def priorities(self) -> Priorities:
        return Priorities(self.cache.priority_classes, self.settings.spec_priority, self.cache.priority_version)

    def _book(self, statuses: Statuses, pools: Statuses, accelerators: set[str]) -> None:
        """GPUs booked by each workload's recorded placement, diffed only where a status changed.
        Pods of a workload being deleted, or gone (deleted, or an earlier one of the same name),
        keep their GPUs booked under their owner's uid until they are gone: they hold them
        through their grace period. Found from the pod index, so a new leader finds them too."""
        keeper = self.keeper
        priorities = self.priorities()
        live: set[str] = set()
        for kind, items, booked, held in (
            ("TrainingJob", statuses, allocations, domain_held_nodes),
            ("InferencePool", pools, pool_allocations, pool_domain_held_nodes),
        ):
            for uid, (view, status) in items.items():
                if view.deleting:
                    continue
                live.add(uid)
                grew = keeper.set_allocations(
                    uid, status, booked(view, status), lambda view=view, status=status, held=held: held(view, status)
                )
                if grew and kind == "TrainingJob" and view.spec.get("preemptible"):
                    self.victims_added[priorities.of(view)] += 1
        for uid in self.cache.owner_uids():
            if uid in live:
                continue
            lingering = [
                (pod.node, sum(n for r, n in pod.requests.items() if r in accelerators))
                for pod in self.cache.pods_of_owner_uid(uid)
                if pod.node and pod.active
            ]
            if lingering:
                keeper.set_allocations(uid, object(), lingering)
                live.add(uid)
        keeper.forget(live)

    def _settled_job(self, view: ResourceView, status: dict[str, Any], dirty_owners: set, moved: set[str]) -> bool:
        """A placed job whose object, status, pods and nodes are all as when it last needed nothing."""
        seen = self._settled.get(view.uid)
        return (
            seen is not None
            and seen[0] is view
            and seen[1] is status
            and holds_gpus(status)
            and not status.get("eviction")
            and ("TrainingJob", view.namespace, view.name) not in dirty_owners
            and view.uid not in moved
        )

    def _update_supernodes(self, cyc: Cycle) -> None:
        """Supernode statuses, recomputed only where a member node changed this cycle, and written
        in parallel: a gang's placement changes one status per rack it spans, and one after the
        other those writes held the cycle (and the next gang's gates) for seconds under load."""
        changed = cyc.snapshot.touched | cyc.snapshot.refreshed
        todo: list[tuple[str, ResourceView, Membership | None, dict[str, Any]]] = []
        for name, view in cyc.state.supernodes.items():
            if view.deleting:
                continue
            member = cyc.members.get(name)
            seen = self._supernodes_seen.get(name)
            if (
                seen is not None
                and seen[0] is view
                and seen[1] is member
                and not (member and any(n in changed for n in member.nodes))
            ):
                continue
            todo.append((name, view, member, supernode_status(cyc, view, member)))
        # An unchanged status is not sent (StatusWriter.write compares with what it last wrote).
        written = self.api.parallel(lambda item: cyc.writer.write(item[1], item[3]), todo)
        for (name, view, member, _), ok in zip(todo, written, strict=True):
            if ok:
                self._supernodes_seen[name] = (view, member)
            else:  # not written (say, 429 while the API server's storage initializes): again next cycle
                self._supernodes_seen.pop(name, None)
        for name in [n for n in self._supernodes_seen if n not in cyc.state.supernodes]:
            del self._supernodes_seen[name]

    def _overbooked_gpus(self, cyc: Cycle) -> int:
        snapshot = cyc.snapshot
        names = snapshot.nodes if snapshot.rebuilt else snapshot.touched | snapshot.refreshed
        if snapshot.rebuilt:
            self._overbooked = {}
        for name in names:
            node = snapshot.nodes.get(name)
            over = max(node.allocated - node.gpus, 0) if node is not None else 0
            if over:
                self._overbooked[name] = over
            else:
                self._overbooked.pop(name, None)
        return sum(self._overbooked.values())


Statuses = dict[str, tuple[ResourceView, dict[str, Any]]]
