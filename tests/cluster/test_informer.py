"""The pod informer (k8s/informer.py) against the real API server: its first LIST is one listing
of the GPU and tidal pods (no others), the watch from that LIST's version brings creates and
deletes.

A 410 Gone (the run loop lists again: tests/unit/test_informer.py) cannot be had here on demand:
the API server's watch cache answers a watch from a version older than its window's start with the
whole current state as ADDED events until its window has evicted an event (tried: a watch from
version 1, even after compacting etcd), and the window grows while its events are fresh."""

from __future__ import annotations

import pytest

from tidal.k8s import informer as informer_module
from tidal.k8s.api import load_client
from tidal.k8s.informer import PodInformer
from tidal.k8s.watch import WatchCache

from .kube import Kube, eventually


def pod(name: str, namespace: str, gpus: int) -> dict:
    requests = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            # Never scheduled: the shared cluster's GPUs stay free for the other tests.
            "nodeSelector": {"tidal.dev/test-nowhere": "true"},
            "containers": [{"name": "c", "image": "x", "resources": {"requests": requests, "limits": requests}}],
        },
    }


def drained(cache: WatchCache, namespace: str) -> set[str]:
    cache.drain()
    return {name for ns, name in cache.pods if ns == namespace}


def test_the_pod_informer_lists_in_pages_then_watches_creates_and_deletes(
    kube: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
):
    kube.apply(pod("before", namespace, 1), pod("web", namespace, 0), pod("also", namespace, 1))
    monkeypatch.setattr(informer_module, "LIST_PAGE", 1)  # one pod a page: the continue tokens are used
    cache = WatchCache()
    informer = PodInformer(load_client(str(kube.kubeconfig)), cache, active=lambda: True)
    informer.start()
    try:
        assert informer.synced.wait(30)
        assert drained(cache, namespace) == {"before", "also"}, "the listing has the GPU pods, not the other"
        kube.apply(pod("after", namespace, 2))
        eventually(lambda: drained(cache, namespace) == {"before", "also", "after"}, timeout=30, what="a create")
        kube.delete("pod", "before", "-n", namespace, "--wait=false")
        eventually(lambda: drained(cache, namespace) == {"also", "after"}, timeout=60, what="a delete watched")
        assert informer.listings == 1 and informer.events >= 2
    finally:
        informer.stop()
