"""kopf wiring: watch events feed the controller's incremental cache; timers drive the cycle.

Pods and nodes are not kopf's: at 5,004 nodes its per-event machinery was most of the operator's
CPU while a 4,096-pod gang started, and of its warm-up, so the informers (k8s/informer.py) list and
watch them in threads of their own, and no tick runs a cycle before both first listings. Supernode
discovery rides on the node informer (`supernodes.Discovery`). Everything else stays kopf's.

The kopf indices stay: kopf starts no timer before every index has its first listing, so the first
cycle starts from a full copy of them and never sees half a cluster; every `resync_seconds` the
cache is brought to a fresh copy by difference (pods and nodes copied from the informers' tables), in
case an event was lost. A copy cannot repair one kind of loss: kopf keeps in its indices an object
deleted while its watch was down (after a 410 Gone or a peering pause it lists again, and removes
nothing the list lacks); `audit_indices` finds those with a LIST of its own. Watch events reach
the cache through `on.event` handlers (`feed_*`), never from the index functions: kopf stores an
index function's result only after the function returns (it runs in a thread), so an event fed
from there could be queued before a copy of the indices that lacks it, and be dropped with
everything the copy supersedes. A handler runs after kopf stored the event in the index, on the
event loop, where the copies are made too: an event queued before a copy is in it. The index
function leaves its view in the object's memo, so the handler feeds the very object the index
holds.

The copy is queued like an event (`WatchCache.resync`) and applied by whichever cycle drains it, in
the cycle's worker thread; the event loop (watches, probes, peering) never waits for planning.

Every handler here is paused by kopf peering when a higher-priority tidal replica is active, so
two replicas never both act (the informers keep watching in a standby, and Supernode discovery,
an idempotent create, runs there too: k8s/supernodes.py). Timers on Supernodes and TrainingJobs
call the same rate-limited cycle; the cycle looks at the whole cluster, so it does not matter which
object's timer fired.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf
import structlog

from tidal import API_GROUP, API_VERSION
from tidal.k8s import kopf_startup
from tidal.k8s.controller import Controller
from tidal.k8s.deletions import FINALIZER
from tidal.k8s.informer import Informers
from tidal.k8s.priority import priority_class_view
from tidal.k8s.quota import quota_view
from tidal.k8s.state import ClusterState, resource_view
from tidal.k8s.supernodes import Discovery
from tidal.k8s.watch import TABLES

log = structlog.get_logger("tidal")

TICK_SECONDS = 1.0

# Before kopf starts any watcher: its startup gate (every index filled before any handler) is
# O(objects^2) as shipped; see k8s/kopf_startup.py.
kopf_startup.install()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Handler progress in annotations under our own prefix; statuses stay ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    # A deleted object whose timer is mid-tick keeps kopf's finalizer until kopf looks again, by
    # default 60 s later: look every few seconds instead (see k8s/deletions.py for the rest).
    settings.background.cancellation_polling = 5
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # A replica that died without saying goodbye blocks its peers until its record expires:
    # keep that short so a crashed operator is replaced within seconds, not a minute.
    settings.peering.lifetime = 15
    quiet = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietFeeds) for f in quiet.filters):
        quiet.addFilter(_QuietFeeds())


@kopf.on.cleanup()
def flush_cycle_summary(memo: kopf.Memo, **_: Any) -> None:
    """At shutdown (a rolling update, SIGTERM): the cycles summed since the last summary line."""
    memo.controller.cycle_log.flush()


_VIEW = "tidal_view"
"""Memo key: the view an index function made for the event being processed (kopf processes one
object's events one at a time, index functions first, so the feed handler finds it there)."""


class _QuietFeeds(logging.Filter):
    """kopf logs every handler's, indexer's and timer's success at INFO: each watch event and each
    timer tick (~15,000 lines in the demo's first 15 minutes, burying the decisions). They go at
    DEBUG; failures and everything else keep their level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not record.getMessage().endswith(" succeeded."):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def _indexed(memo: kopf.Memo, view: Any) -> Any:
    memo[_VIEW] = view
    return view


def _feed(memo: kopf.Memo, event: dict[str, Any], kind: str, key: Any, make: Any, body: kopf.Body) -> None:
    """Queue this event for the cache: the indexed view, or None when the object was deleted."""
    view = memo.pop(_VIEW, None)
    if event.get("type") is None and memo.controller.last_tick:
        # Seen by a listing after the first tick: kopf listed this kind again (a 410 Gone, a
        # peering resume), and may have kept objects the new list lacks (see audit_indices).
        memo.controller.relisted.add(kind)
    if event.get("type") == "DELETED":
        view = None
    elif view is None:  # the index function failed (kopf logged it): the cache still learns the change
        view = make(dict(body))
    memo.controller.cache.feed(kind, key, view)


def _served(namespace: str | None, memo: kopf.Memo, **_: Any) -> bool:
    # `tidal run --namespace` limits the TrainingJobs and InferencePools served, not what is
    # watched: kopf runs cluster-wide so every GPU pod on every node is seen, whatever its namespace.
    served = memo.get("served_namespaces")
    return not served or namespace in served


@kopf.index(API_GROUP, API_VERSION, "supernodes")
def tidal_supernodes(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    return {name: _indexed(memo, resource_view(dict(body)))}


@kopf.index(API_GROUP, API_VERSION, "trainingjobs", when=_served)
def tidal_jobs(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): _indexed(memo, resource_view(dict(body)))}


@kopf.index(API_GROUP, API_VERSION, "inferencepools", when=_served)
def tidal_pools(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): _indexed(memo, resource_view(dict(body)))}


@kopf.index("scheduling.k8s.io", "v1", "priorityclasses")
def tidal_priority_classes(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    return {name: _indexed(memo, priority_class_view(dict(body)))}


@kopf.index("", "v1", "resourcequotas")
def tidal_quotas(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    return {(namespace, name): _indexed(memo, quota_view(dict(body)))}


# async: on the event loop, after kopf stored the event in the index (see the module docstring).
@kopf.on.event(API_GROUP, API_VERSION, "supernodes")
async def feed_supernodes(name: str, event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, event, "supernode", name, resource_view, body)
    discovery: Discovery | None = memo.discovery
    if discovery is not None:
        discovery.seen(name, gone=event.get("type") == "DELETED")


@kopf.on.event(API_GROUP, API_VERSION, "trainingjobs", when=_served)
async def feed_jobs(
    namespace: str, name: str, event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    _feed(memo, event, "job", (namespace, name), resource_view, body)


@kopf.on.event(API_GROUP, API_VERSION, "inferencepools", when=_served)
async def feed_pools(
    namespace: str, name: str, event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    _feed(memo, event, "pool", (namespace, name), resource_view, body)


@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses")
async def feed_priority_classes(name: str, event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _feed(memo, event, "priorityclass", name, priority_class_view, body)


@kopf.on.event("", "v1", "resourcequotas")
async def feed_quotas(
    namespace: str, name: str, event: dict[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    _feed(memo, event, "quota", (namespace, name), quota_view, body)


def _single(index: kopf.Index) -> dict[Any, Any]:
    return {key: value for key, store in index.items() for value in store}


def state_from(
    indices: dict[str, kopf.Index], pods: dict[Any, Any] | None = None, nodes: dict[Any, Any] | None = None
) -> ClusterState:
    """A copy of kopf's indices, and the pods and nodes (the informers': k8s/informer.py)."""
    return ClusterState(
        pods=pods or {},
        nodes=nodes or {},
        supernodes=_single(indices["tidal_supernodes"]),
        jobs=_single(indices["tidal_jobs"]),
        pools=_single(indices["tidal_pools"]),
        priority_classes=_single(indices["tidal_priority_classes"]),
        quotas=_single(indices["tidal_quotas"]),
    )


async def _tick(memo: kopf.Memo, kwargs: dict[str, Any]) -> None:
    controller: Controller = memo.controller
    informers: Informers = memo.informers
    if not informers.synced():
        return  # no cycle before the first listings of pods and nodes: it would see half a cluster
    if not controller.last_tick:
        # After (re)start, timers run only once the startup gate opened and peering let us act.
        log.info("first tick: timers running")
    controller.last_tick = time.monotonic()
    informers.queue_if_stale()
    stuck = controller.stuck_report()
    if stuck:
        log.error("controller stuck", message=stuck, failures_in_a_row=controller.failures)
    if not controller.claim():
        return
    indices = {k: v for k, v in kwargs.items() if k.startswith("tidal_")}
    copy = None
    if controller.resync_due():
        # A full copy of the indices and the informers' tables (at the first tick, then rarely),
        # queued for the cycle: it supersedes the events queued before it, which are all in it
        # (fed after kopf indexed them; the informers' fed under the locks the copy is made under).
        def queue(pods: dict[Any, Any], nodes: dict[Any, Any]) -> None:
            nonlocal copy
            copy = state_from(indices, pods, nodes)
            controller.cache.resync(copy)

        informers.copy(queue)
    if controller.relisted and not _audits and controller.audit_due():
        kinds, controller.relisted = set(controller.relisted), set()
        task = asyncio.create_task(audit_indices(controller, copy or state_from(indices), kinds, memo.discovery))
        _audits.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(_audits.discard)
    # Planning is CPU-bound Python: a worker thread keeps kopf's watches, probes and peering going.
    await asyncio.to_thread(controller.cycle)


_audits: set[asyncio.Task[None]] = set()


async def audit_indices(
    controller: Controller, before: ClusterState, kinds: set[str], discovery: Discovery | None = None
) -> None:
    """Drop from the cache what the API server no longer has though no watch said it was deleted.

    kopf lists again after a 410 Gone or a peering pause, and an object deleted in between gets
    no DELETED event: kopf keeps it in its index for good (a job's placement stays booked; a
    Supernode's nodes stay in one). So now and then the keys of every watched kind are
    listed (metadata only) and what the indices held before that LIST began but the LIST lacks is
    forgotten (`WatchCache.forget`): it was deleted by the time the LIST was served. `before` is a
    copy of the indices made on the event loop as the LIST begins. Only the kinds kopf listed
    again since the last audit (`kinds`, from `_feed`) are listed: a LIST is not free, and without
    a re-list nothing can be left behind. Pods and nodes need none: an informer's own LIST replaces
    its table (k8s/informer.py). Supernode discovery forgets the Supernodes the LIST lacks."""
    try:
        listed = await asyncio.to_thread(lambda: {kind: controller.api.list_keys(kind) for kind in kinds})
    except Exception as e:  # the next audit tries again; the cache is no worse than before
        log.warning("index audit failed", error=f"{type(e).__name__}: {e}")
        controller.relisted |= kinds
        return
    if "supernode" in listed and discovery is not None:
        discovery.prune(listed["supernode"])
    phantoms = [
        (kind, key, view)
        for kind in sorted(kinds)
        for key, view in getattr(before, TABLES[kind]).items()
        if key not in listed[kind] and not controller.cache.known_gone(kind, key, view)
    ]
    if phantoms:
        gone = sorted(f"{kind} {key}" for kind, key, _ in phantoms)
        log.warning("objects deleted while a watch was down: dropped", count=len(gone), objects=gone[:20])
        controller.cache.forget(phantoms)


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
@kopf.timer(API_GROUP, API_VERSION, "trainingjobs", interval=TICK_SECONDS, when=_served)
async def tick_jobs(memo: kopf.Memo, **kwargs: Any) -> None:
    await _tick(memo, kwargs)


@kopf.timer(API_GROUP, API_VERSION, "inferencepools", interval=TICK_SECONDS, when=_served)
async def tick_pools(memo: kopf.Memo, **kwargs: Any) -> None:
    await _tick(memo, kwargs)


@kopf.timer(API_GROUP, API_VERSION, "supernodes", interval=TICK_SECONDS)
async def tick_supernodes(memo: kopf.Memo, **kwargs: Any) -> None:
    await _tick(memo, kwargs)
