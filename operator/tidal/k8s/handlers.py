"""kopf wiring: watch events feed the controller's incremental cache; timers drive the cycle.

The kopf indices stay (kopf starts no timer before every index has its first listing, so the first
cycle never sees half a cluster); each index function also feeds its view to the controller's
`WatchCache` (an append), and deletions arrive through `on.event`. The cycle runs in a worker
thread and applies the queued events itself, so the event loop (watches, probes, peering) is
never blocked by planning. Every few minutes the indices are copied once and the cache is brought
to them by difference, in case an event was lost (say, across a peering pause).

Every handler here is paused by kopf peering when a higher-priority tidal replica is active, so
two replicas never both act. Timers on Supernodes and TrainingJobs call the same rate-limited
cycle; the cycle looks at the whole cluster, so it does not matter which object's timer fired.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from tidal import API_GROUP, API_VERSION
from tidal.k8s.controller import Controller
from tidal.k8s.state import ClusterState, node_view, pod_view, resource_view
from tidal.k8s.supernodes import discover

TICK_SECONDS = 1.0
RESYNC_SECONDS = 300.0


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Handler progress in annotations under our own prefix; statuses stay ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # A replica that died without saying goodbye blocks its peers until its record expires:
    # keep that short so a crashed operator is replaced within seconds, not a minute.
    settings.peering.lifetime = 15


def _feed(memo: kopf.Memo, kind: str, key: Any, view: Any) -> None:
    controller = getattr(memo, "controller", None)
    if controller is not None:
        controller.cache.feed(kind, key, view)


def _deleted(event: dict[str, Any], **_: Any) -> bool:
    return event.get("type") == "DELETED"


@kopf.index("", "v1", "nodes")
def tidal_nodes(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    view = node_view(dict(body))
    _feed(memo, "node", name, view)
    return {name: view}


def _interesting_pod(body: kopf.Body, **_: Any) -> bool:
    # Only pods that hold accelerators or belong to tidal: the rest never matter for placement.
    labels = body.get("metadata", {}).get("labels") or {}
    if any(k.startswith(f"{API_GROUP}/") for k in labels):
        return True
    for c in body.get("spec", {}).get("containers") or []:
        res = c.get("resources") or {}
        if any("/" in k for k in {**(res.get("limits") or {}), **(res.get("requests") or {})}):
            return True
    return False


@kopf.index("", "v1", "pods", when=_interesting_pod)
def tidal_pods(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    view = pod_view(dict(body))
    _feed(memo, "pod", (namespace, name), view)
    return {(namespace, name): view}


@kopf.index(API_GROUP, API_VERSION, "supernodes")
def tidal_supernodes(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    view = resource_view(dict(body))
    _feed(memo, "supernode", name, view)
    return {name: view}


@kopf.index(API_GROUP, API_VERSION, "trainingjobs")
def tidal_jobs(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    view = resource_view(dict(body))
    _feed(memo, "job", (namespace, name), view)
    return {(namespace, name): view}


@kopf.index(API_GROUP, API_VERSION, "inferencepools")
def tidal_pools(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    view = resource_view(dict(body))
    _feed(memo, "pool", (namespace, name), view)
    return {(namespace, name): view}


@kopf.on.event("", "v1", "nodes", when=_deleted)
def node_gone(name: str, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, "node", name, None)


@kopf.on.event("", "v1", "pods", when=_deleted)
def pod_gone(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, "pod", (namespace, name), None)


@kopf.on.event(API_GROUP, API_VERSION, "supernodes", when=_deleted)
def supernode_gone(name: str, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, "supernode", name, None)


@kopf.on.event(API_GROUP, API_VERSION, "trainingjobs", when=_deleted)
def job_gone(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, "job", (namespace, name), None)


@kopf.on.event(API_GROUP, API_VERSION, "inferencepools", when=_deleted)
def pool_gone(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, "pool", (namespace, name), None)


def _single(index: kopf.Index) -> dict[Any, Any]:
    return {key: value for key, store in index.items() for value in store}


def state_from(indices: dict[str, kopf.Index]) -> ClusterState:
    return ClusterState(
        nodes=_single(indices["tidal_nodes"]),
        pods=_single(indices["tidal_pods"]),
        supernodes=_single(indices["tidal_supernodes"]),
        jobs=_single(indices["tidal_jobs"]),
        pools=_single(indices["tidal_pools"]),
    )


async def _tick(memo: kopf.Memo, kwargs: dict[str, Any]) -> None:
    controller: Controller = memo.controller
    controller.last_tick = time.monotonic()
    if not controller.due():
        return
    state = None
    if time.monotonic() - getattr(memo, "resynced", -RESYNC_SECONDS) >= RESYNC_SECONDS:
        # A full copy of the indices, rarely: the cache is brought to it by difference. Events
        # queued so far are older than this copy, so they are dropped here, on the loop that feeds them.
        state = state_from({k: v for k, v in kwargs.items() if k.startswith("tidal_")})
        controller.cache.discard_events()
        memo.resynced = time.monotonic()
    # Planning is CPU-bound Python: a worker thread keeps kopf's watches, probes and peering going.
    await asyncio.to_thread(controller.cycle, state)


@kopf.on.probe(id="cycle")
def cycle_age(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Unhealthy when timers keep firing but no cycle has finished for `max_cycle_age` seconds."""
    controller: Controller = memo.controller
    age = controller.seconds_since_cycle()
    stuck = controller.stuck()
    if stuck:
        raise kopf.PermanentError(f"no controller cycle finished for {age:.0f}s")
    return {"seconds_since_cycle": round(age, 1), "cycles": controller.cycles}


# The same tick from every kind that may need the cycle: any of them existing keeps it running.
@kopf.timer(API_GROUP, API_VERSION, "trainingjobs", interval=TICK_SECONDS)
async def tick_jobs(memo: kopf.Memo, **kwargs: Any) -> None:
    await _tick(memo, kwargs)


@kopf.timer(API_GROUP, API_VERSION, "inferencepools", interval=TICK_SECONDS)
async def tick_pools(memo: kopf.Memo, **kwargs: Any) -> None:
    await _tick(memo, kwargs)


@kopf.timer(API_GROUP, API_VERSION, "supernodes", interval=TICK_SECONDS)
async def tick_supernodes(memo: kopf.Memo, **kwargs: Any) -> None:
    await _tick(memo, kwargs)


@kopf.on.event("", "v1", "nodes")
async def discover_supernode(memo: kopf.Memo, body: kopf.Body, tidal_supernodes: kopf.Index, **_: Any) -> None:
    label = memo.discover_label
    if not label:
        return
    node = node_view(dict(body))
    created = await asyncio.to_thread(
        discover, memo.controller.api, label, node, set(tidal_supernodes), memo.accelerators
    )
    if created:
        kopf.info(dict(body), reason="SupernodeDiscovered", message=f"created Supernode {created} from {label}")
