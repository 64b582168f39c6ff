"""What one controller cycle shares: the watched state, the snapshot, and the ways to act."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from tidal.clock import rfc3339
from tidal.k8s.api import Api
from tidal.k8s.cache import Membership
from tidal.k8s.labels import GANG_GATE, JOB
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.status import StatusWriter
from tidal.topology.snapshot import ClusterSnapshot

log = structlog.get_logger("tidal")


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
    services: list[dict[str, Any]] = field(default_factory=list)
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
        return len(self.pod_creates) + len(self.pod_deletes) + len(self.ungates)

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

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def flush_pods(self) -> None:
        """Deletes first (they free names and GPUs), then Services, then creates, then gate removals.

        A failed call (say, a namespace being deleted) is logged and retried by the next cycle,
        which will find the same difference between placement and pods; it never stops the rest.
        A gang whose Service could not be made gets no pods this time, so the next cycle finds
        them missing and makes both.
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
        if self.services:

            def create_service(body: dict[str, Any]) -> bool:
                self.api.ensure_service(body)
                return True

            made = self.api.parallel(_logged(create_service), self.services)
            failed = {_meta_key(body) for body, ok in zip(self.services, made, strict=True) if not ok}
            if failed:
                self.pod_creates = [
                    p for p in self.pod_creates if (_meta(p)["namespace"], _meta(p)["labels"].get(JOB)) not in failed
                ]
        if self.pod_creates:
            self.api.parallel(_logged(self.api.create_pod), self.pod_creates)
        if self.ungates:
            self.api.parallel(_logged(lambda u: self.api.remove_gate(u[0], u[1], GANG_GATE, u[2])), self.ungates)
        self.pod_deletes, self.pod_creates, self.ungates, self.services = [], [], [], []
        self.delete_uids = {}


def _meta(body: dict[str, Any]) -> dict[str, Any]:
    return body["metadata"]


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
