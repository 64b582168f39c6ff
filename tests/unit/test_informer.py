"""The pod informer's event handling (k8s/informer.py), one event at a time; the LIST, the watch
and a 410's re-list against the real API server are in tests/cluster/test_informer.py."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tidal.k8s.informer import Gone, PodInformer
from tidal.k8s.manifests import owner_reference
from tidal.k8s.watch import WatchCache


def pod(name: str, uid: str, gpus: int = 0, owned: bool = True, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": uid}
    if owned:
        meta["ownerReferences"] = [owner_reference("TrainingJob", "j", "uid-j")]
    if terminating:
        meta["deletionTimestamp"] = "2026-05-01T00:00:00Z"
    requests = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}}


def informer(active: bool = True) -> tuple[PodInformer, WatchCache, list[bool]]:
    cache = WatchCache()
    state = [active]
    return PodInformer(client.ApiClient(), cache, active=lambda: state[0]), cache, state


def test_events_of_interesting_pods_reach_the_cache_and_others_never_do():
    inf, cache, _ = informer()
    assert inf.handle({"type": "ADDED", "object": pod("j-0", "10")}, "1") == "10"
    inf.handle({"type": "ADDED", "object": pod("web", "11", owned=False)}, "10")  # no accelerator, not tidal's
    inf.handle({"type": "ADDED", "object": pod("gpu", "12", gpus=1, owned=False)}, "11")  # a foreign GPU pod
    cache.drain()
    assert set(cache.pods) == {("ml", "j-0"), ("ml", "gpu")}
    inf.handle({"type": "DELETED", "object": pod("j-0", "10")}, "12")
    inf.handle({"type": "DELETED", "object": pod("web", "11", owned=False)}, "13")
    cache.drain()
    assert set(cache.pods) == {("ml", "gpu")} == set(inf.pods)


def test_a_pod_that_stops_being_interesting_leaves_the_cache():
    inf, cache, _ = informer()
    inf.handle({"type": "ADDED", "object": pod("j-0", "10")}, "1")
    inf.handle({"type": "MODIFIED", "object": pod("j-0", "10", owned=False)}, "2")  # orphaned, no GPU
    cache.drain()
    assert cache.pods == {} and inf.pods == {}


def test_a_late_event_of_a_replaced_pod_does_not_take_its_name_back_in_the_table():
    inf, _, _ = informer()
    inf.handle({"type": "ADDED", "object": pod("j-0", "20")}, "1")  # the new pod under the name
    inf.handle({"type": "MODIFIED", "object": pod("j-0", "10", terminating=True)}, "2")  # the old one, late
    inf.handle({"type": "DELETED", "object": pod("j-0", "10", terminating=True)}, "3")
    assert inf.pods[("ml", "j-0")].uid == "20"


def test_bookmarks_move_the_version_and_a_410_is_gone():
    inf, cache, _ = informer()
    assert inf.handle({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "99"}}}, "1") == "99"
    assert cache.queued == 0 and inf.events == 0
    with pytest.raises(Gone):
        inf.handle({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}, "99")
    with pytest.raises(RuntimeError):
        inf.handle({"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "99")


def test_while_no_cycle_runs_events_are_not_queued_and_the_next_tick_queues_the_table():
    """A replica standing by (or paused by peering) queues nothing for hours; its first tick
    queues one copy, which brings the cache to every pod watched meanwhile."""
    inf, cache, state = informer(active=False)
    for i in range(3):
        inf.handle({"type": "ADDED", "object": pod(f"j-{i}", str(10 + i))}, "1")
    inf.handle({"type": "DELETED", "object": pod("j-1", "11")}, "2")
    assert cache.queued == 0 and inf.stale
    state[0] = True
    inf.queue_if_stale()
    assert cache.queued == 1 and not inf.stale
    inf.queue_if_stale()
    assert cache.queued == 1, "once"
    cache.drain()
    assert set(cache.pods) == {("ml", "j-0"), ("ml", "j-2")}


def test_the_run_loop_lists_again_after_a_410_and_retries_other_failures_from_its_version():
    inf, _, _ = informer()
    calls: list[str] = []
    script = iter(["list", Gone("expired"), "list", RuntimeError("connection reset"), "stop"])

    def listing() -> str:
        calls.append("list")
        assert next(script) == "list"
        return f"v{len(calls)}"

    def watching(version: str) -> str:
        calls.append(f"watch {version}")
        step = next(script)
        if step == "stop":
            inf.stop()
            return version
        raise step

    inf.list, inf.watch = listing, watching  # type: ignore[method-assign]
    inf._wait = lambda seconds: False  # no real sleep between retries
    inf.run()
    assert calls == ["list", "watch v1", "list", "watch v3", "watch v3"]
