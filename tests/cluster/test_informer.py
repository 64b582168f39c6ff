"""The pod and node informers (k8s/informer.py) against the real API server: the pods' first LIST
is one listing of the GPU and tidal pods (no others), the nodes' of every node; the watch from
that LIST's version brings creates, changes and deletes.

A 410 Gone (the run loop lists again: tests/unit/test_informer.py) cannot be had here on demand:
the API server's watch cache answers a watch from a version older than its window's start with the
whole current state as ADDED events until its window has evicted an event (tried: a watch from
version 1, even after compacting etcd), and the window grows while its events are fresh."""

from __future__ import annotations

import pytest

from tidal.k8s import informer as informer_module
from tidal.k8s.api import load_client
from tidal.k8s.informer import NODES, PODS, Informer
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
    informer = Informer(load_client(str(kube.kubeconfig)), cache, active=lambda: True, watched=PODS)
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


def test_the_node_informer_lists_every_node_then_watches_a_change_a_create_and_a_delete(kube: Kube):
    """A node without accelerators (no capacity for the other tests), made and removed here; the
    discovery hook sees every node of the listing and each watched change."""
    nodes = {n["metadata"]["name"] for n in kube.get("nodes")["items"]}
    cache, hooked = WatchCache(), []
    informer = Informer(
        load_client(str(kube.kubeconfig)),
        cache,
        active=lambda: True,
        watched=NODES,
        on_object=lambda body, view: hooked.append(view.name),
    )
    name = "tidal-informer-test"
    informer.start()
    try:
        assert informer.synced.wait(30)
        cache.drain()
        assert set(cache.nodes) == nodes
        eventually(lambda: set(hooked) == nodes, timeout=30, what="the hook told of every node listed")
        kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"rack": "a"}}})
        eventually(lambda: cache.drain() >= 0 and name in cache.nodes, timeout=30, what="a node created")
        kube.run("label", "node", name, "rack=b", "--overwrite")
        eventually(
            lambda: cache.drain() >= 0 and cache.nodes[name].labels.get("rack") == "b", timeout=30, what="a label"
        )
        kube.delete("node", name)
        eventually(lambda: cache.drain() >= 0 and name not in cache.nodes, timeout=30, what="a node deleted")
        assert informer.listings == 1 and name in hooked
    finally:
        informer.stop()
        kube.delete("node", name)
