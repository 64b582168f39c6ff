"""Plain views of the Kubernetes objects tidal watches, made from raw bodies by the kopf indices.

Nothing here imports kopf or the Kubernetes client: the controller logic that consumes these views
can be tested with hand-made objects, and the indices hold small immutable records, not bodies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tidal import API_GROUP
from tidal.k8s import labels
from tidal.k8s.taints import Taint, closed, out_of_service, taints_of
from tidal.placement.compute_domains import CLAIM_NAME


def _quantity(value: Any) -> int:
    """Extended resources are whole numbers; tolerate '4', 4 and '4.0'."""
    try:
        return int(float(str(value)))
    except ValueError:
        return 0


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: dict[str, str]
    capacity: dict[str, int]
    ready: bool
    unschedulable: bool
    taints: tuple[Taint, ...] = ()


def runs_nothing(node: NodeView | None) -> bool:
    """No kubelet can still run a pod bound there: its Node object is gone, or it is NotReady with
    the out-of-service taint (an admin fenced it). The taint counts on a NotReady node only, as
    the pod GC reads it: put on a live node by mistake it must not make two copies of a rank. A
    pod bound there is deleted by force (k8s/cycle.py): no kubelet would ever confirm its end."""
    return node is None or (out_of_service(node.taints) and not node.ready)


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str | None
    """Bound node, or the node a tidal pod is pinned to while still gated."""
    bound: bool
    phase: str
    gated: bool
    terminating: bool
    requests: dict[str, int]
    owner: tuple[str, str] | None
    """(kind, name) of the tidal workload controlling the pod (its controller ownerReference):
    ("TrainingJob" | "InferencePool", name)."""
    group: int | None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    domain_claim: str | None = None
    """The ResourceClaimTemplate of its ComputeDomain channel claim, if it has one: a pod made
    before its job's domain was wanted has none (pod specs are immutable) until it is made again."""
    not_scheduled: str | None = None
    """Why kube-scheduler has not bound it ("Unschedulable: 0/3 nodes are available: ..."), from its
    PodScheduled=False condition; None once scheduled or before the scheduler looked."""
    owner_uid: str = ""
    """uid of the controlling workload: a pod of an earlier workload of the same name (deleted and
    made again) is not this one's, even before the garbage collector has removed it."""
    priority_class: str | None = None
    """spec.priorityClassName: which PriorityClass-scoped quotas count the pod."""
    disruption: str | None = None
    """Why something outside the pod ended it ("TerminationByKubelet: ..."), from its
    DisruptionTarget=True condition (the Eviction API, taint manager, scheduler preemption, graceful
    node shutdown); None when it was not disrupted, or was evicted for node pressure."""
    deletion_grace: int | None = None
    """metadata.deletionGracePeriodSeconds of a terminating pod: 0 once it was deleted by force."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def active(self) -> bool:
        return self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class ResourceView:
    """A tidal custom resource: spec and status as plain dicts."""

    kind: str
    namespace: str | None
    name: str
    uid: str
    generation: int
    created: str
    spec: dict[str, Any]
    status: dict[str, Any]
    annotations: dict[str, str]
    resource_version: str
    deleting: bool
    finalizers: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str | None, str]:
        return self.namespace, self.name

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def node_view(body: dict[str, Any]) -> NodeView:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    capacity = {
        k: _quantity(v) for k, v in (status.get("allocatable") or status.get("capacity") or {}).items() if "/" in k
    }
    return NodeView(
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        capacity=capacity,
        ready=conditions.get("Ready") == "True",
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints_of(spec),
    )


def _not_scheduled(status: dict[str, Any]) -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            reason, message = c.get("reason") or "", c.get("message") or ""
            return f"{reason}: {message}" if reason and message else reason or message or "not scheduled"
    return None


def _disruption(status: dict[str, Any]) -> str | None:
    if status.get("reason") == "Evicted":  # node pressure: charged, see training._disrupted
        return None
    for c in status.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            reason, message = c.get("reason") or "", c.get("message") or ""
            return f"{reason}: {message}" if reason and message else reason or message or "disrupted"
    return None


def _pinned_node(spec: dict[str, Any]) -> str | None:
    terms = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
        or []
    )
    for term in terms:
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In" and len(expr.get("values", [])) == 1:
                return expr["values"][0]
    return None


OWNER_KINDS = frozenset({"TrainingJob", "InferencePool"})


def tidal_controller(meta: dict[str, Any]) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the TrainingJob or InferencePool controlling the pod, from its
    controller ownerReference, never from labels: any tenant may label its own GPU pods
    tidal.dev/job=x, and a pod tidal counts as its own holds GPUs tidal counts only through the
    owner's recorded placement. An ownerReference names an object of the pod's own namespace by
    uid: the garbage collector deletes a pod whose owner does not exist, and tidal deletes any pod
    of its workloads it did not place (`Cycle.delete_stale_pods`)."""
    for ref in meta.get("ownerReferences") or []:
        if (
            ref.get("controller")
            and str(ref.get("apiVersion", "")).startswith(f"{API_GROUP}/")
            and ref.get("kind") in OWNER_KINDS
        ):
            return ref["kind"], ref.get("name", ""), ref.get("uid", "")
    return None


def pod_view(body: dict[str, Any]) -> PodView:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    requests: dict[str, int] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, qty in merged.items():
            if "/" in name:
                requests[name] = requests.get(name, 0) + _quantity(qty)
    pod_labels = dict(meta.get("labels") or {})
    controller = tidal_controller(meta)
    owner = (controller[0], controller[1]) if controller else None
    # The group label is read only on pods a tidal workload controls (any tenant can set labels).
    group = pod_labels.get(labels.HBD_GROUP) if owner else None
    bound_node = spec.get("nodeName")
    return PodView(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        uid=meta.get("uid", ""),
        node=bound_node or (_pinned_node(spec) if owner else None),
        bound=bool(bound_node),
        phase=status.get("phase", "Pending"),
        gated=bool(spec.get("schedulingGates")),
        terminating=bool(meta.get("deletionTimestamp")),
        requests=requests,
        deletion_grace=meta.get("deletionGracePeriodSeconds") if meta.get("deletionTimestamp") else None,
        owner=owner,
        owner_uid=controller[2] if controller else "",
        priority_class=spec.get("priorityClassName") or None,  # an empty name is no class to the API server
        group=int(group) if group is not None and group.isdigit() else None,
        labels=pod_labels,
        annotations=dict(meta.get("annotations") or {}),
        domain_claim=next(
            (
                c.get("resourceClaimTemplateName")
                for c in spec.get("resourceClaims") or []
                if c.get("name") == CLAIM_NAME
            ),
            None,
        ),
        not_scheduled=_not_scheduled(status) if owner else None,
        disruption=_disruption(status) if owner else None,
    )


def resource_view(body: dict[str, Any]) -> ResourceView:
    meta = body.get("metadata", {})
    return ResourceView(
        kind=body.get("kind", ""),
        namespace=meta.get("namespace"),
        name=meta["name"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        created=meta.get("creationTimestamp") or "",
        spec=dict(body.get("spec") or {}),
        status=dict(body.get("status") or {}),
        annotations=dict(meta.get("annotations") or {}),
        resource_version=meta.get("resourceVersion", ""),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(meta.get("finalizers") or ()),
    )


@dataclass
class ClusterState:
    """Everything one controller cycle looks at, copied out of the indices at the start of the cycle."""

    nodes: dict[str, NodeView] = field(default_factory=dict)
    pods: dict[tuple[str, str], PodView] = field(default_factory=dict)
    supernodes: dict[str, ResourceView] = field(default_factory=dict)
    jobs: dict[tuple[str | None, str], ResourceView] = field(default_factory=dict)
    pools: dict[tuple[str | None, str], ResourceView] = field(default_factory=dict)
    priority_classes: dict[str, Any] = field(default_factory=dict)
    """PriorityClass name -> tidal.k8s.priority.PriorityClassView."""
    quotas: dict[tuple[str, str], Any] = field(default_factory=dict)
    """(namespace, name) -> tidal.k8s.quota.QuotaView of every ResourceQuota."""

    _by_owner: dict[tuple[str, str | None, str], list[PodView]] | None = field(default=None, repr=False)

    def pods_on_lost_nodes(self) -> list[PodView]:
        """Bound pods of tidal workloads on nodes that run nothing (`runs_nothing`); the watch
        cache keeps an index for this."""
        return [p for p in self.pods.values() if p.owner and p.bound and runs_nothing(self.nodes.get(p.node or ""))]

    @property
    def tainted(self) -> set[str]:
        """Nodes with a NoSchedule or NoExecute taint (the watch cache keeps this as an index)."""
        return {name for name, node in self.nodes.items() if closed(node.taints, node.capacity)}

    def pods_of(self, kind: str, namespace: str | None, name: str) -> list[PodView]:
        if self._by_owner is None:
            self._by_owner = {}
            for pod in self.pods.values():
                if pod.owner is not None:
                    self._by_owner.setdefault((pod.owner[0], pod.namespace, pod.owner[1]), []).append(pod)
        return self._by_owner.get((kind, namespace, name), [])
