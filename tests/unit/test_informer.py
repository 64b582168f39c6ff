"""The pod informer (k8s/informer.py) one event at a time, and its run loop over a scripted API;
the LIST and the watch against the real API server are in tests/cluster/test_informer.py."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tidal.k8s.informer import NODES, PODS, Gone, Informer
from tidal.k8s.manifests import owner_reference
from tidal.k8s.watch import WatchCache


def pod(name: str, uid: str, gpus: int = 0, owned: bool = True, version: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": version or uid}
    if owned:
        meta["ownerReferences"] = [owner_reference("TrainingJob", "j", "uid-j")]
    requests = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}}


def informer(active: bool = True) -> tuple[Informer, WatchCache, list[bool]]:
    cache = WatchCache()
    state = [active]
    return Informer(client.ApiClient(), cache, active=lambda: state[0], watched=PODS), cache, state


def test_events_of_interesting_pods_reach_the_cache_and_others_never_do():
    inf, cache, _ = informer()
    inf.handle({"type": "ADDED", "object": pod("j-0", "10")})
    assert inf.version == "10"
    inf.handle({"type": "ADDED", "object": pod("web", "11", owned=False)})  # no accelerator, not tidal's
    inf.handle({"type": "ADDED", "object": pod("gpu", "12", gpus=1, owned=False)})  # a foreign GPU pod
    cache.drain()
    assert set(cache.pods) == {("ml", "j-0"), ("ml", "gpu")}
    inf.handle({"type": "DELETED", "object": pod("j-0", "10", version="13")})
    inf.handle({"type": "DELETED", "object": pod("web", "11", owned=False, version="14")})
    cache.drain()
    assert set(cache.pods) == {("ml", "gpu")} == set(inf.table)
    assert inf.version == "14"


def test_a_pod_that_stops_being_interesting_leaves_and_may_come_back():
    inf, cache, _ = informer()
    inf.handle({"type": "ADDED", "object": pod("j-0", "10")})
    inf.handle({"type": "MODIFIED", "object": pod("j-0", "10", owned=False, version="11")})  # orphaned, no GPU
    cache.drain()
    assert cache.pods == {} and inf.table == {}
    inf.handle({"type": "MODIFIED", "object": pod("j-0", "10", version="12")})  # adopted again: not a deleted uid
    cache.drain()
    assert set(cache.pods) == {("ml", "j-0")}


def test_a_pod_whose_view_cannot_be_made_is_skipped_not_fatal():
    inf, cache, _ = informer()
    bad = pod("j-0", "10")
    bad["spec"]["containers"] = 5  # what no API server would serve
    inf.handle({"type": "ADDED", "object": bad})
    inf.handle({"type": "ADDED", "object": pod("j-1", "11")})
    cache.drain()
    assert set(cache.pods) == {("ml", "j-1")} and inf.version == "11"


def test_bookmarks_move_the_version_and_a_410_is_gone():
    inf, cache, _ = informer()
    inf.handle({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "99"}}})
    assert inf.version == "99" and cache.queued == 0 and inf.events == 0
    with pytest.raises(Gone):
        inf.handle({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}})
    with pytest.raises(RuntimeError):
        inf.handle({"type": "ERROR", "object": {"code": 500, "message": "boom"}})


def test_while_no_cycle_runs_events_are_not_queued_and_the_next_tick_queues_the_table():
    """A replica standing by (or paused by peering) queues nothing for hours; its first tick
    queues one copy, which brings the cache to every pod watched meanwhile."""
    inf, cache, state = informer(active=False)
    for i in range(3):
        inf.handle({"type": "ADDED", "object": pod(f"j-{i}", str(10 + i))})
    inf.handle({"type": "DELETED", "object": pod("j-1", "11", version="20")})
    assert cache.queued == 0 and inf.stale
    state[0] = True
    inf.queue_if_stale()
    assert cache.queued == 1 and not inf.stale
    inf.queue_if_stale()
    assert cache.queued == 1, "once"
    cache.drain()
    assert set(cache.pods) == {("ml", "j-0"), ("ml", "j-2")}


class ScriptedCore:
    """`list_pod_for_all_namespaces` as the API server answers, from a script: a LIST page, a
    watch stream (lines; an exception ends it), or an exception raised at once."""

    def __init__(self, inf: Informer, script: list[Any]):
        self.inf, self.script, self.calls = inf, list(script), []

    def list_pod_for_all_namespaces(self, watch: bool = False, resource_version: str | None = None, **_: Any):
        self.calls.append(f"watch {resource_version}" if watch else "list")
        if not self.script:
            self.inf.stop()
            return Stream([])
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


class Stream:
    def __init__(self, lines: list[Any], data: bytes = b""):
        self.lines, self.data = lines, data

    def stream(self, amt: Any = None, decode_content: bool = False):
        for line in self.lines:
            if isinstance(line, Exception):
                raise line
            yield (line + "\n").encode()

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


def listing(version: str) -> Stream:
    return Stream([], data=f'{{"metadata": {{"resourceVersion": "{version}"}}, "items": []}}'.encode())


def event(kind: str, version: str) -> str:
    return json.dumps({"type": kind, "object": pod("j-0", "u1", version=version)})


def run(script: list[Any]) -> tuple[list[str], list[float]]:
    inf, _, _ = informer()
    core = ScriptedCore(inf, script)
    inf.core = core  # type: ignore[assignment]
    waits: list[float] = []
    inf._wait = lambda seconds: waits.append(seconds) or False  # no real sleep between retries
    inf.run()
    return core.calls, waits


def test_a_watch_that_breaks_resumes_from_the_last_version_it_saw_not_where_it_began():
    bookmark = '{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}}'
    calls, waits = run([listing("100"), Stream([event("ADDED", "120"), bookmark, ConnectionResetError("reset")])])
    assert calls[:3] == ["list", "watch 100", "watch 150"]
    assert waits == [0.2]


def test_a_410_lists_again_whether_an_error_event_or_the_answer_itself():
    gone_event = '{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}'
    calls, waits = run([listing("100"), Stream([gone_event]), listing("200"), ApiException(status=410), listing("300")])
    assert calls[:6] == ["list", "watch 100", "list", "watch 200", "list", "watch 300"]
    assert waits == [], "no back-off for an expired version: listing is the way on"


def test_a_watch_that_ends_at_once_empty_is_backed_off_not_reopened_in_a_tight_loop():
    calls, waits = run([listing("100"), Stream([]), Stream([]), Stream([])])
    assert calls[:4] == ["list", "watch 100", "watch 100", "watch 100"]
    assert waits[:3] == [0.2, 0.5, 1.0]


def node(name: str, version: str, ready: bool = True, heartbeat: str = "t0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version, "labels": {"rack": "r1"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "64"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastHeartbeatTime": heartbeat}],
        },
    }


def node_informer(seen: list[str]) -> tuple[Informer, WatchCache]:
    cache = WatchCache()

    def hook(body: dict[str, Any], view: Any) -> None:
        seen.append(view.name)

    return Informer(client.ApiClient(), cache, active=lambda: True, watched=NODES, on_object=hook), cache


def test_node_events_reach_the_cache_a_heartbeat_is_not_queued_but_the_hook_sees_it():
    seen: list[str] = []
    inf, cache = node_informer(seen)
    inf.handle({"type": "ADDED", "object": node("n1", "10")})
    assert cache.queued == 1
    inf.handle({"type": "MODIFIED", "object": node("n1", "11", heartbeat="t1")})  # nothing the view reads
    assert cache.queued == 1 and seen == ["n1", "n1"] and inf.version == "11"
    inf.handle({"type": "MODIFIED", "object": node("n1", "12", ready=False)})
    cache.drain()
    assert not cache.nodes["n1"].ready and cache.nodes["n1"].capacity == {"nvidia.com/gpu": 8}
    inf.handle({"type": "DELETED", "object": node("n1", "13", ready=False)})
    cache.drain()
    assert cache.nodes == {} and inf.table == {} and seen == ["n1"] * 3, "a deletion is not shown to the hook"


def test_a_node_listing_replaces_the_table_and_a_failing_hook_stops_nothing():
    def broken(body: dict[str, Any], view: Any) -> None:
        raise RuntimeError("API down")

    cache = WatchCache()
    inf = Informer(client.ApiClient(), cache, active=lambda: True, watched=NODES, on_object=broken)
    inf.handle({"type": "ADDED", "object": node("old", "5")})
    page = {"metadata": {"resourceVersion": "100"}, "items": [node("n1", "90"), node("n2", "91")]}
    inf.core = types.SimpleNamespace(list_node=lambda **_: Stream([], data=json.dumps(page).encode()))  # type: ignore[assignment]
    with structlog.testing.capture_logs() as logs:
        inf.list()
    cache.drain()
    assert set(cache.nodes) == {"n1", "n2"} == set(inf.table) and inf.version == "100" and inf.synced.is_set()
    assert [e["event"] for e in logs].count("node hook failed") == 2
