"""Pods and nodes watched outside kopf: a paged LIST, then a WATCH from its resourceVersion, into the cache.

kopf handles every watch event as an object of its own (a task, a handler call, progress checks,
log records): at 5,004 nodes that machinery was ~61% of the operator's CPU while a 4,096-pod gang
started, and its warm-up handled every node one by one (issue 36). Here an event costs one
`json.loads` and a view: the raw stream is read line by line (the kubernetes client's
`iter_resp_lines`, no model deserialization) in a thread of its own per kind (`Watched`: `PODS`,
`NODES`), and each event is queued for the cycle (`WatchCache.feed`), as kopf's handlers queue
theirs. An event whose view equals the one held (a node's heartbeat) is not queued (`on_object`
still sees it).

A LIST is queued as a listing of the kind (`WatchCache.resync(kinds=(kind,))`): the drain that
reaches it brings that table to it and drops the kind's events queued before it. So a fresh LIST
also removes objects deleted while no watch ran (kopf's indices keep those: `handlers.audit_indices`),
and the watch starts from the LIST's resourceVersion, so no event between the two is lost. The
watch asks for bookmarks (the API server's periodic "you are at version N"), so a watch that ends
(the server's timeout, a dropped connection) starts again from a recent version instead of
listing; a 410 Gone (that version is no longer in the server's history) lists again.

Each informer keeps its own table (`table`), so the controller's periodic full listing (and the
one after a failed cycle, which may have half-applied a drain) copies pods and nodes from the
informers as it copies the other kinds from kopf's indices (`Informers.copy`): a copy and its
queueing, and every event's update and queueing, happen under the informer's lock, so no event
queued before a copy is missing from it (the copy supersedes it).

The operator's first cycle waits for both first listings (`Informers.synced`): it must never see
half the pods or half the nodes. The watches run while kopf peering keeps this replica standing
by, so a replica that takes over does not list every pod and node first. While no cycle runs
(standing by, paused, not started) events only update the tables: queued for nobody, they would
pile up for hours; the first tick after such a gap queues a copy of the table instead
(`queue_if_stale`). `on_object(uid, view)` (Supernode discovery, k8s/supernodes.py) sees every
object listed or watched but deleted ones, in the informer's thread, outside the lock: it must
return at once (no API call), or the watch would stall behind it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tidal.k8s.state import ClusterState, node_view, pod_view, tidal_controller
from tidal.k8s.watch import TABLES, Deleted, WatchCache

log = structlog.get_logger("tidal")

LIST_PAGE = 500
LIST_READ_TIMEOUT_SECONDS = 60
WATCH_SERVER_TIMEOUT_SECONDS = 300
"""How long the API server keeps one watch open; it is opened again from the last version seen."""
WATCH_READ_TIMEOUT_SECONDS = 150
"""A watch silent this long is taken for dead (bookmarks come about every minute) and opened again."""
SHORT_WATCH_SECONDS = 1.0
"""A watch that ends sooner with nothing in it counts as a failure (backed off)."""
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Waits before trying again after a failed LIST or watch, growing while failures repeat."""


class Gone(Exception):
    """The watch's resourceVersion is no longer in the API server's history (HTTP 410)."""


def interesting_pod(body: dict[str, Any]) -> bool:
    """Pods that hold accelerators or belong to tidal: the rest never matter for placement."""
    if tidal_controller(body.get("metadata") or {}) is not None:
        return True
    for c in (body.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        if any("/" in k for k in {**(res.get("limits") or {}), **(res.get("requests") or {})}):
            return True
    return False


def _gone_or(error: ApiException) -> Exception:
    """A 410 answer (the version or continue token expired) is Gone; anything else as it came."""
    return Gone(str(error.reason)) if error.status == 410 else error


def _namespaced_key(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _name(body: dict[str, Any]) -> str:
    return (body.get("metadata") or {}).get("name") or ""


def _uid(body: dict[str, Any]) -> str:
    return (body.get("metadata") or {}).get("uid") or ""


@dataclass(frozen=True)
class Watched:
    """One kind an informer lists and watches: how it is asked for and filed in the cache."""

    kind: str
    """The cache's kind ("pod", "node"): its table is `TABLES[kind]`."""
    list_method: str
    """The CoreV1Api method that lists it cluster-wide (and watches it with watch=True)."""
    view: Callable[[dict[str, Any]], Any]
    key: Callable[[dict[str, Any]], Any]
    interesting: Callable[[dict[str, Any]], bool]
    """Objects the cache holds; an object that stops being so is fed as deleted."""
    deleted: Callable[[Any], Any]
    """What a deletion feeds, from the object's final view (`WatchCache.feed`)."""


PODS = Watched("pod", "list_pod_for_all_namespaces", pod_view, _namespaced_key, interesting_pod, deleted=Deleted)
NODES = Watched("node", "list_node", node_view, _name, interesting=lambda _: True, deleted=lambda _: None)


class Informer:
    """List and watch every object of one kind (`watched`), feeding the interesting ones to `cache`."""

    def __init__(
        self,
        api_client: client.ApiClient,
        cache: WatchCache,
        active: Callable[[], bool],
        watched: Watched = PODS,
        connect_timeout: float = 5.0,
        wait: Callable[[float], bool] | None = None,
        on_object: Callable[[str, Any], None] | None = None,
    ):
        """`active()`: whether cycles run now (the operator ticked lately), so events are worth
        queueing. `on_object(uid, view)`: called for every interesting object listed or watched,
        but deleted ones; its failures are logged, never the watch's."""
        self.core = client.CoreV1Api(api_client)
        self.cache = cache
        self.watched = watched
        self.connect_timeout = connect_timeout
        self.synced = threading.Event()
        """Set once the first listing is queued: the first cycle may start."""
        self.stopping = threading.Event()
        self._wait = wait or self.stopping.wait
        self.table: dict[Any, Any] = {}
        """The interesting objects as last watched: one that stops being so (an orphaned tidal pod
        without accelerators) is fed as deleted."""
        self.lock = threading.Lock()
        self.stale = False
        """The cache lacks events (or a listing) this table has: fed while nobody drained."""
        self._active = active
        self._on_object = on_object
        self.version: str | None = None
        """Where the watch resumes: the last event's or bookmark's resourceVersion (None: list)."""
        self.listings = 0
        self.events = 0
        self.bookmarks = 0
        self._thread: threading.Thread | None = None
        self._response: Any = None

    @property
    def kind(self) -> str:
        return self.watched.kind

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"tidal-{self.kind}-informer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current read: the open watch is closed, so a blocked read ends now."""
        self.stopping.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.close()

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                if self.version is None:
                    self.list()
                started, events = time.monotonic(), self.events + self.bookmarks
                self.watch()
                if self.stopping.is_set():
                    return
                if self.events + self.bookmarks == events and time.monotonic() - started < SHORT_WATCH_SECONDS:
                    # Ended at once with nothing in it (a proxy or a server going down): not a
                    # loop of requests as fast as they return.
                    raise RuntimeError("the watch ended at once, empty")
                failures = 0
            except Gone as e:
                log.info(f"{self.kind} watch expired (410 Gone): listing again", error=str(e)[:200])
                self.version = None
            except Exception as e:  # a dropped connection, a refused LIST: try again, never die
                if self.stopping.is_set():
                    return  # `stop` closed the watch under the read
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning(
                    f"{self.kind} watch failed; retrying", error=f"{type(e).__name__}: {str(e)[:200]}", delay=delay
                )
                if self._wait(delay):
                    return

    def list(self) -> None:
        """Every object now, one consistent snapshot in pages, queued as the kind's listing; the
        watch starts at its resourceVersion. An expired continue token is a 410: listed afresh."""
        table: dict[Any, Any] = {}
        seen: list[tuple[str, Any]] = []  # (uid, view) for `on_object`: not whole bodies, at 5,000 nodes
        token: str | None = None
        while True:
            page = self._request(LIST_READ_TIMEOUT_SECONDS, limit=LIST_PAGE, _continue=token)
            body = json.loads(page.data)
            for item in body.get("items") or []:
                view = self._view(item)
                if view is not None:
                    table[self.watched.key(item)] = view
                    if self._on_object is not None:
                        seen.append((_uid(item), view))
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        with self.lock:
            self.table = table
            if self._active():
                self._queue_table()
            else:
                self.stale = True
        self.version = str(meta.get("resourceVersion") or "")
        self.listings += 1
        self.synced.set()
        log.info(f"{self.kind}s listed", count=len(table), resource_version=self.version)
        for uid, view in seen:
            self._tell(uid, view)

    def watch(self, timeout_seconds: int = WATCH_SERVER_TIMEOUT_SECONDS) -> None:
        """Feed events from `self.version` until the server ends the watch, moving the version
        with every event and bookmark, so a watch that breaks resumes where it was (not where it
        began: that would replay old states over newer ones). Raises Gone when it has expired."""
        # Bookmarks come about every minute: a connection silent for longer is dead.
        response = self._request(
            WATCH_READ_TIMEOUT_SECONDS,
            watch=True,
            resource_version=self.version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
        )
        self._response = response
        try:
            for line in iter_resp_lines(response):
                if self.stopping.is_set():
                    break
                if line:
                    self.handle(json.loads(line))
        finally:
            self._response = None
            response.close()
            response.release_conn()

    def _request(self, read_timeout: float, **query: Any) -> Any:
        """GET every object of the kind, unparsed (a LIST page, or a watch's stream); a 410 answer is Gone."""
        try:
            return getattr(self.core, self.watched.list_method)(
                _preload_content=False, _request_timeout=(self.connect_timeout, read_timeout), **query
            )
        except ApiException as e:
            raise _gone_or(e) from e

    def handle(self, event: dict[str, Any]) -> None:
        """One watch event into the table and the cache; moves `self.version` past it."""
        kind, body = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if body.get("code") == 410:
                raise Gone(body.get("message") or "")
            raise RuntimeError(f"watch error: {body.get('message') or body}")
        version = (body.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.bookmarks += 1
            self.version = str(version or self.version)
            return
        self.events += 1
        self._apply(kind, body)
        self.version = str(version or self.version)

    def _apply(self, kind: object, body: dict[str, Any]) -> None:
        key = self.watched.key(body)
        view = self._view(body)
        if view is None and key not in self.table:
            return
        with self.lock:
            held = self.table.get(key)
            if kind == "DELETED":
                if held is not None and view is not None and _same_object(held, view):
                    del self.table[key]
                self._feed(key, self.watched.deleted(view) if view is not None else None)
            elif view is None:  # no longer one the cache holds: out, no uid remembered
                del self.table[key]
                self._feed(key, None)
            elif view != held:  # an equal view (a node's heartbeat) changes nothing the cache reads
                self.table[key] = view
                self._feed(key, view)
        if kind != "DELETED" and view is not None:
            self._tell(_uid(body), view)

    def _feed(self, key: Any, fed: Any) -> None:
        """Under the lock: queue the event if cycles run, else mark the table ahead of the cache."""
        if self._active():
            self.cache.feed(self.kind, key, fed)
        else:
            self.stale = True

    def _queue_table(self) -> None:
        """Under the lock: queue a copy of the table as the kind's listing."""
        self.cache.resync(ClusterState(**{TABLES[self.kind]: dict(self.table)}), kinds=(self.kind,))

    def _tell(self, uid: str, view: Any) -> None:
        if self._on_object is None:
            return
        try:
            self._on_object(uid, view)
        except Exception as e:  # the hook's failure is its own: the watch goes on
            log.error(f"{self.kind} hook failed", uid=uid, error=f"{type(e).__name__}: {str(e)[:200]}")

    def _view(self, body: dict[str, Any]) -> Any:
        """The object's view if it is one the cache holds, else None. An object the view cannot be
        made of is logged and skipped: one bad object must not stop the watch for good."""
        try:
            return self.watched.view(body) if self.watched.interesting(body) else None
        except Exception as e:
            meta = body.get("metadata") or {}
            log.error(
                f"{self.kind} skipped: its view cannot be made",
                name=f"{meta.get('namespace') or ''}/{meta.get('name')}".lstrip("/"),
                error=str(e)[:200],
            )
            return None

    def queue_if_stale(self) -> None:
        """On a tick: if events went unqueued since the last one, queue a copy of the table (it
        supersedes the kind's events queued before it)."""
        with self.lock:
            if self.stale:
                self._queue_table()
                self.stale = False

    def copy(self, queue: Callable[[dict[Any, Any]], None]) -> None:
        """`queue(a copy of the table)` under the lock events are fed under (see the module docstring)."""
        with self.lock:
            queue(dict(self.table))
            self.stale = False


def _same_object(held: Any, view: Any) -> bool:
    """A deletion removes the object it names: a pod by uid (a successor under the same name stays)."""
    return getattr(held, "uid", None) == getattr(view, "uid", None)


class Informers:
    """The pod and node informers, as the handlers use them together."""

    def __init__(self, pods: Informer, nodes: Informer):
        self.pods, self.nodes = pods, nodes

    def start(self) -> None:
        self.pods.start()
        self.nodes.start()

    def synced(self) -> bool:
        """Both first listings queued: no cycle may start before (it would see half a cluster)."""
        return self.pods.synced.is_set() and self.nodes.synced.is_set()

    def queue_if_stale(self) -> None:
        self.nodes.queue_if_stale()
        self.pods.queue_if_stale()

    def copy(self, queue: Callable[[dict[Any, Any], dict[Any, Any]], None]) -> None:
        """`queue(pods, nodes)` under both informers' locks (always nodes' first: each informer's
        thread takes only its own, so this order cannot deadlock)."""
        self.nodes.copy(lambda nodes: self.pods.copy(lambda pods: queue(pods, nodes)))
