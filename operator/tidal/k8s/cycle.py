"""What one controller cycle shares: the watched state, the snapshot, and the plan of actions.

The deciding side of a cycle (reconcile, admission, rebalancing) never calls the API server: every
status write, event, annotation and pod or Service call is recorded in the cycle's `ActionPlan`,
which `k8s/write.py` applies once the decisions are made.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog

from tidal.clock import rfc3339
from tidal.k8s.api import Api
from tidal.k8s.cache import Membership
from tidal.k8s.labels import GANG_GATE
from tidal.k8s.priority import Priorities
from tidal.k8s.quota import Quotas
from tidal.k8s.state import PodView, ResourceView, runs_nothing
from tidal.k8s.status import StatusWriter
from tidal.k8s.taints import Toleration, closed, tolerations_of, untolerated
from tidal.placement.leftover import GroupDemand
from tidal.placement.types import Packing
from tidal.topology.snapshot import ClusterSnapshot

log = structlog.get_logger("tidal")

LOST_PODS_DELETED = "lost_pods_deleted"
"""Counter key: pods deleted by force as their node runs nothing (tidal_lost_pods_deleted_total)."""


@dataclass(frozen=True)
class PodDelete:
    """One pod to delete, as the cycle saw it."""

    namespace: str
    name: str
    grace_seconds: int | None = None
    uid: str = ""
    """Sent as a precondition: a pod of the same name made since (by a new leader during a
    handover) is another pod, and its delete is refused (409), not carried out."""


@dataclass(frozen=True)
class Ungate:
    """One pod whose gang gate to lift, as the cycle saw it."""

    namespace: str
    name: str
    gates: list[str]
    """Its gates as seen: sent as the patch's test, so a pod whose gates changed since is left."""
    uid: str = ""
    """For the ledger of removals sent (k8s/gate_ledger.py), not sent to the API server."""


@dataclass
class ActionPlan:
    """What one cycle decided to change in the cluster; `k8s/write.apply_actions` applies it in
    this order: statuses (a placement is recorded before its pods exist), events, annotations,
    pod deletions, ComputeDomain deletions, ComputeDomain creations and rendezvous Services, gate
    removals, pod creations (none for a workload whose status, domain or Service was refused),
    pod label merges, pool Services."""

    statuses: list[tuple[ResourceView, dict[str, Any]]] = field(default_factory=list)
    """Status writes in decision order (a later write of the same object supersedes an earlier one)."""
    events: list[tuple[ResourceView, str, str, bool]] = field(default_factory=list)
    """(object, reason, message, warning)."""
    annotations: list[tuple[str, str | None, str, dict[str, str]]] = field(default_factory=list)
    """(kind, namespace, name, annotations); kind "Pod" for a pod."""
    pod_deletes: list[PodDelete] = field(default_factory=list)
    domain_deletes: list[tuple[str, str]] = field(default_factory=list)
    """(namespace, name) of ComputeDomains to delete (after the pods that claimed them)."""
    domain_creates: list[dict[str, Any]] = field(default_factory=list)
    """ComputeDomain bodies (labelled with their job) to create before the pods that claim them."""
    services: list[dict[str, Any]] = field(default_factory=list)
    """Gangs' rendezvous Services (named after their job), created before the pods."""
    pod_creates: list[dict[str, Any]] = field(default_factory=list)
    ungates: list[Ungate] = field(default_factory=list)
    pod_labels: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    """(namespace, pod name, labels) merged into existing pods."""
    pool_services: list[dict[str, Any]] = field(default_factory=list)
    """Every live pool's wanted Service this cycle (written only if it changed, see write.py)."""

    @property
    def pod_actions(self) -> int:
        """Pod and ComputeDomain actions (annotations too): what a job's reconcile changes outside
        its status; a job that queued any is reconciled again next cycle, so a failed call is retried."""
        return (
            len(self.annotations)
            + len(self.pod_creates)
            + len(self.pod_deletes)
            + len(self.ungates)
            + len(self.domain_creates)
            + len(self.domain_deletes)
        )


@dataclass(frozen=True)
class Hold:
    """What a workload waiting for its victims (or moves) reserved in one cycle: in the next cycle
    its nodes and its quota share are kept from every workload it does not rank below, until it is
    planned again (when it re-holds, is admitted, or gives up)."""

    priority: int
    nodes: frozenset[str]
    namespace: str = ""
    accelerator: str = "nvidia.com/gpu"
    gpus: int = 0
    priority_class: str | None = None
    """The class its pods get (its own, else the globalDefault): quotas scoped to it count its share."""


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
    forced_uids: set[str] = field(default_factory=set)
    """Of those, the ones deleted by force (`delete_pod`); kept across cycles."""
    ungated_uids: frozenset[str] = frozenset()
    """Pods whose gate removal went out moments ago, still gated in the cache: not sent again
    (k8s/gate_ledger.py)."""
    gates_awaited: int = 0
    """Of those, the ones this cycle's reconciles found (counted as actions: see `actions`)."""
    plan: ActionPlan = field(default_factory=ActionPlan)
    """What this cycle decided to change, applied by k8s/write.py after the decisions."""
    placements_ms: list[float] = field(default_factory=list)
    checkpoint_waits: list[float] = field(default_factory=list)
    pending_waits: list[float] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    """Things that happened this cycle: admitted, preemptions, restarts, evictions:<reason>:<how>..."""
    pending_memo: dict[str, tuple] = field(default_factory=dict)
    """Queued job uid -> what the cluster looked like when it last failed to fit (kept across cycles)."""
    held_before: dict[str, Hold] = field(default_factory=dict)
    """Last cycle's holds (holder uid -> Hold), each dropped when its holder is planned again
    (`release_hold`); its quota share is carried into `quotas` (Quotas.carry)."""
    holds: dict[str, Hold] = field(default_factory=dict)
    """This cycle's reservations, for the next cycle's `held_before`."""
    return_rooms: dict[str, Any] = field(default_factory=dict)
    """Job uid -> the room a defragmentation mover was verified to fit into again, booked in this
    cycle's snapshot (k8s/return_rooms.py: ReturnRoom)."""
    called_off: dict[str, Any] = field(default_factory=dict)
    """Job uid -> an eviction called off this cycle (its preemptor no longer waits), not yet told
    to the job: a later plan of this cycle that evicts the same job takes it over, checkpoint
    request and all, instead of asking for a second checkpoint (k8s/training.py `CalledOff`)."""
    holds_mark: int = 0
    """Last cycle's holds as one number: a queued job is tried again when they change (one that
    gave up for a hold's nodes or quota share may fit once it is gone)."""
    flipped: list[tuple[str, bool, frozenset[str]]] = field(default_factory=list)
    """The (flag, value, nodes) of the `avoiding`/`tolerating` blocks now open, outermost first:
    what is derived from the snapshot inside them (admission's preemption inputs) is brought to
    another block's flags before it is reused there (`reflip`)."""
    victims_added: Counter[int] = field(default_factory=Counter)
    """Priority -> times a preemptible gang of that priority grew (kept across cycles)."""
    evictions_started: int = 0
    """Evictions started so far (kept across cycles): each one may open room for a preemptor."""
    mass_not_ready: bool = False
    """Most nodes are NotReady at once (k8s/outage.py): NotReady alone restarts no group."""
    failed_not_ready: frozenset[str] | None = None
    """NotReady nodes whose groups are placed again (k8s/outage.py: not during an outage, and while
    more than 2 are NotReady only after the grace); None: every NotReady node."""
    deleted_disruption_gpus: int = 0
    """GPUs the disruption budget counts in this hour from jobs deleted since (k8s/disruption_ledger.py)."""
    domain_supernodes: frozenset[str] = frozenset()
    """Supernodes whose own choice is to give jobs NVIDIA ComputeDomains (multi-node NVLink)."""
    domains_installed: Callable[[], bool] = lambda: False
    """Whether the ComputeDomain CRD is served (asked only when a job wants a domain)."""
    priorities: Priorities = field(default_factory=Priorities)
    """Each workload's priority, from its PriorityClass (tidal.k8s.priority)."""
    quotas: Quotas = field(default_factory=Quotas)
    """Namespaces' GPU quotas and usage (tidal.k8s.quota), set before anything is admitted."""
    admission_timeout: dt.timedelta | None = None
    """How long a placed gang's pods may take to be bound and Running before the groups that are
    not get placed again (None: never); counted from status.placedAt, so it survives restarts."""
    demand: GroupDemand | None = None
    """Group sizes placement keeps leftovers for: queued TrainingJobs' and recent arrivals'
    (`admission.placement_demand`)."""
    packing: Packing = Packing.KEEP_WHOLE
    """The operator's --packing, stamped on every request the cycle builds (GangRequest.packing)."""
    domains_deleted_before: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name) of ComputeDomains whose delete the previous cycle's write saw succeed (or
    404): a job drops such a name from status.staleComputeDomains; any other stale name is deleted
    again, so a failed delete (or one lost to an operator restart) is retried, never leaked."""

    @property
    def stamp(self) -> str:
        return rfc3339(self.now)

    # The plan's lists, under the names the deciding code uses.
    @property
    def pod_creates(self) -> list[dict[str, Any]]:
        return self.plan.pod_creates

    @property
    def pod_deletes(self) -> list[PodDelete]:
        return self.plan.pod_deletes

    @property
    def ungates(self) -> list[Ungate]:
        return self.plan.ungates

    @property
    def services(self) -> list[dict[str, Any]]:
        return self.plan.services

    @property
    def domain_creates(self) -> list[dict[str, Any]]:
        return self.plan.domain_creates

    @property
    def domain_deletes(self) -> list[tuple[str, str]]:
        return self.plan.domain_deletes

    @property
    def pod_labels(self) -> list[tuple[str, str, dict[str, str]]]:
        return self.plan.pod_labels

    @property
    def pool_services(self) -> list[dict[str, Any]]:
        return self.plan.pool_services

    def not_ready_failed(self, node: str) -> bool:
        """Whether the NotReady `node` counts as a failed machine now (k8s/outage.py)."""
        return self.failed_not_ready is None or node in self.failed_not_ready

    def event(self, view: ResourceView, reason: str, message: str, warning: bool = False) -> None:
        self.plan.events.append((view, reason, message, warning))

    def write_status(self, view: ResourceView, status: dict[str, Any]) -> None:
        """Record `status` as the object's new status; written (if it differs) by k8s/write.py."""
        self.plan.statuses.append((view, status))

    def annotate(self, kind: str, namespace: str | None, name: str, annotations: dict[str, str]) -> None:
        self.plan.annotations.append((kind, namespace, name, annotations))

    def delete_pod(self, pod: PodView, grace_seconds: int | None = None) -> None:
        """Delete once. Forced (grace 0) when no kubelet can still run the pod (`runs_nothing`),
        even if it is already terminating with a grace period (deleted before its node was lost
        or fenced, by this operator or anyone): nothing would ever confirm that delete, and as
        pod names are fixed per rank, the rank's new pod waits for it. A NotReady node may be
        merely partitioned and still running the pod: its delete waits for the kubelet (or a
        fence), so no second copy of a rank is made meanwhile."""
        if runs_nothing(self.state.nodes.get(pod.node or "")):
            if pod.deletion_grace == 0 or pod.uid in self.forced_uids:
                return
            self.forced_uids.add(pod.uid)
            self.count(LOST_PODS_DELETED)
            # A decision with no Event of its own (the pod's group restart has one): its INFO line.
            log.info("lost pod deleted at once", namespace=pod.namespace, pod=pod.name, node=pod.node)
            self.deleted_uids.add(pod.uid)
            self.pod_deletes.append(PodDelete(pod.namespace, pod.name, 0, pod.uid))
            return
        if pod.terminating or pod.uid in self.deleted_uids:
            return
        # A caller's "at once" becomes the shortest grace that still waits for the kubelet.
        grace = 1 if grace_seconds == 0 else grace_seconds
        self.deleted_uids.add(pod.uid)
        self.pod_deletes.append(PodDelete(pod.namespace, pod.name, grace, pod.uid))

    def delete_lost_pods(self) -> None:
        """Force every tidal pod bound to a node that runs nothing, in the first cycle that sees
        it, whichever decision (a restart, a shrink, a deletion) or outside actor asked for it or
        will: a decision that finds it terminating does not ask again."""
        served = {"TrainingJob": self.state.jobs, "InferencePool": self.state.pools}
        for pod in self.state.pods_on_lost_nodes():
            # Only pods of workloads this operator serves (`tidal run --namespace`): another
            # instance serving other namespaces sees the same node gone and forces its own.
            owners = served.get(pod.owner[0]) if pod.owner else None
            if owners is not None and (pod.namespace, pod.owner[1]) in owners:
                self.delete_pod(pod, 0)

    scratch: dict[str, Any] = field(default_factory=dict)
    """Per-cycle memo of expensive derived views (see admission._preemption_inputs)."""
    tolerated_by: dict[tuple[Toleration, ...], frozenset[str]] = field(default_factory=dict)
    """Per-cycle memo of `tolerated`, by the tolerations."""

    @contextmanager
    def tolerating(self, template: dict[str, Any] | None) -> Iterator[None]:
        """Plan one workload: the tainted nodes its pod template tolerates are usable inside.

        The snapshot marks every NoSchedule/NoExecute-tainted node unusable (the pure core knows
        no tolerations); a workload that tolerates some gets them back for its own planning only,
        and they are marked again after, with whatever it booked there kept."""
        snapshot = self.snapshot
        lifted = [n for n in self.tolerated(template) if (s := snapshot.nodes.get(n)) is not None and s.tainted]
        with self._flipped(lifted, "tainted", False):
            yield

    def tolerated(self, template: dict[str, Any] | None) -> frozenset[str]:
        """The nodes kept from tidal's pods by taints (closed ones) that this pod template tolerates
        every one of: where it may go that others may not."""
        tolerations = tolerations_of(template)
        if not tolerations:
            return frozenset()
        # Asked for every queued job and growing pool, often with the same tolerations: one scan of
        # the tainted nodes per set per cycle (the watched nodes do not change within a cycle).
        found = self.tolerated_by.get(tolerations)
        if found is None:
            nodes = self.state.nodes
            found = self.tolerated_by[tolerations] = frozenset(
                name
                for name in self.state.tainted
                if (node := nodes.get(name)) is not None
                and (taints := closed(node.taints, node.capacity))
                and not untolerated(taints, tolerations)
            )
        return found

    def held_from(self, uid: str | None = None, priority: int | None = None) -> set[str]:
        """Nodes reserved last cycle by other waiting jobs that `priority` may not take (all of
        them when None): a holder of equal or higher priority keeps its nodes."""
        return {
            node
            for holder, hold in self.held_before.items()
            if holder != uid and (priority is None or hold.priority >= priority)
            for node in hold.nodes
        }

    def hold(self, view: ResourceView, gpus_by_node: dict[str, int]) -> None:
        """Keep a waiting workload's planned nodes (already reserved in the snapshot by the caller)
        and its quota share: this cycle by booking, the next one through `held_before`."""
        gpus = sum(gpus_by_node.values())
        self.quotas.book(view, gpus)
        accelerator = view.spec.get("accelerator", "nvidia.com/gpu")
        priority = self.priorities.of(view)
        self.holds[view.uid] = Hold(
            priority,
            frozenset(gpus_by_node),
            view.namespace or "",
            accelerator,
            gpus,
            self.priorities.class_name(view),
        )

    def release_hold(self, uid: str) -> None:
        """The holder is being planned again (or is no longer waiting): what it held last cycle is
        everyone's again; a new hold of its own is reserved and booked afresh."""
        if self.held_before.pop(uid, None) is not None:
            self.quotas.release_hold(uid)

    @contextmanager
    def avoiding(self, nodes: Iterable[str]) -> Iterator[None]:
        """Plan with these nodes unusable (cordoned in the snapshot for the block only)."""
        snapshot = self.snapshot
        open_nodes = [n for n in nodes if n in snapshot.nodes and not snapshot.nodes[n].cordoned]
        with self._flipped(open_nodes, "cordoned", True):
            yield

    @contextmanager
    def _flipped(self, names: list[str], flag: str, value: bool) -> Iterator[None]:
        """The snapshot's `flag` set to `value` on these nodes for the block, then set back, with
        whatever was booked on them meanwhile kept (unjournaled flips; bookings journal themselves)."""
        for name in names:
            ClusterSnapshot.update_node(self.snapshot, name, **{flag: value})
        if names:
            self.flipped.append((flag, value, frozenset(names)))
        try:
            yield
        finally:
            for name in names:
                ClusterSnapshot.update_node(self.snapshot, name, **{flag: not value})
            if names:
                self.flipped.pop()

    @staticmethod
    def reflip(
        snapshot: ClusterSnapshot,
        was: tuple[tuple[str, bool, frozenset[str]], ...],
        now: tuple[tuple[str, bool, frozenset[str]], ...],
    ) -> None:
        """Bring a copy made under the flips `was` to the flips `now`, in O(nodes flipped): the
        blocks after their common prefix are undone innermost first, then the new ones applied.
        Exact, as each block flipped only nodes whose flag it found the other way."""
        common = 0
        while common < min(len(was), len(now)) and was[common] == now[common]:
            common += 1
        for flag, value, names in reversed(was[common:]):
            for name in names:
                ClusterSnapshot.update_node(snapshot, name, **{flag: not value})
        for flag, value, names in now[common:]:
            for name in names:
                ClusterSnapshot.update_node(snapshot, name, **{flag: value})

    def snapshot_mutations(self) -> int:
        return getattr(self.snapshot, "mutations", -1)

    @property
    def actions(self) -> int:
        """Pod and ComputeDomain actions queued so far, and gate removals awaited from an earlier
        cycle: a reconcile that queued none changed nothing outside and waits for nothing (a job
        awaiting its gates is not settled, so they are sent again if the watch never shows them)."""
        return self.plan.pod_actions + self.gates_awaited

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
            gated = [n for n in gang if pods[n].gated]
            awaited = {n for n in gated if pods[n].uid in self.ungated_uids}
            self.gates_awaited += len(awaited)
            self.ungates.extend(Ungate(namespace, n, [GANG_GATE], pods[n].uid) for n in gated if n not in awaited)
        return missing

    def ensure_service(self, body: dict[str, Any]) -> None:
        """Create a gang's rendezvous Service (idempotent) before its pods, when the plan is applied."""
        self.services.append(body)

    def label_pod(self, namespace: str, name: str, pod_labels: dict[str, str]) -> None:
        """Merge labels into an existing pod when the plan is applied."""
        self.pod_labels.append((namespace, name, pod_labels))

    def ensure_pool_service(self, body: dict[str, Any]) -> None:
        """Bring a pool's Service to `body` when the plan is applied: read, then created or updated only if it
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
