"""Node loss to Running on a real API server with KWOK nodes (issue 34).

    python -m bench.recovery [--json] [--nodes 1008] [--gang-pods 256] [--keep]

Brings up its own cluster (e2e/cluster.sh, the name bench.operator uses: --nodes rounded up to
NVL72 racks of 18 nodes, 4 GPUs each), starts `tidal run`, and for each scenario submits one job,
times it to Running (the floor: what a fresh start of the same job costs in the same run), takes
a node of its pods away and times the job back to Running:

- `group_deleted`: two 64-GPU HBD groups (tp=8, ep=8, 16 pods each), restart scope Group; the Node
  object of a pod of group 1 is deleted (`kubectl delete node`): group 1 is placed again.
- `gang_deleted`: a 1,024-GPU gang (tp=8, ep=8, pp=4, dp=--gang-pods/64), scope Gang; one of its
  nodes deleted: the whole gang is placed again.
- `group_fenced`, `gang_fenced`: the same, the node cut off from KWOK (its Lease taken, reported
  NotReady: tests/cluster/test_fencing.py's partition) and then tainted
  `node.kubernetes.io/out-of-service`; timed from the taint.

Each figure: `fresh_start_s` (submit to Running), `lost_to_replaced_s` (the loss to the lost rank's
new pod), `lost_to_running_s` (the loss to the job Running with every pod Running off that node),
and `ratio` = lost_to_running_s / fresh_start_s. Before the fix of issue 34 a deleted node's pod
waited for the pod GC's 40 s quarantine (`lost_to_replaced_s` 44-52 s at 144 nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from tests.cluster.kube import E2E, Kube, eventually
from tests.cluster.operator_process import OperatorProcess, free_port
from tests.cluster.test_fencing import OUT_OF_SERVICE, heal, partition

from bench.operator import CLUSTER, NODES_PER_RACK, TEMPLATE, bench_cluster
from tidal.k8s.api import load_client
from tidal.k8s.labels import JOB

NAMESPACE = "bench-recovery"


def job(name: str, tp: int, ep: int, pp: int, dp: int, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "tp": tp,
            "ep": ep,
            "pp": pp,
            "dp": dp,
            "gpusPerPod": 4,
            "restartPolicy": {"scope": scope},
            "template": TEMPLATE,
        },
    }


class Cluster:
    """The objects a scenario reads, through one client (kubectl per poll would cost more than it times)."""

    def __init__(self, kube: Kube, fleet: set[str]):
        self.kube, self.fleet = kube, fleet
        api = load_client(str(kube.kubeconfig), pool_size=4)
        self.core, self.custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)

    def pods(self, name: str) -> list[Any]:
        return self.core.list_namespaced_pod(NAMESPACE, label_selector=f"{JOB}={name}").items

    def phase(self, name: str) -> str | None:
        body = self.custom.get_namespaced_custom_object("tidal.dev", "v1alpha1", NAMESPACE, "trainingjobs", name)
        return (body.get("status") or {}).get("phase")

    def settled(self) -> bool:
        """The fleet's nodes all back and Ready, none fenced, and no pod of the bench left (other
        nodes and other taints a cluster may have are not the bench's business)."""
        nodes = [n for n in self.core.list_node().items if n.metadata.name in self.fleet]
        ready = all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            and not any(t.key == OUT_OF_SERVICE for t in n.spec.taints or [])
            for n in nodes
        )
        return ready and len(nodes) == len(self.fleet) and not self.core.list_namespaced_pod(NAMESPACE).items

    def running(self, name: str, pods: int, off: str | None = None) -> bool:
        found = self.pods(name)
        return (
            len(found) == pods
            and all(p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in found)
            and all(p.spec.node_name != off for p in found)
            and self.phase(name) == "Running"
        )


def poll(check: Callable[[], Any], timeout: float, what: str) -> float:
    """When `check` first held (time.monotonic), polled every 0.1 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def scenario(cluster: Cluster, name: str, body: dict[str, Any], fenced: bool, restore: Callable[[str], None]) -> dict:
    spec = body["spec"]
    pods = spec["tp"] * spec["ep"] * spec["pp"] * spec["dp"] // spec["gpusPerPod"]
    kube = cluster.kube
    # The cluster whole again first (the last scenario's node back and Ready, its job's pods
    # gone): a fresh start that waits for GPUs would not be the floor.
    poll(cluster.settled, 600, "every node Ready and no pod left")
    t0 = time.monotonic()
    kube.apply(body)
    fresh = poll(lambda: cluster.running(name, pods), 600, f"{name} Running") - t0
    by_rank = {p.metadata.name: p for p in cluster.pods(name)}
    victim = by_rank[f"{name}-{pods - 1}"]  # a pod of the last group
    node, uid = victim.spec.node_name, victim.metadata.uid
    try:
        if fenced:
            partition(kube, node)
            lost = time.monotonic()
            kube.run("taint", "node", node, f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute")
        else:
            lost = time.monotonic()
            kube.run("delete", "node", node)

        def replaced() -> bool:
            return any(p.metadata.name == victim.metadata.name and p.metadata.uid != uid for p in cluster.pods(name))

        replaced_at = poll(replaced, 600, f"{name}'s lost rank made again")
        running_at = poll(lambda: cluster.running(name, pods, off=node), 600, f"{name} Running again")
    finally:
        restore(node)
        kube.run("delete", "trainingjob", name, "-n", NAMESPACE, "--wait=true", "--timeout=300s", check=False)
    return {
        "pods": pods,
        "gpus": pods * spec["gpusPerPod"],
        "fresh_start_s": round(fresh, 2),
        "lost_to_replaced_s": round(replaced_at - lost, 2),
        "lost_to_running_s": round(running_at - lost, 2),
        "ratio": round((running_at - lost) / fresh, 2),
    }


def scenarios(gang_pods: int) -> dict[str, tuple[dict[str, Any], bool]]:
    group = ("recovery-group", 8, 8, 1, 2, "Group")
    gang = ("recovery-gang", 8, 8, 4, gang_pods // 64, "Gang")
    return {
        "group_deleted": (job(*group), False),
        "gang_deleted": (job(*gang), False),
        "group_fenced": (job(*group), True),
        "gang_fenced": (job(*gang), True),
    }


def run_on(kube: Kube, supernodes: int, gang_pods: int) -> dict[str, dict]:
    """Every scenario on a cluster that is up with the operator running."""
    kube.run("create", "namespace", NAMESPACE, check=False)
    fleet = subprocess.run(
        [sys.executable, "-m", "tidal", "fleet", "--shape", "nvl72", "--supernodes", str(supernodes)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(fleet) if d and d.get("kind") == "Node"}
    cluster = Cluster(kube, names)

    def restore(node: str) -> None:
        """A deleted node made again (from the fleet's manifests), a fenced one healed."""
        if kube.run("get", "node", node, check=False).returncode:
            kube.run("apply", "--server-side", "--force-conflicts", "-f", "-", input=fleet)
        heal(kube, node)

    results = {}
    for key, (body, fenced) in scenarios(gang_pods).items():
        results[key] = scenario(cluster, body["metadata"]["name"], body, fenced, restore)
    return results


def run(nodes: int, gang_pods: int, keep: bool) -> dict[str, Any]:
    if gang_pods % 64:
        raise ValueError("--gang-pods must be a multiple of 64 (tp=8, ep=8, pp=4 at 4 GPUs a pod)")
    supernodes = -(-nodes // NODES_PER_RACK)
    env = {**os.environ, "TIDAL_CLUSTER_NAME": CLUSTER}
    kube = bench_cluster(supernodes, env)
    op = OperatorProcess(
        kube.kubeconfig,
        Path(tempfile.mkdtemp(prefix="tidal-recovery-")),
        "--discover-supernodes",
        "tidal.dev/supernode",
        "--metrics-port",
        str(free_port()),
    )
    op.start()
    try:
        eventually(
            lambda: sum(1 for s in kube.get("supernodes")["items"] if s.get("status", {}).get("gpus")) == supernodes,
            timeout=180,
            what="supernode status",
        )
        results = run_on(kube, supernodes, gang_pods)
    finally:
        op.stop()
        if not keep:
            subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, check=False, capture_output=True)
    return {"nodes": supernodes * NODES_PER_RACK, "gpus": supernodes * NODES_PER_RACK * 4, "scenarios": results}


def table(result: dict[str, Any]) -> str:
    rows = [
        f"{'scenario':<14} {'GPUs':>6} {'fresh start s':>14} {'to new pod s':>13} {'to Running s':>13} {'ratio':>6}"
    ]
    for key, r in result["scenarios"].items():
        rows.append(
            f"{key:<14} {r['gpus']:>6} {r['fresh_start_s']:>14} {r['lost_to_replaced_s']:>13}"
            f" {r['lost_to_running_s']:>13} {r['ratio']:>6}"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=1008, help="rounded up to NVL72 racks of 18 nodes")
    parser.add_argument("--gang-pods", type=int, default=256, help="pods of the gang (4 GPUs each; 64 x k)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    result = run(args.nodes, args.gang_pods, args.keep)
    print(table(result), file=sys.stderr)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
