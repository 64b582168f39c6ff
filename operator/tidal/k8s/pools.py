"""InferencePool lifecycle: each replica is a small gang (tp*ep GPUs in one supernode).

Scale-down removes whole replicas, least disruptive first (not-ready replicas, then the newest).
Scale-up is decided by the rebalancer (rebalancing.py), which may take GPUs from training.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from tidal.k8s import labels
from tidal.k8s.cycle import Cycle
from tidal.k8s.manifests import compute_domain, owner_reference, pinned_pod
from tidal.k8s.pods_ready import running, stuck_replica, timeout_seconds
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.status import condition, set_condition
from tidal.k8s.training import hold_whole, prune_domains
from tidal.model import InferencePoolSpec, describe_errors
from tidal.placement.compute_domains import DomainPlan, add_channel_claim, replica_domain

LOAD_ANNOTATION = "tidal.dev/load-rps"
PROMETHEUS_TIMEOUT_SECONDS = 2.0
PROMETHEUS_MAX_BYTES = 1 << 20
"""A larger answer is refused unread: one instant sample is a few hundred bytes."""

LOAD_POLL_SECONDS = 10.0
"""How often the poller asks each pool's Prometheus load source."""
LOAD_STALE_SECONDS = 60.0
"""A sample older than this is no sample: the pool's load is unknown, as when a query fails."""

QueryFn = Callable[[str, str], float]
log = structlog.get_logger("tidal")


def replica_pod_name(pool: str, replica: int, index: int) -> str:
    return f"{pool}-{replica}-{index}"


def pool_allocations(view: ResourceView, status: dict[str, Any]) -> list[tuple[str, int]]:
    gpp = view.spec.get("gpusPerPod", 1)
    return [(node, gpp) for replica in status.get("placement") or [] for node in replica["nodes"]]


def spec_problem(view: ResourceView) -> str | None:
    try:
        InferencePoolSpec.model_validate(view.spec)
    except ValidationError as e:
        return "; ".join(describe_errors(e))
    if len(view.name) > 45:
        return "metadata.name: must be at most 45 characters (replica pod names double as DNS labels)"
    return None


def read_load(
    view: ResourceView, sources: Mapping[str, str] | None = None, query_prometheus: QueryFn | None = None
) -> tuple[float | None, str | None]:
    """(requests per second, error) from the pool's load source.

    `sources`: Prometheus load source name -> base URL, as configured by the cluster admin. The
    error is written into the pool's status, which its tenant reads: it never carries what the
    remote answered (the detail goes to the operator's log), so a source cannot be used to read
    anything back through tidal."""
    load = view.spec.get("load")
    if not load:
        return None, None
    if load.get("source", "Annotation") == "Annotation":
        raw = view.annotations.get(LOAD_ANNOTATION)
        if raw is None:
            return None, None
        try:
            rate = float(raw)
        except ValueError:
            return None, f"annotation {LOAD_ANNOTATION}={raw!r} is not a number"
        if not math.isfinite(rate):  # NaN or inf: no replica count follows from it
            return None, f"annotation {LOAD_ANNOTATION}={raw!r} is not a finite number"
        return max(rate, 0.0), None
    prometheus = load.get("prometheus") or {}
    server = prometheus.get("server")
    url = (sources or {}).get(server or "")
    if url is None:
        configured = ", ".join(sorted(sources or {})) or "none"
        return None, f"load source {server!r} is not configured in the operator (configured: {configured})"
    query = query_prometheus or prometheus_instant
    try:
        return query(url, prometheus["query"]), None
    except Exception as e:  # a broken signal must not stop the cycle; the schedule floor still holds
        log.warning("load query failed", pool=view.ref, server=server, error=str(e))
        return None, f"query to Prometheus load source {server!r} failed ({type(e).__name__}); see the operator log"


def pool_load(
    view: ResourceView, sources: Mapping[str, str] | None, loads: LoadPoller | None
) -> tuple[float | None, str | None]:
    """`read_load` as the cycle may call it: a Prometheus query is never made here, only its
    last sample read from `loads` (without one, the load is unknown)."""
    load = view.spec.get("load") or {}
    server = (load.get("prometheus") or {}).get("server") or ""
    if load.get("source", "Annotation") != "Prometheus" or server not in (sources or {}):
        return read_load(view, sources)  # the annotation, or the not-configured error: no network
    if loads is None:
        return None, f"Prometheus load source {server!r} is not polled"
    return loads.read(view)


@dataclass(frozen=True)
class LoadSample:
    query: tuple[str, str]
    """(source name, query) the sample answers: a pool whose spec names another waits for its own."""
    rate: float | None
    error: str | None
    at: float
    """time.monotonic() when the answer came."""


MAX_SOURCE_THREADS = 8
"""Prometheus sources asked at the same time by one poll round."""


class LoadPoller:
    """Pools' Prometheus loads, queried by a thread of its own, never by the controller cycle: a
    source that answers slowly or never would otherwise stall all scheduling. The cycle reads the
    last sample (`read`); one older than `stale_seconds` counts as no load signal at all. The
    thread starts at the first read, so an operator whose pools name no source runs none."""

    def __init__(
        self,
        sources: Mapping[str, str],
        query: QueryFn | None = None,
        interval_seconds: float = LOAD_POLL_SECONDS,
        stale_seconds: float = LOAD_STALE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.sources = dict(sources)
        self.query = query or prometheus_instant
        self.interval_seconds = interval_seconds
        self.stale_seconds = stale_seconds
        self._monotonic = monotonic
        self._wanted: dict[str, ResourceView] = {}
        self._samples: dict[str, LoadSample] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self, view: ResourceView) -> tuple[float | None, str | None]:
        """(rate, error) from the pool's last sample; never waits for the network."""
        wanted = _load_query(view)
        with self._lock:
            known = self._wanted.get(view.uid)
            self._wanted[view.uid] = view
            sample = self._samples.get(view.uid)
        if known is None or _load_query(known) != wanted:
            self._wake.set()  # a new pool or query: asked at once, not at the next round
        self._ensure_started()
        server = wanted[0]
        if sample is None or sample.query != wanted:
            return None, f"no sample from Prometheus load source {server!r} yet"
        age = self._monotonic() - sample.at
        if age > self.stale_seconds:
            return None, f"no sample from Prometheus load source {server!r} for {age:.0f}s; see the operator log"
        return sample.rate, sample.error

    def forget(self, live_uids: set[str]) -> None:
        with self._lock:
            for store in (self._wanted, self._samples):
                for uid in [u for u in store if u not in live_uids]:
                    del store[uid]

    def poll_once(self) -> None:
        """Ask every wanted pool's source once (the thread's round; tests call it directly).

        Each source is asked from a thread of its own, and a (source, query) shared by several
        pools once: a source that hangs delays only its own pools' samples, never those of a
        healthy source (which would go stale behind it)."""
        with self._lock:
            views = list(self._wanted.values())
        by_source: dict[str, list[ResourceView]] = {}
        for view in views:
            by_source.setdefault(_load_query(view)[0], []).append(view)
        if len(by_source) <= 1:
            for group in by_source.values():
                self._poll_source(group)
            return
        with ThreadPoolExecutor(max_workers=min(len(by_source), MAX_SOURCE_THREADS)) as pool:
            list(pool.map(self._poll_source, by_source.values()))

    def _poll_source(self, views: list[ResourceView]) -> None:
        answers: dict[tuple[str, str], tuple[float | None, str | None]] = {}
        for view in views:
            if self._stop.is_set():
                return
            key = _load_query(view)
            if key not in answers:
                answers[key] = read_load(view, self.sources, self.query)
            rate, error = answers[key]
            sample = LoadSample(key, rate, error, self._monotonic())
            with self._lock:
                if view.uid in self._wanted:
                    self._samples[view.uid] = sample

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _ensure_started(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tidal-load-poller", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.poll_once()
            except Exception:  # the poller must outlive any one bad answer
                log.exception("load poll failed")
            self._wake.wait(self.interval_seconds)


def _load_query(view: ResourceView) -> tuple[str, str]:
    prometheus = (view.spec.get("load") or {}).get("prometheus") or {}
    return prometheus.get("server") or "", prometheus.get("query") or ""


def prometheus_instant(url: str, query: str) -> float:
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(full, timeout=PROMETHEUS_TIMEOUT_SECONDS) as response:
        raw = response.read(PROMETHEUS_MAX_BYTES + 1)
    if len(raw) > PROMETHEUS_MAX_BYTES:
        raise ValueError(f"the answer is larger than {PROMETHEUS_MAX_BYTES} bytes")
    body = json.loads(raw)
    results = body["data"]["result"]
    if not results:
        raise ValueError("the query returned no sample")
    rate = float(results[0]["value"][1])
    if not math.isfinite(rate):  # 0/0 in a ratio query is NaN; Prometheus sends it as "NaN"
        raise ValueError(f"the query returned {rate}, not a finite number")
    return max(rate, 0.0)  # a deriv() or a difference can dip below 0: no load, as for the annotation


def replica_pods(view: ResourceView, replica: dict[str, Any], claim: str | None = None) -> dict[str, dict[str, Any]]:
    """The replica's pods; `claim`: the ResourceClaimTemplate of its ComputeDomain, if it has one."""
    spec = view.spec
    gpp = spec["gpusPerPod"]
    world = spec.get("tp", 1) * spec.get("ep", 1)
    owner = owner_reference("InferencePool", view.name, view.uid)
    pods = {}
    for i, node in enumerate(replica["nodes"]):
        name = replica_pod_name(view.name, replica["group"], i)
        pods[name] = pinned_pod(
            spec.get("template") or {},
            name=name,
            namespace=view.namespace or "default",
            node=node,
            accelerator=spec.get("accelerator", "nvidia.com/gpu"),
            gpus=gpp,
            pod_labels={
                labels.POOL: view.name,
                labels.REPLICA: str(replica["group"]),
                labels.HBD_GROUP: str(replica["group"]),
                # Pod 0 serves the replica: the pool's Service, its scale selector and a Gateway
                # API Inference Extension pool select leaders only.
                labels.ROLE: role_of(i),
            },
            owner=owner,
            env={
                "TIDAL_POOL": view.name,
                "TIDAL_REPLICA": str(replica["group"]),
                "RANK": str(i * gpp),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(gpp),
            },
            priority_class_name=spec.get("priorityClassName"),
        )
        if claim:
            add_channel_claim(pods[name]["spec"], claim)  # the first container holds the GPUs
    return pods


def pool_domain_held_nodes(view: ResourceView, status: dict[str, Any]) -> set[str]:
    """Nodes the pool holds whole for its recorded replica ComputeDomains (for the bookings)."""
    recorded = set(status.get("computeDomains") or [])
    return {
        node
        for r in status.get("placement") or []
        if (d := replica_domain(view.name, r["group"], r["supernode"], r["nodes"], True)) and d.name in recorded
        for node in r["nodes"]
    }


def _wanted_domains(cyc: Cycle, view: ResourceView, replicas: list[dict[str, Any]]) -> dict[int, DomainPlan]:
    """Replica id -> its ComputeDomain, for replicas spanning several nodes of a supernode that
    wants domains; none without the CRD (pods then run unclaimed, as a TrainingJob's do)."""
    wanted = {}
    for r in replicas:
        on = r["supernode"] in cyc.domain_supernodes
        domain = replica_domain(view.name, r["group"], r["supernode"], r["nodes"], on)
        if domain is not None:
            wanted[r["group"]] = domain
    if wanted and not cyc.domains_installed():
        return {}
    return wanted


def _sync_domains(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], replicas: list[dict[str, Any]], pods: dict[str, PodView]
) -> dict[int, DomainPlan]:
    """The kept replicas' ComputeDomains in use (status updated in place): a replica's domain is in
    use when a pod of it claims it or is about to be made (pods made before it was wanted keep
    running unclaimed until remade); a removed replica's domain is deleted, kept in
    status.staleComputeDomains until the delete is seen to succeed, as a TrainingJob's."""
    wanted = _wanted_domains(cyc, view, replicas)
    by_id = {r["group"]: r for r in replicas}

    def in_use(replica: int, domain: DomainPlan) -> bool:
        names = [replica_pod_name(view.name, replica, i) for i in range(len(by_id[replica]["nodes"]))]
        return any(pods.get(n) is None or pods[n].domain_claim == domain.template for n in names)

    live = {g: d for g, d in wanted.items() if in_use(g, d)}
    keep = {d.name for d in live.values()}
    stale = set(status.pop("staleComputeDomains", None) or []) | set(status.get("computeDomains") or [])
    status.update(prune_domains(cyc, view, {"staleComputeDomains": sorted(stale - keep)}))
    if keep:
        status["computeDomains"] = sorted(keep)
    else:
        status.pop("computeDomains", None)
    hold_whole(cyc, {node for g in live for node in by_id[g]["nodes"]})
    return live


def reconcile_pool(cyc: Cycle, view: ResourceView, status: dict[str, Any], desired: int) -> dict[str, Any]:
    """Keep the placed replicas' pods, drop broken replicas, scale down to `desired`."""
    status = dict(status)
    pods = {p.name: p for p in cyc.state.pods_of("InferencePool", view.namespace, view.name) if p.owner_uid == view.uid}
    replicas = sorted(status.get("placement") or [], key=lambda r: r["group"])
    gpp = view.spec["gpusPerPod"]
    expected_by_replica = {
        r["group"]: {replica_pod_name(view.name, r["group"], i): node for i, node in enumerate(r["nodes"])}
        for r in replicas
    }

    def ready(r: dict[str, Any]) -> bool:
        expected = expected_by_replica[r["group"]]
        return all(n in pods and pods[n].phase == "Running" and pods[n].node == node for n, node in expected.items())

    def broken(r: dict[str, Any]) -> bool:
        for i, node in enumerate(r["nodes"]):
            nv = cyc.state.nodes.get(node)
            pod = pods.get(replica_pod_name(view.name, r["group"], i))
            if nv is None or not nv.ready:
                return True
            # A deleted pod (kubectl, a drain) is Failed while it terminates once its container
            # exits on SIGTERM (restartPolicy Never): it is going, not broken; it is made again
            # once gone, as any deleted pod of a replica is.
            if pod is not None and pod.phase == "Failed" and not pod.terminating and pod.uid not in cyc.deleted_uids:
                return True
        return False

    keep = [r for r in replicas if not broken(r)]
    if len(keep) < len(replicas):
        cyc.count("restarts", len(replicas) - len(keep))
        lost = sorted(r["group"] for r in replicas if r not in keep)
        cyc.event(view, "ReplicasRestarting", f"replica(s) {lost} on a lost node or with a failed pod: placed again")
    keep = _admission_timeout(cyc, view, status, keep, pods, ready)
    if len(keep) > desired:
        # Least disruptive first: replicas not serving yet, then the newest.
        order = sorted(keep, key=lambda r: (ready(r), -r["group"]))
        drop = order[: len(keep) - desired]
        keep = [r for r in keep if r not in drop]
        cyc.count("moves:to-training:scale-down", len(drop))
        status["scaledAt"] = cyc.stamp
        cyc.event(view, "ScaledDown", f"{len(drop)} replica(s) removed, {desired} wanted: {status.get('reason', '')}")
    kept_ids = {r["group"] for r in keep}
    for r in replicas:
        if r["group"] not in kept_ids:
            for node in r["nodes"]:
                cyc.snapshot.release(node, gpp)

    expected: dict[str, str] = {}
    for r in keep:
        expected.update(expected_by_replica[r["group"]])
    domains = _sync_domains(cyc, view, status, keep, pods)
    _sync_pods(cyc, view, keep, pods, expected, domains)
    _label_roles(cyc, view, keep, pods)
    status["placement"] = keep
    status["placedReplicas"] = len(keep)
    status["readyReplicas"] = sum(1 for r in keep if ready(r))
    return status


def _admission_timeout(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    replicas: list[dict[str, Any]],
    pods: dict[str, PodView],
    ready: Callable[[dict[str, Any]], bool],
) -> list[dict[str, Any]]:
    """The replicas kept: one whose pods are not all bound and Running an admission timeout after
    it was placed is given back (the pool's growth places it again, off the nodes its pods waited
    on), unless its pods are bound and still starting; condition PodsReady says which and why."""
    kept: list[dict[str, Any]] = []
    dropped: list[str] = []
    said: list[str] = []
    refused: set[str] = set()
    for r in replicas:
        if ready(r):
            kept.append(r if r.get("servedAt") else {**r, "servedAt": cyc.stamp})
            continue
        names = [replica_pod_name(view.name, r["group"], i) for i in range(len(r["nodes"]))]
        if r.get("servedAt") and any(n not in pods or pods[n].terminating for n in names):
            # A pod of a replica that served was deleted (kubectl, a drain, the descheduler) and is
            # made again once it is gone: the clock starts again with it, once; a pod never made
            # at all (refused by a quota or a webhook) times out like any other.
            kept.append({**{k: v for k, v in r.items() if k != "servedAt"}, "placedAt": cyc.stamp})
            continue
        reasons, movable = stuck_replica(cyc, view, r, pods, names, r.get("placedAt") or status.get("scaledAt"))
        if not reasons:
            kept.append(r)
            continue
        said += reasons
        if movable:
            dropped.append(f"replica {r['group']}")
            refused |= {node for name, node in zip(names, r["nodes"], strict=True) if not running(pods.get(name))}
        else:  # bound and starting: named, looked at again one timeout later
            kept.append({**r, "placedAt": cyc.stamp})
    conditions = status.get("conditions", [])
    if said:
        message = f"not bound and Running {timeout_seconds(cyc)}s after placement: {'; '.join(said)}"
        status["conditions"] = set_condition(conditions, "PodsReady", False, "AdmissionTimeout", message, cyc.stamp)
        if dropped:
            status["refusedNodes"] = sorted(refused)[:256]
            cyc.count("admission_timeouts", len(dropped))
            cyc.event(view, "AdmissionTimeout", f"placing {', '.join(dropped)} again: {message}", warning=True)
    elif (
        len(kept) == len(replicas) >= status.get("desiredReplicas", 0)  # refused nodes matter until the pool is whole
        and all(ready(r) for r in kept)
        and condition(conditions, "PodsReady")
    ):
        status["conditions"] = set_condition(conditions, "PodsReady", True, "Running", "every replica runs", cyc.stamp)
        status.pop("refusedNodes", None)
    return kept


def _sync_pods(
    cyc: Cycle,
    view: ResourceView,
    replicas: list[dict[str, Any]],
    pods: dict[str, PodView],
    expected: dict[str, str],
    domains: dict[int, DomainPlan],
) -> None:
    cyc.delete_stale_pods(pods, expected)
    namespace = view.namespace or "default"
    for r in replicas:  # each replica is its own gang; manifests only for missing pods
        names = [replica_pod_name(view.name, r["group"], i) for i in range(len(r["nodes"]))]
        domain = domains.get(r["group"])
        claim = domain.template if domain else None
        missing = cyc.sync_gang(
            namespace,
            pods,
            {n: expected[n] for n in names},
            lambda missing, r=r, claim=claim: _pick(replica_pods(view, r, claim), missing),
        )
        if missing and domain is not None:  # idempotent (409); made at the flush before the pods
            cyc.ensure_compute_domain(compute_domain(namespace, view.uid, view.name, domain, kind="InferencePool"))


def role_of(index: int) -> str:
    return labels.LEADER if index == 0 else labels.WORKER


def _label_roles(cyc: Cycle, view: ResourceView, replicas: list[dict[str, Any]], pods: dict[str, PodView]) -> None:
    """Give the role label to pods made before it existed (an upgraded operator): without it a
    running replica's leader would get no traffic from the pool's Service and no HPA would see it."""
    for r in replicas:
        for i in range(len(r["nodes"])):
            pod = pods.get(replica_pod_name(view.name, r["group"], i))
            if pod is not None and not pod.terminating and pod.labels.get(labels.ROLE) != role_of(i):
                cyc.label_pod(pod.namespace, pod.name, {labels.ROLE: role_of(i)})


def _pick(made: dict[str, dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    return [made[n] for n in names]


def add_replicas(cyc: Cycle, view: ResourceView, status: dict[str, Any], groups: list[Any]) -> dict[str, Any]:
    """Record newly placed replicas (GroupAssignments) with fresh replica ids, and create their pods."""
    placement = list(status.get("placement") or [])
    used = {r["group"] for r in placement}
    domains = set(status.get("computeDomains") or [])
    next_id = 0
    for g in groups:
        while next_id in used:
            next_id += 1
        replica = {"group": next_id, "supernode": g.supernode, "nodes": list(g.nodes), "placedAt": cyc.stamp}
        placement.append(replica)
        domain = _wanted_domains(cyc, view, [replica]).get(next_id)
        if domain is not None:
            namespace = view.namespace or "default"
            cyc.ensure_compute_domain(compute_domain(namespace, view.uid, view.name, domain, kind="InferencePool"))
            hold_whole(cyc, set(replica["nodes"]))
            domains.add(domain.name)
        cyc.pod_creates.extend(replica_pods(view, replica, domain.template if domain else None).values())
        used.add(next_id)
    if domains:
        status = {**status, "computeDomains": sorted(domains)}
    return {
        **status,
        "placement": sorted(placement, key=lambda r: r["group"]),
        "placedReplicas": len(placement),
        "scaledAt": cyc.stamp,
    }


def pool_conditions(status: dict[str, Any], stamp: str) -> list[dict[str, Any]]:
    desired, placed = status.get("desiredReplicas", 0), status.get("placedReplicas", 0)
    ok = placed >= desired
    return set_condition(
        status.get("conditions", []),
        "Scaled",
        ok,
        "AtDesired" if ok else "BelowDesired",
        f"{placed} of {desired} replica(s) placed",
        stamp,
    )
