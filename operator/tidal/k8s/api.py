"""Thin, counted, idempotent wrappers over the Kubernetes API calls the controller makes."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tidal import API_GROUP, API_VERSION
from tidal.k8s.manifests import controlled_by_owner, service_update

log = structlog.get_logger("tidal")


class DomainTerminating(RuntimeError):
    """A ComputeDomain of the wanted name exists but is being deleted."""


class DomainOwnedElsewhere(DomainTerminating):
    """A ComputeDomain of the wanted name exists but another owner controls it: typically a job
    deleted and made again under the same name before the garbage collector removed the old job's
    domain. Adopting it would be wrong twice: the garbage collector deletes it under the running
    job. Handled as DomainTerminating: the pods wait, and the next cycle tries again."""


COMPUTE_DOMAIN_GROUP = "resource.nvidia.com"
COMPUTE_DOMAIN_VERSION = "v1beta1"
COMPUTE_DOMAIN_PLURAL = "computedomains"
PLURALS = {"TrainingJob": "trainingjobs", "InferencePool": "inferencepools", "Supernode": "supernodes"}


def load_client(kubeconfig: str | None = None, pool_size: int = 32) -> client.ApiClient:
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class Api:
    def __init__(self, api_client: client.ApiClient, workers: int = 16):
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-api")

    def _count(self, verb: str) -> None:
        with self._lock:
            self.requests[verb] += 1

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def parallel(self, fn, items: list[Any]) -> list[Any]:
        return list(self._pool.map(fn, items))

    # -- pods and services -------------------------------------------------------------------
    def create_pod(self, body: dict[str, Any]) -> bool:
        """True if created, False if a pod of that name already exists."""
        self._count("create_pod")
        try:
            self.core.create_namespaced_pod(body["metadata"]["namespace"], body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        self._count("delete_pod")
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)
        except ApiException as e:
            if e.status != 404:
                raise

    def remove_gate(self, namespace: str, name: str, gate: str, gates: list[str]) -> None:
        self._count("ungate_pod")
        remaining = [{"name": g} for g in gates if g != gate]
        patch = [
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in gates]},
            {"op": "replace", "path": "/spec/schedulingGates", "value": remaining},
        ]
        try:
            self.core.patch_namespaced_pod(name, namespace, patch)
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._count("annotate_pod")
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})
        except ApiException as e:
            if e.status != 404:
                raise

    def label_pod(self, namespace: str, name: str, pod_labels: dict[str, str]) -> None:
        self._count("label_pod")
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": pod_labels}})
        except ApiException as e:
            if e.status != 404:
                raise

    def ensure_service(self, body: dict[str, Any]) -> None:
        self._count("create_service")
        try:
            self.core.create_namespaced_service(body["metadata"]["namespace"], body)
        except ApiException as e:
            if e.status != 409:
                raise

    def apply_service(self, body: dict[str, Any]) -> str:
        """Bring a Service to `body` in the fields tidal owns: "created", "updated", "unchanged"
        (no write), or "conflict" (the name is taken by a Service another owner controls)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self._count("get_service")
        try:
            read = self.core.read_namespaced_service(name, namespace)
            current = self.core.api_client.sanitize_for_serialization(read)
        except ApiException as e:
            if e.status != 404:
                raise
            self._count("create_service")
            self.core.create_namespaced_service(namespace, body)
            return "created"
        if not controlled_by_owner(current, body):
            return "conflict"
        update = service_update(current, body)
        if update is None:
            return "unchanged"
        self._count("update_service")
        # A PUT carries the resourceVersion read: a concurrent change fails (409) and is retried.
        self.core.replace_namespaced_service(name, namespace, update)
        return "updated"

    # -- NVIDIA ComputeDomains (resource.nvidia.com) ------------------------------------------
    def compute_domains_installed(self) -> bool:
        """Whether the API server serves ComputeDomains (the NVIDIA DRA driver's CRD is installed).
        A discovery read: any authenticated identity may make it."""
        self._count("discover_compute_domains")
        try:
            resources = self.custom.get_api_resources(COMPUTE_DOMAIN_GROUP, COMPUTE_DOMAIN_VERSION)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.name == COMPUTE_DOMAIN_PLURAL for r in resources.resources or [])

    def create_compute_domain(self, body: dict[str, Any]) -> bool:
        """True if created, False if it exists already (its spec is immutable: names are deterministic).

        Raises DomainTerminating when one of that name is still being deleted (the driver's
        finalizer waits for its IMEX daemons): pods made now would claim a template about to go,
        so the caller holds them back and tries again next cycle. Likewise (DomainOwnedElsewhere)
        when its controller ownerReference is not the body's owner (same name, other uid)."""
        self._count("create_compute_domain")
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(
                COMPUTE_DOMAIN_GROUP, COMPUTE_DOMAIN_VERSION, namespace, COMPUTE_DOMAIN_PLURAL, body
            )
            return True
        except ApiException as e:
            if e.status != 409:
                raise
        self._count("get_compute_domain")
        existing = self.custom.get_namespaced_custom_object(
            COMPUTE_DOMAIN_GROUP, COMPUTE_DOMAIN_VERSION, namespace, COMPUTE_DOMAIN_PLURAL, name
        )
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise DomainTerminating(f"ComputeDomain {namespace}/{name} is still being deleted")
        if not controlled_by_owner(existing, body):
            raise DomainOwnedElsewhere(
                f"ComputeDomain {namespace}/{name} is controlled by another owner (a deleted job of the same "
                "name, not yet garbage collected?)"
            )
        return False

    def delete_compute_domain(self, namespace: str, name: str) -> None:
        self._count("delete_compute_domain")
        try:
            self.custom.delete_namespaced_custom_object(
                COMPUTE_DOMAIN_GROUP, COMPUTE_DOMAIN_VERSION, namespace, COMPUTE_DOMAIN_PLURAL, name
            )
        except ApiException as e:
            if e.status != 404:
                raise

    # -- tidal resources --------------------------------------------------------------------
    def patch_status(self, kind: str, namespace: str | None, name: str, status: dict[str, Any]) -> bool:
        """Merge-patch the status subresource; False if the object is gone."""
        self._count("patch_status")
        body = {"status": status}
        try:
            if namespace:
                self.custom.patch_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, namespace, PLURALS[kind], name, body
                )
            else:
                self.custom.patch_cluster_custom_object_status(API_GROUP, API_VERSION, PLURALS[kind], name, body)
            return True
        except ApiException as e:
            if e.status != 404:  # the next cycle retries the same write; never abort the cycle over it
                log.warning(
                    "status patch failed",
                    kind=kind,
                    namespace=namespace,
                    name=name,
                    status=e.status,
                    reason=str(e.reason),
                )
            return False

    def annotate(self, kind: str, namespace: str | None, name: str, annotations: dict[str, str | None]) -> None:
        self._count("annotate")
        body = {"metadata": {"annotations": annotations}}
        try:
            if namespace:
                self.custom.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURALS[kind], name, body)
            else:
                self.custom.patch_cluster_custom_object(API_GROUP, API_VERSION, PLURALS[kind], name, body)
        except ApiException as e:
            if e.status != 404:
                raise

    def create_supernode(self, name: str, spec: dict[str, Any]) -> bool:
        self._count("create_supernode")
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "Supernode",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "tidal"}},
            "spec": spec,
        }
        try:
            self.custom.create_cluster_custom_object(API_GROUP, API_VERSION, "supernodes", body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def event(
        self, kind: str, namespace: str | None, name: str, uid: str, reason: str, message: str, warning: bool = False
    ) -> None:
        self._count("create_event")
        ts = dt.datetime.now(dt.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace or "default"),
            involved_object=client.V1ObjectReference(
                api_version=f"{API_GROUP}/{API_VERSION}", kind=kind, name=name, namespace=namespace, uid=uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            first_timestamp=ts,
            last_timestamp=ts,
            count=1,
            source=client.V1EventSource(component="tidal"),
            reporting_component="tidal.dev/operator",
            reporting_instance="tidal",
        )
        with contextlib.suppress(ApiException):  # events are best effort: never fail a reconcile over one
            self.core.create_namespaced_event(namespace or "default", body)
