"""The floor a gang's start is measured against: what the API server and KWOK allow on this machine.

`bench.operator` times a gang from submit to every pod Running. Most of that is API work any
operator pays, so the figure means little alone (issue 36): this module creates the same pods the
cheapest way there is (copies of the gang's own pods, same bodies, with nodeName set, so no
scheduler and no binding, and no scheduling gates, so no second write; raw JSON, no client models)
over as many connections and worker threads as the operator uses, and times them from the first
create to the last of them Running, with a watch opened before the first create. The copies go to
a namespace of their own per run, without owner references or tidal's labels, once the operator
is stopped; KWOK books nothing, so they may share the gang's nodes.

The API server's own counts (`apiserver_request_total`, read through `kubectl get --raw
/metrics`) give the writes per pod of both runs, by verb and subresource, kubelet (KWOK) status
writes left out: they are the same for any operator.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s
from tests.cluster.kube import Kube, eventually

from bench.operator_profile import Watch, pod_stages
from tidal.k8s.api import load_client

NAMESPACE = "bench-floor"
"""The prefix of each run's namespace."""
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
        if verb in ("POST", "PATCH", "PUT", "APPLY", "DELETE", "DELETECOLLECTION") and sub != "status":
            out[f"{verb} {sub}".strip()] += int(float(line.split()[-1]))
    return out


def writes_between(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    return {key: grown for key in sorted(after) if (grown := after[key] - before.get(key, 0))}


SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "ownerReferences")


def copies_of(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gang's pods as the floor creates them: same bodies, each on its own node by nodeName,
    without gates, status, server-set fields, owner references (an owner in another namespace
    would have them collected) or tidal's labels (no tidal controller may take them for its own)."""
    out = []
    for index, pod in enumerate(pods):
        body = copy.deepcopy(pod)
        body.pop("status", None)
        meta = body["metadata"]
        for key in SERVER_SET:
            meta.pop(key, None)
        meta["name"] = f"floor-{index}"
        meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if not k.startswith("tidal.dev/")}
        meta["labels"]["bench"] = "floor"
        spec = body["spec"]
        spec.pop("schedulingGates", None)
        spec["nodeName"] = pod["spec"]["nodeName"]
        out.append(body)
    return out


def bare_pods(nodes: list[str]) -> list[dict[str, Any]]:
    """Small pods, one per entry of `nodes`: the floor on a cluster without a gang to copy."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"floor-{index}", "labels": {"bench": "floor"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "floor:latest"}]},
        }
        for index, node in enumerate(nodes)
    ]


def floor_running(kube: Kube, pods: list[dict[str, Any]], timeout: float = 900.0, keep: bool = False) -> dict[str, Any]:
    """`pods` (each with spec.nodeName) created in a new namespace of this run's own, timed from the
    first create to the last of them Running; unless `keep`, the namespace is deleted after (not
    waited for)."""
    namespace = f"{NAMESPACE}-{secrets.token_hex(3)}"
    kube.run("create", "namespace", namespace)
    # Pods are refused until the namespace's default ServiceAccount exists (a controller makes it).
    eventually(
        lambda: kube.run("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=60,
        what=f"the default ServiceAccount of {namespace}",
    )
    api = k8s.CoreV1Api(load_client(str(kube.kubeconfig), pool_size=CONNECTIONS))
    watch = Watch(api.list_namespaced_pod, pod_stages, namespace=namespace).start()
    writes_before = pod_writes(kube)
    bodies = [{**body, "metadata": {**body["metadata"], "namespace": namespace}} for body in pods]
    names = [body["metadata"]["name"] for body in bodies]

    def create(body: dict[str, Any]) -> None:
        # Raw JSON back, as the bench's watches: the client's models would load the cores.
        api.create_namespaced_pod(namespace, body, _preload_content=False).data  # noqa: B018 (read: frees the connection)

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(WORKER_THREADS) as pool:
            list(pool.map(create, bodies))
        created = time.monotonic() - t0
        watch.wait(
            lambda latest: all("running" in latest.get(name, ()) for name in names), timeout, "the floor's pods Running"
        )
        running = max(watch.first[name]["running"] for name in names) - t0
    finally:
        watch.stop()
    writes = writes_between(writes_before, pod_writes(kube))
    if not keep:
        kube.run("delete", "namespace", namespace, "--wait=false", check=False)
    return {
        "floor_namespace": namespace,
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
    print(json.dumps(floor_running(kube, bare_pods([names[i % len(names)] for i in range(args.pods)]))))


if __name__ == "__main__":
    main()
