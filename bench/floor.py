"""The floor a gang's start is measured against: what the API server and KWOK allow on this machine.

`bench.operator` times a gang from submit to every pod Running. Most of that is API work any
operator pays, so the figure means little alone (issue 36): this module creates the same number
of pods the cheapest way there is (nodeName set, so no scheduler and no binding; no scheduling
gates, so no second write; raw JSON, no client models) over as many connections and worker
threads as the operator uses, and times them from the first create to the last pod Running, with
a watch opened before the first create. Pods request nothing, so the floor's pods may share the
gang's nodes (and a stopped operator's view) without booking a GPU.

The API server's own counts (`apiserver_request_total`, read through `kubectl get --raw
/metrics`) give the writes per pod of both runs, by verb and subresource, kubelet (KWOK) status
writes left out: they are the same for any operator.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from tests.cluster.kube import Kube

from bench.operator_profile import Watch, pod_stages
from tidal.k8s.api import load_client

NAMESPACE = "bench-floor"
WORKER_THREADS = 16
"""The operator's API worker threads (k8s/write.py); its pool has 32 connections."""
CONNECTIONS = 32
_LABELS = re.compile(r'(\w+)="([^"]*)"')


def pod_writes(kube: Kube) -> Counter[str]:
    """Writes to pods the API server has served since it started, keyed "VERB subresource"
    ("POST" alone for a create); status writes (the kubelet's, KWOK's here) are left out."""
    text = kube.run("get", "--raw", "/metrics").stdout
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or 'resource="pods"' not in line:
            continue
        labels = dict(_LABELS.findall(line[: line.rindex("}")]))
        verb, sub = labels.get("verb", ""), labels.get("subresource", "")
        if verb in ("POST", "PATCH", "PUT", "DELETE") and sub != "status":
            out[f"{verb} {sub}".strip()] += int(float(line.split()[-1]))
    return out


def writes_between(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in sorted(after) if after[key] - before.get(key, 0)}


def floor_pod(index: int, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"floor-{index}", "namespace": NAMESPACE, "labels": {"bench": "floor"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "floor:latest"}],
            # The gang's pods tolerate everything on a lost node too; the floor's need only stay.
            "tolerations": [{"operator": "Exists"}],
        },
    }


def floor_running(kube: Kube, nodes: list[str], timeout: float = 900.0, keep: bool = False) -> dict[str, Any]:
    """One pod per entry of `nodes` (repeat a node to put several there), created with nodeName,
    timed to all Running; the namespace is made first and, unless `keep`, deleted after (not
    waited for)."""
    kube.run("create", "namespace", NAMESPACE, check=False)
    api = k8s.CoreV1Api(load_client(str(kube.kubeconfig), pool_size=CONNECTIONS))
    watch = Watch(api.list_namespaced_pod, pod_stages, namespace=NAMESPACE).start()
    writes_before = pod_writes(kube)
    bodies = [floor_pod(i, node) for i, node in enumerate(nodes)]

    def create(body: dict[str, Any]) -> None:
        # Raw JSON back, as the bench's watches: the client's models would load the cores.
        api.create_namespaced_pod(NAMESPACE, body, _preload_content=False).data  # noqa: B018 (read: frees the connection)

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(WORKER_THREADS) as pool:
            list(pool.map(create, bodies))
        created = time.monotonic() - t0
        running = (
            watch.wait(
                lambda latest: sum("running" in stages for stages in latest.values()) >= len(bodies),
                timeout,
                "the floor's pods Running",
            )
            - t0
        )
    finally:
        watch.stop()
    writes = writes_between(writes_before, pod_writes(kube))
    if not keep:
        kube.run("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    return {
        "floor_pods": len(bodies),
        "floor_created_s": round(created, 3),
        "floor_running_s": round(running, 3),
        "floor_api_writes": writes,
        "floor_api_writes_per_pod": round(sum(writes.values()) / max(len(bodies), 1), 2),
        "floor_client": f"{WORKER_THREADS} threads, {CONNECTIONS} connections, raw JSON",
    }


def main() -> None:
    """`python -m bench.floor --kubeconfig PATH --pods N`: the floor alone, on a running cluster."""
    import argparse
    from pathlib import Path

    from tests.cluster.kube import bin_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--pods", type=int, default=256)
    args = parser.parse_args()
    kube = Kube(args.kubeconfig, bin_dir())
    names = [n["metadata"]["name"] for n in kube.get("nodes")["items"]]
    print(json.dumps(floor_running(kube, [names[i % len(names)] for i in range(args.pods)])))


if __name__ == "__main__":
    main()
