"""Fencing on the real cluster: a pod on a NotReady node is never force-deleted while the node
might still run it, so no rank ever runs twice; the out-of-service taint is what lets it go.

The partition is real as far as the API server can tell: the test marks the node and its pods
with KWOK's opt-out annotation (e2e/cluster.sh starts KWOK with it, so KWOK stops acting as
their kubelet: no status, nothing confirms a pod's deletion), takes the node's Lease (no
heartbeat) and reports the node NotReady, as a kubelet cut off from its GPUs or a split network
would. Taking the Lease alone was not enough: KWOK, mid-way through its own work, sometimes still
finished a deletion on the node a second after the Lease changed hands."""

from __future__ import annotations

import datetime as dt
import json
import time

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import assert_gangs_sound, job, node_supernodes, pods_of, status, submit, wait_phase

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


KWOK_IGNORE = "test.tidal.dev/kwok-ignore"
"""KWOK leaves nodes and pods with this annotation set to "true" alone (e2e/cluster.sh sets it up)."""
PARTITIONED_AT = "test.tidal.dev/partitioned-at"
"""Set on the node when the test cuts it off: a change KWOK sees, so it re-queues its heartbeat."""


def _ready(kube: Kube, node: str) -> bool:
    conditions = kube.get("node", node)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _kwok_honours_the_opt_out(kube: Kube) -> bool:
    config = kube.kubeconfig.parent / "kwok.yaml"  # kwokctl's record of how it started KWOK
    return config.exists() and f"--disregard-status-with-annotation-selector={KWOK_IGNORE}=true" in config.read_text()


def _on(node: str) -> tuple[str, ...]:
    """kubectl arguments that select every pod bound to the node."""
    return ("--all-namespaces", "--field-selector", f"spec.nodeName={node}")


def partition(kube: Kube, node: str) -> None:
    """KWOK stops acting for the node and its pods; the node has no heartbeat and says NotReady."""
    # KWOK keeps a heartbeat for every Ready node queued 600-610 s ahead, and plays it even once
    # the node is ignored (it would make the node Ready again). A change it still sees replaces
    # that job with one due 600 s from now, after this test is over.
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    kube.run("annotate", "node", node, f"{PARTITIONED_AT}={now}", "--overwrite")
    # Pods first: once the node is NotReady the operator may delete them at any moment, and KWOK
    # must already be ignoring them when it sees that deletion.
    kube.run("annotate", "pods", *_on(node), f"{KWOK_IGNORE}=true", "--overwrite")
    kube.run("annotate", "node", node, f"{KWOK_IGNORE}=true", "--overwrite")
    lease = {"spec": {"holderIdentity": "tidal-test-partition", "leaseDurationSeconds": 3600, "renewTime": now}}
    kube.run("patch", "lease", "-n", "kube-node-lease", node, "--type=merge", "-p", _json(lease))
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}
    kube.run("patch", "node", node, "--subresource=status", "--type=strategic", "-p", _json(not_ready))
    time.sleep(3)  # had KWOK still acted for the node, it would have made it Ready again by now
    assert not _ready(kube, node), f"KWOK still acts for {node} after the opt-out"


def heal(kube: Kube, node: str) -> None:
    """Give the node back to KWOK: it makes a new Lease and reports the node Ready again."""
    kube.run("taint", "node", node, f"{OUT_OF_SERVICE}-", check=False)
    kube.run("annotate", "pods", *_on(node), f"{KWOK_IGNORE}-", check=False)
    kube.run("annotate", "node", node, f"{KWOK_IGNORE}-", f"{PARTITIONED_AT}-", check=False)
    kube.run("delete", "lease", "-n", "kube-node-lease", node, check=False)
    eventually(
        lambda: _ready(kube, node) and not kube.get("node", node)["spec"].get("taints"),
        timeout=120,
        interval=1,
        what=f"{node} Ready and untainted again",
    )


def _json(body: dict) -> str:
    return json.dumps(body)


def test_a_pod_on_a_not_ready_node_is_replaced_only_after_the_node_is_fenced(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    assert _kwok_honours_the_opt_out(kube), (
        f"this cluster's KWOK was started without the {KWOK_IGNORE} opt-out (an older e2e/cluster.sh): "
        "remove it with `e2e/cluster.sh down --name <cluster>` and run again"
    )
    submit(kube, namespace, job("fenced", tp=4, ep=4, pp=2, dp=1, restartPolicy={"scope": "Group"}))
    wait_phase(kube, namespace, "fenced", "Running")
    victim = "fenced-5"  # a pod of group 1
    node = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, "fenced")}[victim]
    try:
        partition(kube, node)

        def the_pod() -> dict | None:
            found = [p for p in pods_of(kube, namespace, "fenced") if p["metadata"]["name"] == victim]
            return found[0] if found else None

        # The operator sees the node NotReady and deletes the pod, with a grace period: the
        # deletion waits for a kubelet that may still be running the rank.
        eventually(
            lambda: (p := the_pod()) is None or p["metadata"].get("deletionTimestamp") or p["spec"]["nodeName"] != node,
            timeout=90,
            what=f"{victim} deleted by the operator",
        )
        time.sleep(20)  # several operator cycles: a force delete would have removed it by now
        assert not _ready(kube, node), f"{node} became Ready during the partition: the test lost its partition"
        pod = the_pod()
        assert pod is not None, f"{victim} was force-deleted from a merely NotReady node: the rank may run twice"
        assert pod["spec"]["nodeName"] == node, "a second copy of the rank was made elsewhere"
        assert pod["metadata"].get("deletionTimestamp")
        assert len(pods_of(kube, namespace, "fenced")) == 8

        # The admin knows the node is down: the out-of-service taint fences it.
        kube.run("taint", "node", node, f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute")
        eventually(
            lambda: (
                (p := the_pod()) is not None
                and not p["metadata"].get("deletionTimestamp")
                and p["spec"].get("nodeName") not in (None, node)
                and p["status"].get("phase") == "Running"
            ),
            timeout=120,
            what=f"{victim} made again on another node and Running",
        )
        wait_phase(kube, namespace, "fenced", "Running", timeout=60)
        after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, "fenced")}
        assert len(after) == 8 and node not in after.values()
        where = node_supernodes(kube)
        assert len({where[after[f"fenced-{i}"]] for i in range(4, 8)}) == 1, "group 1 split across racks"
        events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=fenced")["items"]
        assert any(e["reason"] == "Restarting" and node in e["message"] for e in events), "group 1 was restarted"
        assert status(kube, namespace, "fenced").get("restarts", 0) == 0, "a NotReady node is not charged"
        assert_gangs_sound(kube)
    finally:
        heal(kube, node)
