"""Pods watched outside kopf: a paged LIST, then a WATCH from its resourceVersion, into the cache.

kopf handles every watch event as an object of its own (a task, a handler call, progress checks,
log records): at 5,004 nodes that machinery was ~61% of the operator's CPU while a 4,096-pod gang
started (issue 36). Here an event costs one `json.loads` and a view: the raw stream is read line
by line (the kubernetes client's `iter_resp_lines`, no model deserialization) in a thread of its
own, and each event is queued for the cycle (`WatchCache.feed`), as kopf's handlers queue theirs.

A LIST is queued as a listing of the kind (`WatchCache.resync(kinds=("pod",))`): the drain that
reaches it brings the pods table to it and drops the pod events queued before it. So a fresh LIST
also removes pods deleted while no watch ran (kopf's indices keep those: `handlers.audit_indices`),
and the watch starts from the LIST's resourceVersion, so no event between the two is lost. The
watch asks for bookmarks (the API server's periodic "you are at version N"), so a watch that ends
(the server's timeout, a dropped connection) starts again from a recent version instead of
listing; a 410 Gone (that version is no longer in the server's history) lists again.

The informer keeps its own table of the pods (`pods`), so the controller's periodic full listing
(and the one after a failed cycle, which may have half-applied a drain) copies the pods from it as
it copies the other kinds from kopf's indices (`copy_pods`): the copy and its queueing, and every
event's update and queueing, happen under one lock, so no event queued before a copy is missing
from it (the copy supersedes it).

The operator's first cycle waits for the first listing (`synced`): it must never see half the pods.
The watch runs while kopf peering keeps this replica standing by, so a replica that takes over
does not list every pod first. While no cycle runs (standing by, paused, not started) events only
update the table: queued for nobody, they would pile up for hours; the first tick after such a
gap queues a copy of the table instead (`queue_if_stale`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from tidal.k8s.state import ClusterState, PodView, pod_view, tidal_controller
from tidal.k8s.watch import Deleted, WatchCache

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


def _key(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class PodInformer:
    """List and watch every pod of the cluster, feeding the interesting ones to `cache`."""

    def __init__(
        self,
        api_client: client.ApiClient,
        cache: WatchCache,
        active: Callable[[], bool],
        connect_timeout: float = 5.0,
        wait: Callable[[float], bool] | None = None,
    ):
        """`active()`: whether cycles run now (the operator ticked lately), so events are worth queueing."""
        self.core = client.CoreV1Api(api_client)
        self.cache = cache
        self.connect_timeout = connect_timeout
        self.synced = threading.Event()
        """Set once the first listing is queued: the first cycle may start."""
        self.stopping = threading.Event()
        self._wait = wait or self.stopping.wait
        self.pods: dict[tuple[str, str], PodView] = {}
        """The interesting pods as last watched: one that stops being so (an orphaned tidal pod
        without accelerators) is fed as deleted."""
        self.lock = threading.Lock()
        self.stale = False
        """The cache lacks events (or a listing) this table has: fed while nobody drained."""
        self._active = active
        self.version: str | None = None
        """Where the watch resumes: the last event's or bookmark's resourceVersion (None: list)."""
        self.listings = 0
        self.events = 0
        self.bookmarks = 0
        self._thread: threading.Thread | None = None
        self._response: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="tidal-pod-informer", daemon=True)
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
                log.info("pod watch expired (410 Gone): listing again", error=str(e)[:200])
                self.version = None
            except Exception as e:  # a dropped connection, a refused LIST: try again, never die
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("pod watch failed; retrying", error=f"{type(e).__name__}: {str(e)[:200]}", delay=delay)
                if self._wait(delay):
                    return

    def list(self) -> None:
        """Every pod now, one consistent snapshot in pages, queued as the pods' listing; the
        watch starts at its resourceVersion. An expired continue token is a 410: listed afresh."""
        pods: dict[tuple[str, str], PodView] = {}
        token: str | None = None
        while True:
            page = self._pods(LIST_READ_TIMEOUT_SECONDS, limit=LIST_PAGE, _continue=token)
            body = json.loads(page.data)
            for item in body.get("items") or []:
                view = self._view(item)
                if view is not None:
                    pods[_key(item)] = view
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        with self.lock:
            self.pods = pods
            if self._active():
                self.cache.resync(ClusterState(pods=dict(pods)), kinds=("pod",))
            else:
                self.stale = True
        self.version = str(meta.get("resourceVersion") or "")
        self.listings += 1
        self.synced.set()
        log.info("pods listed", pods=len(pods), resource_version=self.version)

    def watch(self, timeout_seconds: int = WATCH_SERVER_TIMEOUT_SECONDS) -> None:
        """Feed events from `self.version` until the server ends the watch, moving the version
        with every event and bookmark, so a watch that breaks resumes where it was (not where it
        began: that would replay old states over newer ones). Raises Gone when it has expired."""
        # Bookmarks come about every minute: a connection silent for longer is dead.
        response = self._pods(
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

    def _pods(self, read_timeout: float, **query: Any) -> Any:
        """GET every pod, unparsed (a LIST page, or a watch's stream); a 410 answer is Gone."""
        try:
            return self.core.list_pod_for_all_namespaces(
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
        key = _key(body)
        view = self._view(body)
        if view is None and key not in self.pods:
            return
        with self.lock:
            held = self.pods.get(key)
            fed: PodView | Deleted | None
            if kind == "DELETED":
                if held is not None and view is not None and held.uid == view.uid:
                    del self.pods[key]
                fed = Deleted(view) if view is not None else None
            elif view is None:  # no longer one of ours nor holding accelerators: out, no uid remembered
                del self.pods[key]
                fed = None
            else:
                self.pods[key] = view
                fed = view
            if self._active():
                self.cache.feed("pod", key, fed)
            else:
                self.stale = True

    def _view(self, body: dict[str, Any]) -> PodView | None:
        """The pod's view if it is one the cache holds, else None. An object the view cannot be
        made of is logged and skipped: one bad pod must not stop the watch for good."""
        try:
            return pod_view(body) if interesting_pod(body) else None
        except Exception as e:
            meta = body.get("metadata") or {}
            log.error(
                "pod skipped: its view cannot be made",
                pod=f"{meta.get('namespace')}/{meta.get('name')}",
                error=str(e)[:200],
            )
            return None

    def queue_if_stale(self) -> None:
        """On a tick: if events went unqueued since the last one, queue a copy of the table (it
        supersedes the pod events queued before it)."""
        with self.lock:
            if self.stale:
                self.cache.resync(ClusterState(pods=dict(self.pods)), kinds=("pod",))
                self.stale = False

    def copy_pods(self, queue: Callable[[dict[tuple[str, str], PodView]], None]) -> None:
        """`queue(a copy of the pods)` under the lock events are fed under (see the module docstring)."""
        with self.lock:
            queue(dict(self.pods))
            self.stale = False
