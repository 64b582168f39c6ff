"""What one controller cycle shares: the watched state, the snapshot, and the ways to act."""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from tidal.clock import rfc3339
from tidal.k8s.api import Api
from tidal.k8s.cache import Membership
from tidal.k8s.labels import GANG_GATE, JOB, POOL
from tidal.k8s.priority import Priorities
from tidal.k8s.quota import Quotas
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.status import StatusWriter
from tidal.topology.snapshot import ClusterSnapshot

log = structlog.get_logger("tidal")

SERVICE_CONFLICT_RETRY_SECONDS = 30.0
"""A pool Service name held by another owner is looked at again this often: soon enough for a pool
deleted and made again (the old Service goes with the garbage collector), rarely enough not to read
a user's Service of that name every cycle."""


@dataclass
class Cycle:
    state: Any
    """The watched objects: a WatchCache (or anything with ClusterState's attributes)."""
    members: dict[str, Membership]
    snapshot: ClusterSnapshot
    api: Api
    writer: StatusWriter
    now: dt.datetime
    deleted_uids: set[str] = field(default_factory=set)
    """Pods this operator deleted recently (the watch may not show it yet); kept across cycles."""
    pod_creates: list[dict[str, Any]] = field(default_factory=list)
    pod_deletes: list[tuple[str, str, int | None]] = field(default_factory=list)
    delete_uids: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> uid of each queued delete, to forget it again if the call fails."""
    ungates: list[tuple[str, str, list[str]]] = field(default_factory=list)
    pod_labels: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    pool_services: list[dict[str, Any]] = field(default_factory=list)
    """Every live pool's wanted Service this cycle (written at the flush only if it changed)."""
    applied_services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(namespace, name) -> the pool Service body last brought about (kept across cycles)."""
    service_conflicts: dict[tuple[str, str], float] = field(default_factory=dict)
    """(namespace, name) -> when (monotonic) to look again at a Service name another owner holds."""
    placements_ms: list[float] = field(default_factory=list)
    checkpoint_waits: list[float] = field(default_factory=list)
    pending_waits: list[float] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    """Things that happened this cycle: admitted, preemptions, restarts, evictions:<reason>:<how>..."""
    pending_memo: dict[str, tuple] = field(default_factory=dict)
    """Queued job uid -> what the cluster looked like when it last failed to fit (kept across cycles)."""
    victims_added: Counter[int] = field(default_factory=Counter)
    """Priority -> times a preemptible gang of that priority grew (kept across cycles)."""
    evictions_started: int = 0
    """Evictions started so far (kept across cycles): each one may open room for a preemptor."""
    domain_supernodes: frozenset[str] = frozenset()
    """Supernodes whose own choice is to give jobs NVIDIA ComputeDomains (multi-node NVLink)."""
    domains_installed: Callable[[], bool] = lambda: False
    """Whether the ComputeDomain CRD is served (asked only when a job wants a domain)."""
    domain_creates: list[dict[str, Any]] = field(default_factory=list)
    domain_deletes: list[tuple[str, str]] = field(default_factory=list)
    priorities: Priorities = field(default_factory=Priorities)
    """Each workload's priority, from its PriorityClass (tidal.k8s.priority)."""
    quotas: Quotas = field(default_factory=Quotas)
    """Namespaces' GPU quotas and usage (tidal.k8s.quota), set before anything is admitted."""
    domains_deleted_before: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name) of ComputeDomains whose delete the previous cycle's flush saw succeed (or
    404): a job drops such a name from status.staleComputeDomains; any other stale name is deleted
    again, so a failed delete (or one lost to an operator restart) is retried, never leaked."""
    domains_deleted: set[tuple[str, str]] = field(default_factory=set)
    """Filled by this cycle's flush, for the next cycle's `domains_deleted_before`."""

    @property
    def stamp(self) -> str:
        return rfc3339(self.now)

    def event(self, view: ResourceView, reason: str, message: str, warning: bool = False) -> None:
        log.info("event", kind=view.kind, namespace=view.namespace, name=view.name, reason=reason, message=message)
        self.api.event(view.kind, view.namespace, view.name, view.uid, reason, message, warning)

    def delete_pod(self, pod: PodView, grace_seconds: int | None = None) -> None:
        """Delete once; at once (grace 0) when its node is gone, as no kubelet will confirm."""
        if pod.terminating or pod.uid in self.deleted_uids:
            return
        node = self.state.nodes.get(pod.node or "")
        self.deleted_uids.add(pod.uid)
        self.delete_uids[(pod.namespace, pod.name)] = pod.uid
        self.pod_deletes.append((pod.namespace, pod.name, 0 if node is None or not node.ready else grace_seconds))

    scratch: dict[str, Any] = field(default_factory=dict)
    """Per-cycle memo of expensive derived views (see admission._preemption_inputs)."""

    def snapshot_mutations(self) -> int:
        return getattr(self.snapshot, "mutations", -1)

    @property
    def actions(self) -> int:
        """Pod actions queued so far: a reconcile that queued none changed nothing outside."""
        return (
            len(self.pod_creates)
            + len(self.pod_deletes)
            + len(self.ungates)
            + len(self.domain_creates)
            + len(self.domain_deletes)
        )

    def delete_stale_pods(self, pods: dict[str, PodView], expected: dict[str, str]) -> None:
        """Pods not in `expected` (pod name -> node), or pinned elsewhere (their group moved)."""
        for name, pod in pods.items():
            if expected.get(name) != pod.node:
                self.delete_pod(pod)

    def sync_gang(
        self,
        namespace: str,
        pods: dict[str, PodView],
        gang: dict[str, str],
        build: Callable[[list[str]], Iterable[dict[str, Any]]],
    ) -> list[str]:
        """Create the gang's missing pods (manifests built by `build`, only for those); once every
        one exists on its node (`gang`: pod name -> node), lift all their gates together.
        Returns the names that were missing."""
        missing = [name for name in gang if name not in pods]
        if missing:
            self.pod_creates.extend(build(missing))
        whole = not missing and all(not pods[n].terminating and pods[n].node == gang[n] for n in gang)
        if whole:
            self.ungates.extend((namespace, n, [GANG_GATE]) for n in gang if pods[n].gated)
        return missing

    def ensure_service(self, body: dict[str, Any]) -> None:
        """Create a gang's rendezvous Service (idempotent) before its pods, at the flush."""
        self.services.append(body)

    def label_pod(self, namespace: str, name: str, pod_labels: dict[str, str]) -> None:
        """Merge labels into an existing pod at the flush."""
        self.pod_labels.append((namespace, name, pod_labels))

    def ensure_pool_service(self, body: dict[str, Any]) -> None:
        """Bring a pool's Service to `body` at the flush: read, then created or updated only if it
        differs; not even read while `body` equals what was last brought about (see
        `Controller.resync_due`, which forgets that now and then so drift is repaired)."""
        self.pool_services.append(body)

    def ensure_compute_domain(self, body: dict[str, Any]) -> None:
        """Create a job's ComputeDomain (idempotent) before the pods that claim its channel."""
        self.domain_creates.append(body)

    def delete_compute_domain(self, namespace: str, name: str) -> None:
        self.domain_deletes.append((namespace, name))

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def flush_pods(self) -> None:
        """Deletes first (they free names and GPUs), then ComputeDomains and Services, then creates,
        then gate removals.

        A failed call (say, a namespace being deleted) is logged and retried by the next cycle,
        which will find the same difference between placement and pods; it never stops the rest.
        A gang whose Service or ComputeDomain could not be made gets no pods this time, so the
        next cycle finds them missing and makes them all.
        """
        if self.pod_deletes:

            def delete(d: tuple[str, str, int | None]) -> bool:
                self.api.delete_pod(*d)
                return True

            done = self.api.parallel(_logged(delete), self.pod_deletes)
            for (namespace, name, _), ok in zip(self.pod_deletes, done, strict=True):
                if not ok:
                    # Not deleted (a 500, a 429, a dropped connection): were its uid kept in
                    # deleted_uids, the pod would count as gone and never be deleted again, and a
                    # gang re-placed under the same names would wait on it forever (bench.faults).
                    self.deleted_uids.discard(self.delete_uids.get((namespace, name), ""))
        if self.domain_deletes:

            def delete_domain(d: tuple[str, str]) -> bool:
                self.api.delete_compute_domain(*d)
                return True

            done = self.api.parallel(_logged(delete_domain), self.domain_deletes)
            self.domains_deleted |= {d for d, ok in zip(self.domain_deletes, done, strict=True) if ok}
        refused: set[tuple[str, str]] = set()
        if self.domain_creates:

            def create_domain(body: dict[str, Any]) -> bool:
                self.api.create_compute_domain(body)
                return True

            made = self.api.parallel(_logged(create_domain), self.domain_creates)
            # A job whose domain was refused gets no pods now: made without their claim's domain
            # they would wait on a template nobody makes; the next cycle tries both again.
            refused = {_owner_key(body) for body, ok in zip(self.domain_creates, made, strict=True) if not ok}
        if self.services:

            def create_service(body: dict[str, Any]) -> bool:
                self.api.ensure_service(body)
                return True

            made = self.api.parallel(_logged(create_service), self.services)
            refused |= {(*_meta_key(body), JOB) for body, ok in zip(self.services, made, strict=True) if not ok}
        if refused:
            self.pod_creates = [p for p in self.pod_creates if _owner_key(p) not in refused]
        if self.pod_creates:
            self.api.parallel(_logged(self.api.create_pod), self.pod_creates)
        if self.ungates:
            self.api.parallel(_logged(lambda u: self.api.remove_gate(u[0], u[1], GANG_GATE, u[2])), self.ungates)
        if self.pod_labels:
            self.api.parallel(_logged(lambda p: self.api.label_pod(*p)), self.pod_labels)
        self._flush_pool_services()
        self.pod_deletes, self.pod_creates, self.ungates, self.services, self.pod_labels = [], [], [], [], []
        self.domain_creates, self.domain_deletes = [], []
        self.delete_uids = {}

    def _flush_pool_services(self) -> None:
        now = time.monotonic()
        todo = [
            b
            for b in self.pool_services
            if self.applied_services.get(_meta_key(b)) != b and self.service_conflicts.get(_meta_key(b), 0.0) <= now
        ]
        self.pool_services = []
        if not todo:
            return
        outcomes = self.api.parallel(_logged(self.api.apply_service), todo)
        for body, outcome in zip(todo, outcomes, strict=True):
            key = _meta_key(body)
            if outcome is None:  # the call failed (logged): tried again next cycle
                continue
            if outcome == "conflict":
                log.warning("service name taken by another owner", namespace=key[0], name=key[1])
                self.service_conflicts[key] = now + SERVICE_CONFLICT_RETRY_SECONDS
                continue
            self.count(f"services:{outcome}")
            self.service_conflicts.pop(key, None)
            self.applied_services[key] = body


def _meta(body: dict[str, Any]) -> dict[str, Any]:
    return body["metadata"]


def _owner_key(body: dict[str, Any]) -> tuple[str, str, str]:
    """(namespace, owner name, owner label) of a domain or pod: a TrainingJob's or an InferencePool's."""
    meta_labels = _meta(body).get("labels") or {}
    label = POOL if POOL in meta_labels else JOB
    return _meta(body)["namespace"], meta_labels.get(label, ""), label


def _meta_key(body: dict[str, Any]) -> tuple[str, str]:
    return _meta(body)["namespace"], _meta(body)["name"]


def _logged(fn):
    def call(item):
        try:
            return fn(item)
        except Exception as e:  # one object's API error must not abort the cycle
            log.warning("api call failed", call=getattr(fn, "__name__", "pod call"), error=str(e)[:300])
            return None

    return call
