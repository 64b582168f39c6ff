"""Taints on the real cluster: a gang is never placed on nodes tainted against its pods, and
kube-controller-manager's taint manager leaves tidal's pods on a lost node to tidal."""

from __future__ import annotations

import json

from tidal.k8s.compact import from_wire

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import job, node_supernodes, pods_of, submit, wait_phase

TAINT_KEY = "tidal.dev/test-reserved"


def test_a_new_gang_is_placed_only_on_nodes_whose_taints_it_tolerates(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    racks = sorted(set(node_supernodes(kube).values()))
    open_rack, closed = racks[-1], racks[:-1]
    try:
        for rack in closed:
            selector = f"tidal.dev/supernode={rack}"
            kube.run("taint", "nodes", "-l", selector, f"{TAINT_KEY}=yes:NoSchedule", "--overwrite")
        submit(kube, namespace, job("tainted", dp=1))  # 32 GPUs: fits any one rack
        status = from_wire(wait_phase(kube, namespace, "tainted", "Running", timeout=120))
        supernodes = node_supernodes(kube)
        placed = {supernodes[n] for g in status["placement"] for n in g["nodes"]}
        assert placed == {open_rack}, f"placed on tainted racks: {placed - {open_rack}}"
        assert {supernodes[p["spec"]["nodeName"]] for p in pods_of(kube, namespace, "tainted")} == {open_rack}
    finally:
        for rack in closed:
            kube.run("taint", "nodes", "-l", f"tidal.dev/supernode={rack}", f"{TAINT_KEY}-", check=False)


def test_a_new_gang_is_never_placed_on_cordoned_nodes(kube: Kube, running_operator: OperatorProcess, namespace: str):
    """A cordon is seen twice (spec.unschedulable, and the node.kubernetes.io/unschedulable taint
    Kubernetes adds): with both ignored the gang lands on cordoned nodes and never binds (tried)."""
    racks = sorted(set(node_supernodes(kube).values()))
    open_rack = racks[len(racks) // 2]  # neither end: no packing order picks it by chance
    closed = [r for r in racks if r != open_rack]
    try:
        for rack in closed:
            kube.run("cordon", "-l", f"tidal.dev/supernode={rack}")
        submit(kube, namespace, job("cordoned", dp=1))  # 32 GPUs: fits any one rack
        status = from_wire(wait_phase(kube, namespace, "cordoned", "Running", timeout=120))
        supernodes = node_supernodes(kube)
        placed = {supernodes[n] for g in status["placement"] for n in g["nodes"]}
        assert placed == {open_rack}, f"placed on cordoned racks: {placed - {open_rack}}"
    finally:
        for rack in closed:
            kube.run("uncordon", "-l", f"tidal.dev/supernode={rack}", check=False)


UNREACHABLE = "node.kubernetes.io/unreachable"


def test_the_taint_manager_leaves_tidals_pods_on_an_unreachable_node_to_tidal(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    """A NotReady node gets kube-controller-manager's unreachable:NoExecute taint, and its taint
    manager evicts every pod not tolerating it (300 s after, by the toleration the API server's
    DefaultTolerationSeconds plugin gives a pod that has none): mid-outage that would break the
    group tidal holds (k8s/outage.py). A pod tolerating it for 0 s, on the same node, shows the
    taint manager at work; tidal's pod, stored with no time limit, stays."""
    submit(kube, namespace, job("lost", tp=4, ep=1, pp=1, dp=1))
    wait_phase(kube, namespace, "lost", "Running")
    (pod,) = pods_of(kube, namespace, "lost")
    lost = {t.get("key"): t for t in pod["spec"]["tolerations"] if t.get("effect") == "NoExecute"}
    assert set(lost) == {UNREACHABLE, "node.kubernetes.io/not-ready"}, pod["spec"]["tolerations"]
    assert not any("tolerationSeconds" in t for t in lost.values()), "the API server gave them 300 s"
    node = pod["spec"]["nodeName"]
    control = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "evicted-at-once", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            "tolerations": [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0}],
        },
    }
    kube.apply(control)
    eventually(
        lambda: kube.get("pod", "evicted-at-once", "-n", namespace)["status"].get("phase") == "Running",
        what="the control pod Running",
    )
    try:
        kube.run("taint", "node", node, f"{UNREACHABLE}:NoExecute", "--overwrite")

        def control_evicted() -> bool:
            found = kube.run("get", "pod", "evicted-at-once", "-n", namespace, "-o", "json", check=False)
            if found.returncode != 0:
                assert "NotFound" in found.stderr, found.stderr
                return True
            return bool(json.loads(found.stdout)["metadata"].get("deletionTimestamp"))

        eventually(control_evicted, timeout=60, what="the taint manager evicting the control pod")
        (after,) = pods_of(kube, namespace, "lost")
        assert after["metadata"]["uid"] == pod["metadata"]["uid"] and not after["metadata"].get("deletionTimestamp")
    finally:
        kube.run("taint", "node", node, f"{UNREACHABLE}:NoExecute-", check=False)
