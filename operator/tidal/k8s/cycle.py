"""What one controller cycle shares: the watched state, the snapshot, and the plan of actions.

The deciding side of a cycle (reconcile, admission, rebalancing) never calls the API server: every
status write, event, annotation and pod or Service call is recorded in the cycle's `ActionPlan`,
which `k8s/write.py` applies once the decisions are made.
"""

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
from tidal.k8s.labels import GANG_GATE
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.status import StatusWriter
from tidal.topology.snapshot import ClusterSnapshot

log = structlog.get_logger("tidal")


@dataclass
class ActionPlan:
    """What one cycle decided to change in the cluster; `k8s/write.apply_actions` applies it in
    this order: statuses (a placement is recorded before its pods exist), events, annotations,
    pod deletions, Services, pod creations, gate removals."""

    statuses: list[tuple[ResourceView, dict[str, Any]]] = field(default_factory=list)
    """Status writes in decision order (a later write of the same object supersedes an earlier one)."""
    events: list[tuple[ResourceView, str, str, bool]] = field(default_factory=list)
    """(object, reason, message, warning)."""
    annotations: list[tuple[str, str | None, str, dict[str, str]]] = field(default_factory=list)
    """(kind, namespace, name, annotations); kind "Pod" for a pod."""
    pod_deletes: list[tuple[str, str, int | None]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    pod_creates: list[dict[str, Any]] = field(default_factory=list)
    ungates: list[tuple[str, str, list[str]]] = field(default_factory=list)

    @property
    def pod_actions(self) -> int:
        return len(self.pod_creates) + len(self.pod_deletes) + len(self.ungates)


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
    plan: ActionPlan = field(default_factory=ActionPlan)
    """What this cycle decided to change, applied by k8s/write.py after the decisions."""
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

    # The plan's lists, under the names the deciding code uses.
    @property
    def pod_creates(self) -> list[dict[str, Any]]:
        return self.plan.pod_creates

    @property
    def pod_deletes(self) -> list[tuple[str, str, int | None]]:
        return self.plan.pod_deletes

    @property
    def ungates(self) -> list[tuple[str, str, list[str]]]:
        return self.plan.ungates

    @property
    def services(self) -> list[dict[str, Any]]:
        return self.plan.services

    def event(self, view: ResourceView, reason: str, message: str, warning: bool = False) -> None:
        self.plan.events.append((view, reason, message, warning))

    def write_status(self, view: ResourceView, status: dict[str, Any]) -> None:
        """Record `status` as the object's new status; written (if it differs) by k8s/write.py."""
        self.plan.statuses.append((view, status))

    def annotate(self, kind: str, namespace: str | None, name: str, annotations: dict[str, str]) -> None:
        self.plan.annotations.append((kind, namespace, name, annotations))

    def delete_pod(self, pod: PodView, grace_seconds: int | None = None) -> None:
        """Delete once; at once (grace 0) when its node is gone, as no kubelet will confirm."""
        if pod.terminating or pod.uid in self.deleted_uids:
            return
        node = self.state.nodes.get(pod.node or "")
        self.deleted_uids.add(pod.uid)
        self.pod_deletes.append((pod.namespace, pod.name, 0 if node is None or not node.ready else grace_seconds))

    scratch: dict[str, Any] = field(default_factory=dict)
    """Per-cycle memo of expensive derived views (see admission._preemption_inputs)."""

    def snapshot_mutations(self) -> int:
        return getattr(self.snapshot, "mutations", -1)

    @property
    def actions(self) -> int:
        """Pod actions queued so far: a reconcile that queued none changed nothing outside."""
        return self.plan.pod_actions

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
        """Create a gang's rendezvous Service (idempotent) before its pods, when the plan is applied."""
        self.services.append(body)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n
