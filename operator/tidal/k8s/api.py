"""Thin, counted, idempotent wrappers over the Kubernetes API calls the controller makes."""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import structlog
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tidal import API_GROUP, API_VERSION, __version__
from tidal.k8s.manifests import controlled_by_owner, service_update

log = structlog.get_logger("tidal")
T = TypeVar("T")


class StatusConflict(RuntimeError):
    """A status patch carrying a resourceVersion found the object changed since (HTTP 409)."""


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
CUSTOM_PLURALS = {"job": "trainingjobs", "pool": "inferencepools", "supernode": "supernodes"}
NAMESPACED_KINDS = frozenset({"pod", "job", "pool", "quota"})
LIST_PAGE = 500
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"


@dataclass(frozen=True)
class RetryPolicy:
    """Request timeouts and retries of every call `Api` makes.

    A transient answer (429, 5xx, a dropped connection, a timeout) is tried again after an
    exponential backoff with full jitter, so that replicas and threads throttled together do not
    come back together. A call never retries past `budget_seconds`: the cycle that made it waits,
    and the next cycle tries again anyway."""

    timeout_seconds: float = 15.0
    """Read timeout of one request (operator flag --api-timeout)."""
    connect_timeout_seconds: float = 5.0
    attempts: int = 4
    backoff_base_seconds: float = 0.2
    backoff_cap_seconds: float = 5.0
    budget_seconds: float = 30.0

    @property
    def request_timeout(self) -> tuple[float, float]:
        """(connect, read), as the Kubernetes client's `_request_timeout` takes it."""
        return min(self.connect_timeout_seconds, self.timeout_seconds), self.timeout_seconds


def backoff_delay(
    policy: RetryPolicy, attempt: int, rng: random.Random, retry_after: float | None = None
) -> float | None:
    """Seconds to wait before retry number `attempt` (1 for the first retry): full jitter, uniform
    in [0, min(cap, base * 2**(attempt-1))]. A 429's Retry-After is waited out first; None when it
    asks for more than the cap (the next cycle tries again rather than stall this one)."""
    bound = min(policy.backoff_cap_seconds, policy.backoff_base_seconds * 2 ** (attempt - 1))
    jitter = rng.uniform(0.0, bound)
    if retry_after is None:
        return jitter
    if retry_after > policy.backoff_cap_seconds:
        return None
    return min(retry_after + jitter, policy.backoff_cap_seconds)


def retry_after_seconds(error: BaseException) -> float | None:
    """The Retry-After of a 429 (seconds or an HTTP date), None if it has none."""
    if not isinstance(error, ApiException) or error.status != 429 or not error.headers:
        return None
    value = error.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max((when - dt.datetime.now(dt.UTC)).total_seconds(), 0.0)


def transient(error: BaseException) -> bool:
    """Worth trying again at once: throttling, a server error, or no answer at all."""
    if isinstance(error, ApiException):
        return error.status == 429 or (error.status or 0) >= 500
    return isinstance(error, urllib3.exceptions.HTTPError | OSError)


USER_AGENT = f"tidal/{__version__}"


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
    # Retries are Api's (RetryPolicy): urllib3's own would retry a timed-out read behind its back.
    configuration.retries = False
    api_client = client.ApiClient(configuration)
    # The API server's audit log and request metrics name the operator's writes by this.
    api_client.user_agent = USER_AGENT
    return api_client


class Api:
    def __init__(
        self,
        api_client: client.ApiClient,
        workers: int = 16,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.scheduling = client.SchedulingV1Api(api_client)
        self.requests: Counter[str] = Counter()
        self.policy = policy or RetryPolicy()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-api")
        self._warnings: set[str] = set()

    def _send(
        self, method: str, path: str, body: Any, content_type: str = "application/json", _request_timeout: Any = None
    ) -> None:
        """One write whose answer tidal does not read, past the generated client's per-call work.

        A generated method validates its arguments with pydantic, builds a model of the body and
        dumps it again, then deserializes the answer into models: after the pod and node watches
        left kopf, that was a fifth of the operator's CPU while a gang started (bench.operator
        with --py-spy, issue 36). Here the same ApiClient (its auth, TLS, connection pool and user
        agent) sends the dict as JSON and only the status is read; an error is the same
        ApiException the generated method raises (status, reason, body, headers for Retry-After).
        Nothing checks the body here: a quantity given as a number (`cpu: 1`, which the CRD allows
        and the generated client refused) goes as the API server takes it, and a field it does not
        know comes back as a `Warning` header, logged (`_warned`)."""
        api_client = self.core.api_client
        method, url, headers, _, _ = api_client.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(method, url, header_params=headers, body=body, _request_timeout=_request_timeout)
        data = response.read()
        warning = response.getheader("Warning")
        if warning:
            self._warned(warning, path)
        if not 200 <= response.status <= 299:
            text = data.decode("utf-8", "replace") if data else None
            raise ApiException.from_response(http_resp=response, body=text, data=None)

    def _warned(self, warning: str, path: str) -> None:
        """The API server's `Warning` header (a field it dropped, a deprecation), once per text:
        no body is checked here before it is sent (`_send`), so this is where a template's unknown
        field shows; a gang's 4,096 pods with the same warning log it once."""
        with self._lock:
            if warning in self._warnings:
                return
            self._warnings.add(warning)
        log.warning("API server warning", warning=warning[:500], path=path)

    def _count(self, verb: str) -> None:
        with self._lock:
            self.requests[verb] += 1

    def _call(self, verb: str, fn: Callable[..., T], *args: Any, retry: bool = True, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` with the request timeout, counted once per attempt; a transient
        failure is retried (RetryPolicy). Every write tidal makes is safe to repeat: a repeated
        create finds AlreadyExists (409), a repeated delete NotFound, a repeated status patch
        carries the resourceVersion it was decided on and so conflicts rather than clobbers."""
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            self._count(verb)
            try:
                return fn(*args, _request_timeout=self.policy.request_timeout, **kwargs)
            except Exception as e:
                delay = self._retry_delay(e, attempt, started) if retry else None
                if delay is None:
                    raise
                log.info("api call retried", call=verb, attempt=attempt, delay=round(delay, 3), error=_brief(e))
                self._sleep(delay)

    def _retry_delay(self, error: Exception, attempt: int, started: float) -> float | None:
        if attempt >= self.policy.attempts or not transient(error):
            return None
        delay = backoff_delay(self.policy, attempt, self._rng, retry_after_seconds(error))
        # The next attempt may itself take a whole read timeout: it starts only if that still
        # ends within the budget, so no call outlasts it by more than a connect timeout.
        elapsed = time.monotonic() - started
        if delay is None or elapsed + delay + self.policy.timeout_seconds > self.policy.budget_seconds:
            return None
        return delay

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def parallel(self, fn, items: list[Any]) -> list[Any]:
        return list(self._pool.map(fn, items))

    # -- pods and services -------------------------------------------------------------------
    def create_pod(self, body: dict[str, Any]) -> bool:
        """True if created, False if a pod of that name already exists."""
        try:
            namespace = quote(body["metadata"]["namespace"], safe="")
            self._call("create_pod", self._send, "POST", f"/api/v1/namespaces/{namespace}/pods", body)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str = "") -> None:
        """Delete the pod; with `uid`, only that pod: a 409 says the name now holds another pod,
        so the one meant is gone, as with a 404. The grace period goes in the body with the
        precondition: the API server reads a delete's options from its body when it has one and
        then ignores the query's gracePeriodSeconds (a forced delete became the pod's own 30 s)."""
        preconditions = client.V1Preconditions(uid=uid) if uid else None
        body = client.V1DeleteOptions(preconditions=preconditions, grace_period_seconds=grace_seconds)
        try:
            self._call("delete_pod", self.core.delete_namespaced_pod, name, namespace, body=body)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def remove_gate(self, namespace: str, name: str, gate: str, gates: list[str]) -> None:
        remaining = [{"name": g} for g in gates if g != gate]
        patch = [
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in gates]},
            {"op": "replace", "path": "/spec/schedulingGates", "value": remaining},
        ]
        try:
            path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
            self._call("ungate_pod", self._send, "PATCH", path, patch, "application/json-patch+json")
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        try:
            self._call(
                "annotate_pod",
                self.core.patch_namespaced_pod,
                name,
                namespace,
                {"metadata": {"annotations": annotations}},
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def label_pod(self, namespace: str, name: str, pod_labels: dict[str, str]) -> None:
        try:
            self._call(
                "label_pod", self.core.patch_namespaced_pod, name, namespace, {"metadata": {"labels": pod_labels}}
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def ensure_service(self, body: dict[str, Any]) -> None:
        try:
            self._call("create_service", self.core.create_namespaced_service, body["metadata"]["namespace"], body)
        except ApiException as e:
            if e.status != 409:
                raise

    def apply_service(self, body: dict[str, Any]) -> str:
        """Bring a Service to `body` in the fields tidal owns: "created", "updated", "unchanged"
        (no write), or "conflict" (the name is taken by a Service another owner controls)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            read = self._call("get_service", self.core.read_namespaced_service, name, namespace)
            current = self.core.api_client.sanitize_for_serialization(read)
        except ApiException as e:
            if e.status != 404:
                raise
            self._call("create_service", self.core.create_namespaced_service, namespace, body)
            return "created"
        if not controlled_by_owner(current, body):
            return "conflict"
        update = service_update(current, body)
        if update is None:
            return "unchanged"
        # A PUT carries the resourceVersion read: a concurrent change fails (409) and is retried.
        self._call("update_service", self.core.replace_namespaced_service, name, namespace, update)
        return "updated"

    # -- NVIDIA ComputeDomains (resource.nvidia.com) ------------------------------------------
    def compute_domains_installed(self) -> bool:
        """Whether the API server serves ComputeDomains (the NVIDIA DRA driver's CRD is installed).
        A discovery read: any authenticated identity may make it."""
        try:
            resources = self._call(
                "discover_compute_domains",
                self.custom.get_api_resources,
                COMPUTE_DOMAIN_GROUP,
                COMPUTE_DOMAIN_VERSION,
            )
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
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self._call(
                "create_compute_domain",
                self.custom.create_namespaced_custom_object,
                COMPUTE_DOMAIN_GROUP,
                COMPUTE_DOMAIN_VERSION,
                namespace,
                COMPUTE_DOMAIN_PLURAL,
                body,
            )
            return True
        except ApiException as e:
            if e.status != 409:
                raise
        existing = self._call(
            "get_compute_domain",
            self.custom.get_namespaced_custom_object,
            COMPUTE_DOMAIN_GROUP,
            COMPUTE_DOMAIN_VERSION,
            namespace,
            COMPUTE_DOMAIN_PLURAL,
            name,
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
        try:
            self._call(
                "delete_compute_domain",
                self.custom.delete_namespaced_custom_object,
                COMPUTE_DOMAIN_GROUP,
                COMPUTE_DOMAIN_VERSION,
                namespace,
                COMPUTE_DOMAIN_PLURAL,
                name,
            )
        except ApiException as e:
            if e.status != 404:
                raise

    # -- tidal resources --------------------------------------------------------------------
    def patch_status(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> str | None:
        """Merge-patch the status subresource. With `resource_version` the patch applies only to
        that version of the object: StatusConflict (409) if it changed since.

        Returns the object's new resourceVersion ("" if the answer lacks it), or None if the patch
        was not made (the object is gone, or an error that is logged: the next cycle decides again)."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            if namespace:
                answer = self._call(
                    "patch_status",
                    self.custom.patch_namespaced_custom_object_status,
                    API_GROUP,
                    API_VERSION,
                    namespace,
                    PLURALS[kind],
                    name,
                    body,
                )
            else:
                answer = self._call(
                    "patch_status",
                    self.custom.patch_cluster_custom_object_status,
                    API_GROUP,
                    API_VERSION,
                    PLURALS[kind],
                    name,
                    body,
                )
        except ApiException as e:
            if e.status == 409 and resource_version:
                raise StatusConflict(f"{kind} {namespace}/{name} changed since version {resource_version}") from e
            if e.status != 404:  # the next cycle retries the same write; never abort the cycle over it
                log.warning(
                    "status patch failed",
                    kind=kind,
                    namespace=namespace,
                    name=name,
                    status=e.status,
                    reason=str(e.reason),
                )
            return None
        return str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "")

    def list_keys(self, kind: str) -> set[Any]:
        """The keys the watch cache files `kind` under ("node", "pod", "supernode", "job", "pool",
        "priorityclass", "quota") of every such object the API server holds now: a paginated LIST
        of metadata only (one consistent snapshot), so that objects deleted while a watch was down
        can be told from live ones (see `WatchCache.forget`)."""
        keys: set[Any] = set()
        token: str | None = None
        while True:
            page = self._call(f"list_keys:{kind}", self._list_page(kind), limit=LIST_PAGE, _continue=token)
            body = json.loads(page.data)
            for item in body.get("items") or []:
                meta = item.get("metadata") or {}
                keys.add((meta.get("namespace"), meta.get("name")) if kind in NAMESPACED_KINDS else meta.get("name"))
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return keys

    def _list_page(self, kind: str) -> Callable[..., Any]:
        raw = {"_headers": {"Accept": METADATA_ONLY}, "_preload_content": False}
        if kind in CUSTOM_PLURALS:
            plural = CUSTOM_PLURALS[kind]
            return lambda **kw: self.custom.list_cluster_custom_object(API_GROUP, API_VERSION, plural, **kw, **raw)
        lists = {
            "node": self.core.list_node,
            "pod": self.core.list_pod_for_all_namespaces,
            "quota": self.core.list_resource_quota_for_all_namespaces,
            "priorityclass": self.scheduling.list_priority_class,
        }
        return lambda **kw: lists[kind](**kw, **raw)

    def read_status(self, kind: str, namespace: str | None, name: str) -> tuple[dict[str, Any], str, str] | None:
        """(status, resourceVersion, uid) as the API server holds them now (never from a cache);
        None if the object is gone."""
        try:
            if namespace:
                body = self._call(
                    "get_status",
                    self.custom.get_namespaced_custom_object_status,
                    API_GROUP,
                    API_VERSION,
                    namespace,
                    PLURALS[kind],
                    name,
                )
            else:
                body = self._call(
                    "get_status",
                    self.custom.get_cluster_custom_object_status,
                    API_GROUP,
                    API_VERSION,
                    PLURALS[kind],
                    name,
                )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        meta = body.get("metadata") or {}
        return dict(body.get("status") or {}), str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")

    def annotate(self, kind: str, namespace: str | None, name: str, annotations: dict[str, str | None]) -> None:
        body = {"metadata": {"annotations": annotations}}
        try:
            if namespace:
                self._call(
                    "annotate",
                    self.custom.patch_namespaced_custom_object,
                    API_GROUP,
                    API_VERSION,
                    namespace,
                    PLURALS[kind],
                    name,
                    body,
                )
            else:
                self._call(
                    "annotate",
                    self.custom.patch_cluster_custom_object,
                    API_GROUP,
                    API_VERSION,
                    PLURALS[kind],
                    name,
                    body,
                )
        except ApiException as e:
            if e.status != 404:
                raise

    # -- the operator's own state (k8s/disruption_ledger.py) ----------------------------------
    # Not retried: the caller tries again in a later cycle, and must not stall this one.
    def read_config_map(self, namespace: str, name: str) -> tuple[dict[str, str] | None, str | None]:
        """The ConfigMap's data and resourceVersion, or (None, None) when there is none of that name."""
        try:
            read = self._call("get_configmap", self.core.read_namespaced_config_map, name, namespace, retry=False)
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise
        return dict(read.data or {}), read.metadata.resource_version

    def save_config_map(self, namespace: str, name: str, data: dict[str, str], resource_version: str | None) -> None:
        """Set the ConfigMap's data keys, only if it is still at `resource_version` (None: make it,
        only if there is none). A change since the read fails with a 409 (ApiException)."""
        if resource_version is not None:
            body = {"metadata": {"resourceVersion": resource_version}, "data": data}
            self._call("patch_configmap", self.core.patch_namespaced_config_map, name, namespace, body, retry=False)
            return
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "tidal"}},
            "data": data,
        }
        self._call("create_configmap", self.core.create_namespaced_config_map, namespace, body, retry=False)

    def create_supernode(self, name: str, spec: dict[str, Any]) -> bool:
        body = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "Supernode",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "tidal"}},
            "spec": spec,
        }
        try:
            self._call(
                "create_supernode", self.custom.create_cluster_custom_object, API_GROUP, API_VERSION, "supernodes", body
            )
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def event(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        uid: str,
        reason: str,
        message: str,
        warning: bool = False,
        api_version: str = f"{API_GROUP}/{API_VERSION}",
    ) -> None:
        ts = dt.datetime.now(dt.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace or "default"),
            involved_object=client.V1ObjectReference(
                api_version=api_version, kind=kind, name=name, namespace=namespace, uid=uid
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
        # Events are best effort: never retried (a throttled server gets no extra load for them),
        # never a reason to fail a reconcile.
        with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError, OSError):
            self._call("create_event", self.core.create_namespaced_event, namespace or "default", body, retry=False)


def _brief(error: BaseException) -> str:
    """An error for the log: the status of an ApiException, not its whole response body."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    return f"{type(error).__name__}: {str(error)[:200]}"
