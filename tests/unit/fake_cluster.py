"""An in-memory stand-in for the API server, kube-scheduler and KWOK, for unit tests of the
controller's decisions (the real thing is exercised by tests/cluster). It records every call in
order, applies status patches and annotations, binds ungated pods at once and runs them."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from tidal.k8s import labels
from tidal.k8s.api import StatusConflict
from tidal.k8s.compact import from_wire
from tidal.k8s.manifests import controlled_by_owner, service_update
from tidal.k8s.priority import PriorityClassView
from tidal.k8s.quota import QuotaView, quota_view
from tidal.k8s.state import ClusterState, NodeView, ResourceView, node_view, pod_view
from tidal.model.server_defaults import status_as_stored
from tidal.topology.fleet import build_fleet

_uids = itertools.count(1)
_versions = itertools.count(2)


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):  # RFC 7386: merged into {} where the target is no object, nulls dropped
            out[k] = _merge(out[k] if isinstance(out.get(k), dict) else {}, v)
        else:
            out[k] = v
    return out


class FakeCluster:
    def __init__(self, shape: str = "nvl72", supernodes: int = 4, clique: bool = False):
        """`clique`: label nodes with nvidia.com/gpu.clique as GPU feature discovery does on GB200."""
        self.compute_domains: dict[tuple[str, str], dict[str, Any]] = {}
        self.compute_domain_crd = True
        self.calls: list[tuple[str, Any]] = []
        self.requests: Counter[str] = Counter()
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.objects: dict[tuple[str, str | None, str], ResourceView] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        """Services made by apply_service (the pools'), as the API server would return them."""
        self.priority_classes: dict[str, PriorityClassView] = {}
        self.quotas: dict[tuple[str, str], QuotaView] = {}
        self.config_maps: dict[tuple[str, str], tuple[dict[str, str], str]] = {}
        """(namespace, name) -> (data, resourceVersion)."""
        for sn in build_fleet(shape, supernodes):
            for n in sn.nodes:
                self.nodes[n.name] = node_view(
                    {
                        "metadata": {
                            "name": n.name,
                            "labels": {
                                labels.SUPERNODE: sn.name,
                                labels.BLOCK: sn.block,
                                **({labels.GPU_CLIQUE: f"clique-{sn.name}"} if clique else {}),
                            },
                        },
                        "status": {
                            "allocatable": {n.accelerator: str(n.gpus)},
                            "conditions": [{"type": "Ready", "status": "True"}],
                        },
                    }
                )
            self.add("Supernode", None, sn.name, {"accelerator": sn.shape.accelerator})

    # -- objects -----------------------------------------------------------------------------
    def add(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        spec: dict[str, Any],
        annotations: dict[str, str] | None = None,
    ) -> ResourceView:
        view = ResourceView(
            kind,
            namespace,
            name,
            f"uid-{next(_uids)}",
            1,
            f"2026-01-01T00:00:{len(self.objects):02d}Z",
            spec,
            {},
            dict(annotations or {}),
            "1",
            False,
        )
        self.objects[(kind, namespace, name)] = view
        return view

    def add_priority_class(self, name: str, value: int, global_default: bool = False) -> str:
        self.priority_classes[name] = PriorityClassView(name, value, global_default)
        return name

    def add_quota(self, namespace: str, name: str, hard: dict[str, str], **spec: Any) -> None:
        body = {"metadata": {"namespace": namespace, "name": name}, "spec": {"hard": hard, **spec}}
        self.quotas[(namespace, name)] = quota_view(body)

    def list_keys(self, kind: str) -> set[Any]:
        """What `Api.list_keys` returns: the keys of every object of that kind held now."""
        self._log("list_keys", kind)
        custom = {"job": "TrainingJob", "pool": "InferencePool", "supernode": "Supernode"}
        if kind in custom:
            return {(ns, name) if ns else name for k, ns, name in self.objects if k == custom[kind]}
        tables = {"node": self.nodes, "pod": self.pods, "priorityclass": self.priority_classes, "quota": self.quotas}
        return set(tables[kind])

    def get(self, kind: str, namespace: str | None, name: str) -> ResourceView:
        return self.objects[(kind, namespace, name)]

    def status(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        """The stored status as the operator reads it (a TrainingJob's compact placement expanded)."""
        view = self.get(kind, namespace, name)
        return from_wire(view.status) if kind == "TrainingJob" else view.status

    def state(self) -> ClusterState:
        by_kind: dict[str, dict] = {"Supernode": {}, "TrainingJob": {}, "InferencePool": {}}
        for (kind, ns, name), view in self.objects.items():
            by_kind[kind][name if kind == "Supernode" else (ns, name)] = view
        return ClusterState(
            nodes=dict(self.nodes),
            pods={key: pod_view(body) for key, body in self.pods.items()},
            supernodes=by_kind["Supernode"],
            jobs=by_kind["TrainingJob"],
            pools=by_kind["InferencePool"],
            priority_classes=dict(self.priority_classes),
            quotas=dict(self.quotas),
        )

    def pods_of(self, owner_label: str, name: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["metadata"]["labels"].get(owner_label) == name]

    # -- the Api surface the controller uses --------------------------------------------------
    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def _log(self, verb: str, detail: Any) -> None:
        self.requests[verb] += 1
        self.calls.append((verb, detail))

    def parallel(self, fn, items):
        return [fn(i) for i in items]

    def create_pod(self, body: dict[str, Any]) -> bool:
        self._log("create_pod", body["metadata"]["name"])
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key in self.pods:
            return False
        body = {**body, "metadata": {**body["metadata"], "uid": f"pod-{next(_uids)}"}, "status": {"phase": "Pending"}}
        self.pods[key] = body
        return True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str = "") -> None:
        self._log("delete_pod", name)
        pod = self.pods.get((namespace, name))
        if pod is not None and uid and pod["metadata"].get("uid") != uid:
            return  # the API server's uid precondition: another pod of that name is kept
        self.pods.pop((namespace, name), None)

    def remove_gate(self, namespace: str, name: str, gate: str, gates: list[str]) -> None:
        self._log("ungate_pod", name)
        pod = self.pods.get((namespace, name))
        if pod is None:
            return
        spec = dict(pod["spec"])
        spec["schedulingGates"] = []
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        spec["nodeName"] = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        self.pods[(namespace, name)] = {**pod, "spec": spec, "status": {"phase": "Running"}}

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._log("annotate_pod", (name, annotations))
        pod = self.pods.get((namespace, name))
        if pod is not None:
            meta = pod["metadata"]
            pod["metadata"] = {**meta, "annotations": {**(meta.get("annotations") or {}), **annotations}}

    def label_pod(self, namespace: str, name: str, pod_labels: dict[str, str]) -> None:
        self._log("label_pod", (name, pod_labels))
        pod = self.pods.get((namespace, name))
        if pod is not None:
            meta = pod["metadata"]
            pod["metadata"] = {**meta, "labels": {**(meta.get("labels") or {}), **pod_labels}}

    def ensure_service(self, body: dict[str, Any]) -> None:
        self._log("create_service", body["metadata"]["name"])

    def apply_service(self, body: dict[str, Any]) -> str:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self._log("get_service", key)
        current = self.services.get(key)
        if current is None:
            self._log("create_service", key)
            self.services[key] = {**body, "spec": {**body["spec"], "clusterIP": "10.96.0.10", "type": "ClusterIP"}}
            return "created"
        if not controlled_by_owner(current, body):
            return "conflict"
        update = service_update(current, body)
        if update is None:
            return "unchanged"
        self._log("update_service", key)
        self.services[key] = update
        return "updated"

    def compute_domains_installed(self) -> bool:
        self._log("discover_compute_domains", None)
        return self.compute_domain_crd

    def create_compute_domain(self, body: dict[str, Any]) -> bool:
        meta = body["metadata"]
        self._log("create_compute_domain", meta["name"])
        if not self.compute_domain_crd:
            raise RuntimeError("404 Not Found: computedomains.resource.nvidia.com")
        key = (meta["namespace"], meta["name"])
        if key in self.compute_domains:
            if self.compute_domains[key]["metadata"].get("deletionTimestamp"):
                raise RuntimeError(f"ComputeDomain {key} is still being deleted")
            if not controlled_by_owner(self.compute_domains[key], body):  # as Api.create_compute_domain
                raise RuntimeError(f"ComputeDomain {key} is controlled by another owner")
            return False
        self.compute_domains[key] = body
        return True

    def delete_compute_domain(self, namespace: str, name: str) -> None:
        self._log("delete_compute_domain", name)
        self.compute_domains.pop((namespace, name), None)

    def patch_status(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> str | None:
        """As the API server: a patch naming a resourceVersion the object has moved past conflicts,
        and the CRD schema's defaults are filled in (at any depth) in what it stores."""
        self._log("patch_status", (kind, name))
        key = (kind, namespace, name)
        if key not in self.objects:
            return None
        view = self.objects[key]
        if resource_version and resource_version != view.resource_version:
            raise StatusConflict(f"{kind} {name}: {resource_version} is not {view.resource_version}")
        stored = status_as_stored(kind, _merge(view.status, status))
        self.objects[key] = replace(view, status=stored, resource_version=self._next_version())
        return self.objects[key].resource_version

    def read_status(self, kind: str, namespace: str | None, name: str) -> tuple[dict[str, Any], str, str] | None:
        self._log("get_status", (kind, name))
        view = self.objects.get((kind, namespace, name))
        return None if view is None else (dict(view.status), view.resource_version, view.uid)

    def _next_version(self) -> str:
        return str(next(_versions))

    def annotate(self, kind: str, namespace: str | None, name: str, annotations: dict[str, str | None]) -> None:
        self._log("annotate", (kind, name, annotations))
        key = (kind, namespace, name)
        if key in self.objects:
            view = self.objects[key]
            self.objects[key] = replace(
                view, annotations=_merge(view.annotations, annotations), resource_version=self._next_version()
            )

    def read_config_map(self, namespace: str, name: str) -> tuple[dict[str, str] | None, str | None]:
        self._log("get_configmap", (namespace, name))
        held = self.config_maps.get((namespace, name))
        return (None, None) if held is None else (dict(held[0]), held[1])

    def save_config_map(self, namespace: str, name: str, data: dict[str, str], resource_version: str | None) -> None:
        """As the API server: made only if missing, patched only at the resourceVersion read (else 409)."""
        self._log("save_configmap", (namespace, name))
        held = self.config_maps.get((namespace, name))
        if (held[1] if held else None) != resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.config_maps[(namespace, name)] = ({**(held[0] if held else {}), **data}, self._next_version())

    def create_supernode(self, name: str, spec: dict[str, Any]) -> bool:
        self._log("create_supernode", name)
        return False

    def event(self, kind, namespace, name, uid, reason, message, warning=False, api_version=None) -> None:
        self._log("event", (name, reason, message))
