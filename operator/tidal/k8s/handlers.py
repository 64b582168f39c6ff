"""kopf wiring: indices are the informer caches; timers drive the controller cycle.

Every handler here is paused by kopf peering when a higher-priority tidal replica is active, so
two replicas never both act. Timers on Supernodes and TrainingJobs call the same rate-limited
cycle; the cycle looks at the whole cluster, so it does not matter which object's timer fired.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from tidal import API_GROUP, API_VERSION
from tidal.k8s.controller import Controller
from tidal.k8s.state import ClusterState, node_view, pod_view, resource_view
from tidal.k8s.supernodes import discover

TICK_SECONDS = 1.0


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


@kopf.index("", "v1", "nodes")
def tidal_nodes(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    return {name: node_view(dict(body))}


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
def tidal_pods(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): pod_view(dict(body))}


@kopf.index(API_GROUP, API_VERSION, "supernodes")
def tidal_supernodes(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: resource_view(dict(body))}


@kopf.index(API_GROUP, API_VERSION, "trainingjobs")
def tidal_jobs(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): resource_view(dict(body))}


@kopf.index(API_GROUP, API_VERSION, "inferencepools")
def tidal_pools(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): resource_view(dict(body))}


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
    if not controller.due():
        return
    indices = {k: v for k, v in kwargs.items() if k.startswith("tidal_")}
    await asyncio.to_thread(controller.cycle, state_from(indices))


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
