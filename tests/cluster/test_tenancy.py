"""Tenancy on the KWOK cluster (issue 13): what one namespace can do to another through tidal."""

from __future__ import annotations

import time

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import assert_gangs_sound, job, pods_of, status, submit, wait_phase

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


def test_priority_comes_from_the_priority_class_never_the_spec_integer(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    # Tenant a's preemptible work on every rack (64 of 72 GPUs each), at class tidal-batch (1).
    submit(
        kube,
        namespace,
        job("victim", tp=4, ep=16, pp=1, dp=8, priorityClassName="tidal-batch", preemptible=True),
    )
    wait_phase(kube, namespace, "victim", "Running", timeout=120)
    pods = pods_of(kube, namespace, "victim")
    assert {p["spec"]["priorityClassName"] for p in pods} == {"tidal-batch"}
    assert {p["spec"]["priority"] for p in pods} == {1}, "the API server resolved the class on the pods"

    # A tenant that writes a huge integer and no class gets the default (0): it preempts nobody.
    submit(kube, namespace, job("bully", tp=4, ep=16, pp=1, dp=1, priority=1_000_000))
    # A class that does not exist: Pending, the field named, nothing created.
    submit(kube, namespace, job("unknown", tp=4, ep=1, pp=1, dp=1, priorityClassName="tidal-nope"))
    st = eventually(
        lambda: (s := status(kube, namespace, "unknown")).get("conditions") and s,
        timeout=30,
        what="unknown's status",
    )
    cond = {c["type"]: c for c in st["conditions"]}["Schedulable"]
    assert (st["phase"], cond["status"], cond["reason"]) == ("Pending", "False", "UnknownPriorityClass")
    assert cond["message"] == "spec.priorityClassName: PriorityClass 'tidal-nope' not found"
    assert pods_of(kube, namespace, "unknown") == []
    eventually(lambda: status(kube, namespace, "bully").get("conditions"), timeout=30, what="bully's status")
    time.sleep(3)  # a preemption would have been started by now
    victim = kube.get("trainingjob", "victim", "-n", namespace)
    assert "tidal.dev/checkpoint-requested" not in victim["metadata"].get("annotations", {})
    assert not victim["status"].get("eviction") and status(kube, namespace, "bully")["phase"] == "Pending"
    assert_gangs_sound(kube)


def test_namespace_gpu_quota_is_enforced_for_the_whole_gang_before_any_pod(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": "80"}},
        }
    )
    submit(kube, namespace, job("first", tp=4, ep=16, pp=1, dp=1))  # 64 GPUs
    wait_phase(kube, namespace, "first", "Running")
    # 32 more would make 96 > 80: the API server would take 4 of its 8 pods and refuse the rest.
    submit(kube, namespace, job("second", tp=4, ep=4, pp=1, dp=2))
    st = eventually(
        lambda: (s := status(kube, namespace, "second")).get("conditions") and s,
        timeout=30,
        what="second's status",
    )
    cond = {c["type"]: c for c in st["conditions"]}["Schedulable"]
    assert (st["phase"], cond["reason"]) == ("Pending", "QuotaExceeded"), st
    assert cond["message"] == (
        f"ResourceQuota {namespace}/gpus: requests.nvidia.com/gpu 64 of 80 in use, 16 left; this needs 32"
    )
    assert f"ResourceQuota {namespace}/gpus" in kube.run("get", "tj", "second", "-n", namespace).stdout
    time.sleep(2)
    assert pods_of(kube, namespace, "second") == [], "nothing half-created"
    # Room in the namespace again: it is admitted whole.
    kube.run("delete", "trainingjob", "first", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_phase(kube, namespace, "second", "Running", timeout=90)
    assert len(pods_of(kube, namespace, "second")) == 8
    assert_gangs_sound(kube)


def test_a_job_over_its_namespaces_quota_preempts_its_namespaces_lower_work_checkpoint_first(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    """The real API server enforces the quota: had tidal made the high job's pods before the low
    job's were gone, the API server would have refused some of them (a half-made gang)."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": "80"}},
        }
    )
    low = job("low", tp=4, ep=16, pp=1, dp=1, priorityClassName="tidal-batch", preemptible=True)
    low["spec"]["checkpoint"] = {"gracePeriodSeconds": 600}
    submit(kube, namespace, low)
    wait_phase(kube, namespace, "low", "Running")
    submit(kube, namespace, job("high", tp=4, ep=4, pp=1, dp=2, priorityClassName="tidal-training"))
    eviction = eventually(
        lambda: status(kube, namespace, "low").get("eviction"), timeout=30, what="low asked to checkpoint"
    )
    assert eviction["by"] == f"{namespace}/high (priority 100, over the quota of {namespace})", eviction
    st = status(kube, namespace, "high")
    assert st["phase"] == "Pending" and st["reason"].startswith("waiting for 1 preempted job(s)"), st
    assert pods_of(kube, namespace, "high") == [], "nothing made while the quota is still in use"
    kube.run("annotate", "-n", namespace, "trainingjob", "low", f"tidal.dev/checkpoint-done={eviction['requestedAt']}")
    wait_phase(kube, namespace, "high", "Running", timeout=120)
    assert len(pods_of(kube, namespace, "high")) == 8
    # While low's pods terminated and the quota's status.used still counted them, high kept
    # waiting for its victim with its nodes held: it never fell back to QuotaExceeded.
    events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=high")["items"]
    assert not [e for e in events if e["reason"] == "QuotaExceeded"], [e["message"] for e in events]
    assert any(e["reason"] == "WaitingForPreemption" for e in events), [e["reason"] for e in events]
    low_status = status(kube, namespace, "low")
    cond = {c["type"]: c for c in low_status["conditions"]}["Schedulable"]
    assert (low_status["phase"], cond["reason"]) == ("Pending", "QuotaExceeded"), low_status
    assert pods_of(kube, namespace, "low") == []
    assert_gangs_sound(kube)
