"""Day/night rebalancing on the KWOK cluster with the operator's clock under the test's control."""

from __future__ import annotations

import datetime as dt
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import TEMPLATE, assert_gangs_sound, job, pods_of, status, submit, wait_phase


def pool(name: str, **spec) -> dict:
    body = {
        "minReplicas": 0,
        "maxReplicas": 20,
        "tp": 8,
        "gpusPerPod": 4,
        "priorityClassName": "tidal-serving",
        "template": TEMPLATE,
    }
    body.update(spec)
    return {"apiVersion": "tidal.dev/v1alpha1", "kind": "InferencePool", "metadata": {"name": name}, "spec": body}


def pool_status(kube: Kube, namespace: str, name: str) -> dict:
    return kube.get("inferencepool", name, "-n", namespace).get("status", {})


def set_clock(op: OperatorProcess, hhmm: str) -> None:
    """Move the operator's clock (atomically: a half-written file would read as wall time)."""
    h, m = map(int, hhmm.split(":"))
    tmp = op.clock_file.with_suffix(".tmp")
    tmp.write_text(dt.datetime(2026, 5, 1, h, m, tzinfo=dt.UTC).isoformat())
    tmp.replace(op.clock_file)


@pytest.fixture
def controlled_clock(running_operator: OperatorProcess):
    yield running_operator
    running_operator.clock_file.unlink(missing_ok=True)


def scrape(op: OperatorProcess) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def pool_groups_whole(kube: Kube, namespace: str, name: str) -> bool:
    where = {n["metadata"]["name"]: n["metadata"]["labels"]["tidal.dev/supernode"] for n in kube.get("nodes")["items"]}
    groups: dict[str, set[str]] = {}
    for p in kube.get("pods", "-n", namespace, "-l", f"tidal.dev/pool={name}")["items"]:
        if p["spec"].get("nodeName"):
            groups.setdefault(p["metadata"]["labels"]["tidal.dev/replica"], set()).add(where[p["spec"]["nodeName"]])
    return all(len(s) == 1 for s in groups.values())


def test_compressed_day(kube: Kube, controlled_clock: OperatorProcess, namespace: str):
    op = controlled_clock
    set_clock(op, "06:00")
    # Training fills 64 of 72 GPUs on each of the 8 racks; DP may shrink to 2.
    submit(
        kube,
        namespace,
        job(
            "night-train",
            tp=4,
            ep=16,
            pp=1,
            dp=8,
            priorityClassName="tidal-batch",
            preemptible=True,
            elastic={"minDP": 2, "maxDP": 8},
            checkpoint={"gracePeriodSeconds": 3600},
        ),
        pool("chat", schedule={"timezone": "UTC", "windows": [{"start": "08:00", "end": "23:00", "minReplicas": 16}]}),
    )
    wait_phase(kube, namespace, "night-train", "Running", timeout=120)
    assert pool_status(kube, namespace, "chat").get("desiredReplicas") == 0

    set_clock(op, "08:00")
    # Free GPUs first (8 replicas), then one DP replica of training, checkpoint first.
    requested = eventually(
        lambda: (
            kube.get("trainingjob", "night-train", "-n", namespace)["metadata"]
            .get("annotations", {})
            .get("tidal.dev/checkpoint-requested")
        ),
        timeout=60,
        what="checkpoint request at 08:00",
    )
    assert len(pods_of(kube, namespace, "night-train")) == 128, "no pod deleted before the checkpoint"
    st = status(kube, namespace, "night-train")
    assert st["eviction"]["reason"] == "Rebalanced" and st["eviction"]["replicas"] == [7]
    eventually(
        lambda: pool_status(kube, namespace, "chat").get("placedReplicas") == 8,
        timeout=60,
        what="8 replicas on free GPUs",
    )
    assert len(pods_of(kube, namespace, "night-train")) == 128
    kube.run("annotate", "-n", namespace, "trainingjob", "night-train", f"tidal.dev/checkpoint-done={requested}")
    eventually(
        lambda: pool_status(kube, namespace, "chat").get("readyReplicas") == 16,
        timeout=90,
        what="16 replicas ready by day",
    )
    st = wait_phase(kube, namespace, "night-train", "Running")
    assert st["currentDP"] == 7 and len(pods_of(kube, namespace, "night-train")) == 112
    assert pool_groups_whole(kube, namespace, "chat")
    assert_gangs_sound(kube)
    metrics = scrape(op)
    assert metrics[("tidal_gpus", (("class", "inference"),))] == 128
    assert metrics[("tidal_gpus", (("class", "training"),))] == 448
    assert metrics[("tidal_hbd_violations_total", ())] == 0
    assert metrics[("tidal_rebalance_moves_total", (("direction", "from-training"), ("reason", "shrink")))] >= 1

    set_clock(op, "22:59")
    time.sleep(5)  # a few cycles see 22:59 (nothing in the status changes to wait on)
    set_clock(op, "23:01")
    eventually(lambda: pool_status(kube, namespace, "chat").get("floor") == 0, timeout=30, what="23:01 seen")
    assert pool_status(kube, namespace, "chat")["placedReplicas"] == 16, "scale-down waits for stabilization"
    set_clock(op, "23:10")
    eventually(
        lambda: pool_status(kube, namespace, "chat").get("placedReplicas") == 0,
        timeout=60,
        what="pool down to its night floor",
    )
    st = eventually(
        lambda: (
            (s := status(kube, namespace, "night-train")).get("currentDP") == 8 and s.get("phase") == "Running" and s
        ),
        timeout=90,
        what="training grows back at night",
    )
    assert len(pods_of(kube, namespace, "night-train")) == 128
    assert_gangs_sound(kube)
    assert scrape(op)[("tidal_hbd_violations_total", ())] == 0


def test_metrics_match_the_cluster(kube: Kube, running_operator: OperatorProcess, namespace: str):
    submit(
        kube,
        namespace,
        job("m-train", tp=4, ep=4, pp=1, dp=2),
        pool("m-pool", minReplicas=3, maxReplicas=3, load={"targetPerReplica": 5}),
    )
    wait_phase(kube, namespace, "m-train", "Running")
    eventually(lambda: pool_status(kube, namespace, "m-pool").get("readyReplicas") == 3, timeout=60, what="pool ready")
    kube.run("annotate", "-n", namespace, "inferencepool", "m-pool", "tidal.dev/load-rps=12.5")
    eventually(
        lambda: pool_status(kube, namespace, "m-pool").get("load", {}).get("currentRate") == 12.5,
        timeout=30,
        what="load observed",
    )

    def consistent():
        m = scrape(running_operator)
        sns = {s["metadata"]["name"]: s["status"]["gpus"] for s in kube.get("supernodes")["items"]}
        for name, gpus in sns.items():
            for state in ("total", "allocated", "free", "failed"):
                assert m[("tidal_supernode_gpus", (("state", state), ("supernode", name)))] == gpus[state], (
                    name,
                    state,
                )
        jobs = [j for j in kube.get("trainingjobs", "-A")["items"] if not j["metadata"].get("deletionTimestamp")]
        running = sum(1 for j in jobs if j.get("status", {}).get("phase") == "Running")
        assert m[("tidal_jobs", (("kind", "TrainingJob"), ("phase", "Running")))] == running
        training = sum(
            j["status"]["worldSize"]
            for j in jobs
            if j.get("status", {}).get("phase") in ("Admitted", "Running", "Restarting")
        )
        assert m[("tidal_gpus", (("class", "training"),))] == training
        pools = [p for p in kube.get("inferencepools", "-A")["items"] if not p["metadata"].get("deletionTimestamp")]
        inference = sum(p["status"]["placedReplicas"] * p["spec"]["tp"] * p["spec"].get("ep", 1) for p in pools)
        assert m[("tidal_gpus", (("class", "inference"),))] == inference
        assert m[("tidal_hbd_violations_total", ())] == 0
        assert m[("tidal_overbooked_gpus", ())] == 0
        assert m[("tidal_placement_duration_seconds_count", ())] > 0
        return True

    eventually(consistent, timeout=30, what="metrics consistent with the cluster")
