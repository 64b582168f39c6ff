"""Taints at planning and fencing of NotReady nodes, on the in-memory cluster
(tests/unit/fake_cluster.py) driving the real controller."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.k8s.state import NodeView
from tidal.k8s.taints import Taint, Toleration, untolerated

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

START = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
SPEC = {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
"""One group of 4 pods of 4 GPUs: 4 nodes of one NVL72 rack (18 nodes)."""


def taint(cluster: FakeCluster, node: str, *taints: Taint) -> None:
    cluster.nodes[node] = dataclasses.replace(cluster.nodes[node], taints=(*cluster.nodes[node].taints, *taints))


def rack(cluster: FakeCluster, supernode: str) -> list[str]:
    return sorted(n for n in cluster.nodes if n.startswith(supernode + "-"))


def placed_nodes(cluster: FakeCluster, job: str) -> set[str]:
    return {n for g in cluster.status("TrainingJob", "ml", job)["placement"] for n in g["nodes"]}


# -- A: taints ------------------------------------------------------------------------------------


def test_toleration_matching_follows_kubernetes():
    gpu = Taint("nvidia.com/gpu", "present", "NoSchedule")
    assert untolerated([gpu], []) == (gpu,)
    assert not untolerated([gpu], [Toleration("nvidia.com/gpu", "Exists")])
    assert not untolerated([gpu], [Toleration("nvidia.com/gpu", "Equal", "present", "NoSchedule")])
    assert untolerated([gpu], [Toleration("nvidia.com/gpu", "Equal", "absent")]), "value must match"
    assert untolerated([gpu], [Toleration("nvidia.com/gpu", "Exists", effect="NoExecute")]), "effect must match"
    assert not untolerated([gpu], [Toleration(operator="Exists")]), "empty key with Exists tolerates everything"
    assert not untolerated([Taint("x", "", "PreferNoSchedule")], []), "PreferNoSchedule is only a preference"


def test_a_new_gang_is_not_placed_on_nodes_tainted_against_it_and_a_tolerating_one_is():
    cluster = FakeCluster("nvl72", 2)
    dedicated = Taint("dedicated", "inference", "NoSchedule")
    for node in rack(cluster, "nvl72-0000"):
        taint(cluster, node, dedicated)
    tolerating = {"spec": {**TEMPLATE["spec"], "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}
    # Four gangs of 4 nodes: rack 1 (18 nodes) holds four, so nothing needs rack 0 but the tolerating one.
    for name in ("a", "b", "c", "d"):
        cluster.add("TrainingJob", "ml", name, SPEC)
    cluster.add("TrainingJob", "ml", "tolerant", {**SPEC, "template": tolerating, "priority": 0})
    cluster.add("TrainingJob", "ml", "late", SPEC)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller, cycles=4)
    tainted = set(rack(cluster, "nvl72-0000"))
    for name in ("a", "b", "c", "d"):
        assert cluster.status("TrainingJob", "ml", name)["phase"] == "Running"
        assert not placed_nodes(cluster, name) & tainted, f"{name} placed on a node whose taint it does not tolerate"
    assert cluster.status("TrainingJob", "ml", "tolerant")["phase"] == "Running"
    assert placed_nodes(cluster, "tolerant") <= tainted, "rack 1 is full: the tolerating gang gets rack 0"
    late = cluster.status("TrainingJob", "ml", "late")
    assert late["phase"] == "Pending" and "placement" not in late, "14 tainted nodes are free, none for it"


def test_a_group_whose_pod_a_no_execute_taint_evicted_is_not_placed_again_on_tainted_nodes():
    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", SPEC)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    group = cluster.status("TrainingJob", "ml", "job")["placement"][0]
    evicted = group["nodes"][0]
    # The taint manager evicts the pod from the NoExecute node; every other free node of the rack
    # but one is closed to new pods, so the only way to stay on the rack avoids them all.
    taint(cluster, evicted, Taint("maintenance", "", "NoExecute"))
    others = [n for n in rack(cluster, group["supernode"]) if n not in group["nodes"]]
    for node in others[1:]:
        taint(cluster, node, Taint("maintenance", "", "NoSchedule"))
    pod = cluster.pods[("ml", "job-0")]
    cluster.pods[("ml", "job-0")] = {**pod, "status": {"phase": "Failed", "reason": "Evicted"}}
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert set(status["placement"][0]["nodes"]) == {*group["nodes"][1:], others[0]}
    assert evicted not in {p["spec"]["nodeName"] for p in cluster.pods_of("tidal.dev/job", "job")}


# -- C: fencing -----------------------------------------------------------------------------------


class Kubelets(FakeCluster):
    """Deletes as the API server does them: a pod bound to a node is removed only once its kubelet
    confirms (a Ready node's does at once), or at once if forced (grace 0). A NotReady node's pods
    stay Terminating. `gc()` is the pod garbage collector: it removes terminating pods of nodes
    that are gone or carry the out-of-service taint."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.graces: list[tuple[str, int | None]] = []

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        self.graces.append((name, grace_seconds))
        pod = self.pods.get((namespace, name))
        node: NodeView | None = self.nodes.get((pod or {}).get("spec", {}).get("nodeName") or "")
        if pod is None or grace_seconds == 0 or node is None or node.ready:
            super().delete_pod(namespace, name, grace_seconds)
            return
        self._log("delete_pod_graceful", name)
        self.pods[(namespace, name)] = {
            **pod,
            "metadata": {**pod["metadata"], "deletionTimestamp": "2026-05-01T00:00:00Z"},
        }

    def gc(self) -> None:
        for key, pod in list(self.pods.items()):
            node = self.nodes.get(pod["spec"].get("nodeName") or "")
            fenced = node is None or any(t.key == "node.kubernetes.io/out-of-service" for t in node.taints)
            if pod["metadata"].get("deletionTimestamp") and fenced:
                del self.pods[key]


def test_pods_of_a_not_ready_node_are_not_force_deleted_and_their_group_waits_for_the_fence():
    cluster = Kubelets("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", SPEC)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    lost = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)  # partitioned, maybe running
    cluster.calls.clear()
    run(cluster, controller, cycles=6)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Restarting" and lost not in status["placement"][0]["nodes"]
    assert ("job-0", 0) not in cluster.graces, "never forced while its node might still run it"
    assert cluster.pods[("ml", "job-0")]["spec"]["nodeName"] == lost, "the old pod stays until confirmed"
    assert not [c for c in cluster.calls if c == ("create_pod", "job-0")], "no second copy of rank 0"
    deletes = [c for c in cluster.calls if c[0].startswith("delete_pod")]
    assert len(deletes) == 4, f"each pod of the group deleted once, no retry loop: {deletes}"

    # The admin fences the node (non-graceful node shutdown); the pod GC removes its pods.
    taint(cluster, lost, Taint("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute"))
    cluster.gc()
    run(cluster, controller, cycles=3)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert cluster.pods[("ml", "job-0")]["spec"]["nodeName"] in status["placement"][0]["nodes"]


def test_pods_of_a_deleted_or_fenced_node_are_force_deleted():
    cluster = Kubelets("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {**SPEC, "dp": 2})
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    placement = cluster.status("TrainingJob", "ml", "job")["placement"]
    gone, fenced = placement[0]["nodes"][0], placement[1]["nodes"][0]
    del cluster.nodes[gone]
    cluster.nodes[fenced] = dataclasses.replace(cluster.nodes[fenced], ready=False)
    taint(cluster, fenced, Taint("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute"))
    run(cluster, controller, cycles=4)
    assert ("job-0", 0) in cluster.graces and ("job-4", 0) in cluster.graces
    assert cluster.status("TrainingJob", "ml", "job")["phase"] == "Running"
