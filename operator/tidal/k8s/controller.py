"""One controller cycle: snapshot from the watched state, then reconcile placed jobs, admit queued
ones, write statuses, and create/delete/ungate pods. Cycles never overlap and are rate limited."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tidal.clock import Clock, SystemClock
from tidal.k8s.admission import admit_queued
from tidal.k8s.api import Api
from tidal.k8s.cache import build_snapshot, memberships, overbooked_gpus
from tidal.k8s.cycle import Cycle, log
from tidal.k8s.pools import pool_allocations
from tidal.k8s.rebalancing import RebalanceSettings, expand_elastic, rebalance_pools
from tidal.k8s.state import ClusterState, ResourceView
from tidal.k8s.status import StatusWriter
from tidal.k8s.supernodes import update_supernodes
from tidal.k8s.training import allocations, holds_gpus, reconcile_placed
from tidal.rebalance import DemandTracker


@dataclass
class ControllerSettings:
    min_cycle_seconds: float = 0.5
    supernode_label: str = "tidal.dev/supernode"
    """Node label that selects a Supernode's members when its spec has no nodeSelector."""
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)


@dataclass
class CycleReport:
    """What a cycle saw and did, for metrics and benchmarks."""

    cycle: Cycle | None = None
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]] = field(default_factory=dict)
    pools: dict[str, tuple[ResourceView, dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0
    overbooked_gpus: int = 0


class Controller:
    def __init__(self, api: Api, clock: Clock | None = None, settings: ControllerSettings | None = None):
        self.api = api
        self.clock = clock or SystemClock()
        self.settings = settings or ControllerSettings()
        self.writer = StatusWriter(api)
        self.deleted_uids: set[str] = set()
        self.demand = DemandTracker()
        self.last_report = CycleReport()
        self.cycles = 0
        self._lock = threading.Lock()
        self._last_start = 0.0
        self.listeners: list[Any] = []

    def due(self) -> bool:
        return not self._lock.locked() and time.monotonic() - self._last_start >= self.settings.min_cycle_seconds

    def cycle(self, state: ClusterState) -> CycleReport | None:
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._last_start = time.monotonic()
            try:
                report = self._cycle(state)
            except Exception:
                # Never let one bad cycle make kopf back off the timers: log it, try again next tick.
                log.exception("cycle failed")
                return None
            report.seconds = time.monotonic() - self._last_start
            self.last_report = report
            self.cycles += 1
            for listener in self.listeners:
                listener(self, state, report)
            return report
        finally:
            self._lock.release()

    @staticmethod
    def _reconcile_job(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> dict[str, Any] | None:
        if holds_gpus(status):
            return reconcile_placed(cyc, view, status)
        if status.get("phase") == "Suspended" and not view.spec.get("suspend"):
            return {**status, "phase": "Pending", "reason": "resumed", "pendingSince": cyc.stamp}
        if status.get("phase", "Pending") in ("Pending", "") and view.spec.get("suspend"):
            return {**status, "phase": "Suspended", "reason": "spec.suspend is true"}
        return None

    def _cycle(self, state: ClusterState) -> CycleReport:
        statuses: dict[str, tuple[ResourceView, dict[str, Any]]] = {
            view.uid: (view, self.writer.effective(view)) for view in state.jobs.values()
        }
        pools: dict[str, tuple[ResourceView, dict[str, Any]]] = {
            view.uid: (view, self.writer.effective(view)) for view in state.pools.values()
        }
        self.writer.forget({v.uid for v in (*state.jobs.values(), *state.supernodes.values(), *state.pools.values())})
        members = memberships(state, self.settings.supernode_label)
        held = [a for view, status in statuses.values() if not view.deleting for a in allocations(view, status)]
        held += [a for view, status in pools.values() if not view.deleting for a in pool_allocations(view, status)]
        snapshot = build_snapshot(state, members, held)
        live_pods = {p.uid for p in state.pods.values()}
        self.deleted_uids &= live_pods  # forget pods that are gone for good
        cyc = Cycle(state, members, snapshot, self.api, self.writer, self.clock.now(), deleted_uids=self.deleted_uids)
        log.debug(
            "cycle",
            nodes=len(state.nodes),
            pods=len(state.pods),
            supernodes=len(state.supernodes),
            jobs=len(statuses),
            pools=len(pools),
        )

        for uid, (view, status) in sorted(statuses.items(), key=lambda kv: kv[1][0].key):
            if view.deleting:
                continue
            try:
                new = self._reconcile_job(cyc, view, status)
            except Exception:
                log.exception("reconcile failed", namespace=view.namespace, name=view.name)
                continue
            if new is None:
                continue
            statuses[uid] = (view, new)
            self.writer.write(view, new)

        pools_waiting = rebalance_pools(cyc, pools, statuses, self.demand, self.settings.rebalance)
        admit_queued(cyc, statuses)
        if not pools_waiting:
            expand_elastic(cyc, statuses, self.settings.rebalance)
        cyc.flush_pods()
        update_supernodes(cyc)
        report = CycleReport(cycle=cyc, statuses=statuses, pools=pools, overbooked_gpus=overbooked_gpus(snapshot))
        if report.overbooked_gpus:
            log.warning("overbooked", gpus=report.overbooked_gpus)
        return report
