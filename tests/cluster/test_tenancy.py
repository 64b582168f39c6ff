"""Tenancy on the KWOK cluster (issue 13): what one namespace can do to another through tidal."""

from __future__ import annotations

import time

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import assert_gangs_sound, job, pods_of, status, submit

GPU = "nvidia.com/gpu"
RACK = "nvl72-0000"


def foreign_pod(name: str, node: str, pod_labels: dict[str, str]) -> dict:
    """A tenant's own GPU pod bound straight to a node (no tidal owner), wearing tidal's labels."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {GPU: "4"}, "limits": {GPU: "4"}}}
            ],
        },
    }


def test_labelled_foreign_pods_gpus_are_counted_as_used(kube: Kube, running_operator: OperatorProcess, namespace: str):
    # 12 of rack 0's 72 GPUs held by pods that claim, by label only, to be tidal's.
    foreign = [
        foreign_pod("fake-job-0", f"{RACK}-n00", {"tidal.dev/job": "x", "tidal.dev/hbd-group": "0"}),
        foreign_pod("fake-job-1", f"{RACK}-n01", {"tidal.dev/job": "x"}),
        foreign_pod("fake-pool-0", f"{RACK}-n02", {"tidal.dev/pool": "x"}),
    ]
    for pod in foreign:
        pod["metadata"]["namespace"] = namespace
    kube.apply(*foreign)
    eventually(
        lambda: all(p["status"].get("phase") == "Running" for p in kube.get("pods", "-n", namespace)["items"]),
        timeout=60,
        what="foreign pods Running",
    )
    # The operator sees them as GPUs in use on the rack...
    eventually(
        lambda: kube.get("supernode", RACK).get("status", {}).get("gpus", {}).get("free") == 60,
        timeout=60,
        what=f"{RACK} showing 60 free GPUs",
    )
    # ...so a gang needing 64 GPUs on every rack must wait, never be pinned onto their GPUs.
    submit(kube, namespace, job("all-racks", tp=4, ep=16, pp=1, dp=8))
    st = eventually(
        lambda: (s := status(kube, namespace, "all-racks")).get("conditions") and s,
        timeout=30,
        what="all-racks status",
    )
    time.sleep(3)  # a wrong admission would have been made by now (cycles run every second)
    st = status(kube, namespace, "all-racks")
    assert st["phase"] == "Pending", st
    cond = {c["type"]: c for c in st["conditions"]}["Schedulable"]
    assert cond["status"] == "False", cond
    assert pods_of(kube, namespace, "all-racks") == []
    assert_gangs_sound(kube)
