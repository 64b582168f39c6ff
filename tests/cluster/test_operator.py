"""The operator on a real API server, etcd, kube-scheduler and KWOK GPU nodes (8 NVL72 racks)."""

from __future__ import annotations

import json
import time
from collections import Counter

import yaml

from tidal.k8s.compact import from_wire

from .kube import Kube, eventually
from .operator_process import OperatorProcess

TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}
GPU = "nvidia.com/gpu"


def job(name: str, **spec) -> dict:
    body = {"tp": 4, "ep": 4, "pp": 2, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE}
    body.update(spec)
    return {"apiVersion": "tidal.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": body}


def submit(kube: Kube, namespace: str, *objects: dict) -> None:
    kube.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def status(kube: Kube, namespace: str, name: str) -> dict:
    return kube.get("trainingjob", name, "-n", namespace).get("status", {})


def wait_phase(kube: Kube, namespace: str, name: str, phase: str, timeout: float = 90) -> dict:
    return eventually(
        lambda: (s := status(kube, namespace, name)).get("phase") == phase and s,
        timeout=timeout,
        what=f"{name} {phase}",
    )


def pods_of(kube: Kube, namespace: str, name: str) -> list[dict]:
    return kube.get("pods", "-n", namespace, "-l", f"tidal.dev/job={name}")["items"]


def node_supernodes(kube: Kube) -> dict[str, str]:
    return {n["metadata"]["name"]: n["metadata"]["labels"]["tidal.dev/supernode"] for n in kube.get("nodes")["items"]}


def assert_gangs_sound(kube: Kube) -> None:
    """Cluster-wide: no GPU over-booked on any node, no tidal pod without a live owner."""
    pods = kube.get("pods", "-A", "-l", "app.kubernetes.io/managed-by=tidal")["items"]
    per_node: Counter[str] = Counter()
    for p in pods:
        if p["status"].get("phase") in ("Succeeded", "Failed") or p["metadata"].get("deletionTimestamp"):
            continue
        node = p["spec"].get("nodeName")
        if node:
            per_node[node] += int(p["spec"]["containers"][0]["resources"]["requests"][GPU])
    capacity = {n["metadata"]["name"]: int(n["status"]["allocatable"][GPU]) for n in kube.get("nodes")["items"]}
    over = {n: g for n, g in per_node.items() if g > capacity.get(n, 0)}
    assert not over, f"over-booked nodes: {over}"
    owners = [*kube.get("trainingjobs", "-A")["items"], *kube.get("inferencepools", "-A")["items"]]
    jobs = {(j["metadata"]["namespace"], j["metadata"]["uid"]) for j in owners}
    orphans = [
        p["metadata"]["name"]
        for p in pods
        if (p["metadata"]["namespace"], p["metadata"]["ownerReferences"][0]["uid"]) not in jobs
    ]
    assert not orphans, f"orphaned pods: {orphans}"


def test_the_operator_logs_its_packing_at_start(running_operator: OperatorProcess):
    # README (--packing): which trade-off a cluster runs is in the log, not only in its args.
    settings = [json.loads(line) for line in running_operator.logs().splitlines() if "operator settings" in line]
    assert settings and all(entry["packing"] == "keep-whole" for entry in settings)


def test_supernodes_discovered_with_live_status(kube: Kube, running_operator: OperatorProcess):
    def settled():
        items = kube.get("supernodes")["items"]
        return len(items) == 8 and all(s.get("status", {}).get("gpus", {}).get("total") == 72 for s in items) and items

    items = eventually(settled, timeout=60, what="supernode status")
    sn = next(s for s in items if s["metadata"]["name"] == "nvl72-0003")
    assert sn["spec"]["nodeSelector"] == {"tidal.dev/supernode": "nvl72-0003"}
    assert sn["spec"]["topology"]["block"] == "nvl72-block-000"
    assert sn["status"]["readyNodes"] == 18 and len(sn["status"]["nodes"]) == 18
    assert sn["status"]["largestFreeSlice"] == sn["status"]["gpus"]["free"]
    assert {c["type"]: c["status"] for c in sn["status"]["conditions"]}["Healthy"] == "True"


def test_gang_is_placed_whole_with_megatron_ranks(kube: Kube, running_operator: OperatorProcess, namespace: str):
    submit(kube, namespace, job("moe"))  # 4 groups of tp*ep=16 GPUs, 16 pods of 4
    st = wait_phase(kube, namespace, "moe", "Running")
    assert st["worldSize"] == 64 and st["currentDP"] == 2
    pods = pods_of(kube, namespace, "moe")
    assert len(pods) == 16
    where = node_supernodes(kube)
    groups: dict[int, set[str]] = {}
    ranks = []
    for p in pods:
        env = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
        labels = p["metadata"]["labels"]
        rank = int(env["RANK"])
        ranks.append(rank)
        assert labels["tidal.dev/rank"] == str(rank)
        group = int(labels["tidal.dev/hbd-group"])
        assert group == rank // 16, "Megatron order: each tp*ep group is a run of adjacent ranks"
        assert env["WORLD_SIZE"] == "64" and env["TIDAL_TP_RANK"] == str(rank % 4)
        assert env["TIDAL_EP_RANK"] == str((rank // 4) % 4) and env["TIDAL_PP_RANK"] == str((rank // 16) % 2)
        assert env["TIDAL_DP_RANK"] == str(rank // 32)
        assert env["MASTER_ADDR"] == f"moe-0.moe.{namespace}.svc"
        assert not p["spec"].get("schedulingGates"), "gates lifted"
        assert p["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
        groups.setdefault(group, set()).add(where[p["spec"]["nodeName"]])
    assert sorted(ranks) == list(range(0, 64, 4))
    assert all(len(s) == 1 for s in groups.values()), f"an HBD group spans supernodes: {groups}"
    placed = {g["group"]: g["supernode"] for g in from_wire(st)["placement"]}
    assert {g: next(iter(s)) for g, s in groups.items()} == placed
    svc = kube.get("service", "moe", "-n", namespace)
    assert svc["spec"]["clusterIP"] == "None"
    events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=moe")["items"]
    assert any(e["reason"] == "Admitted" for e in events)
    table = kube.run("get", "tj", "moe", "-n", namespace).stdout
    assert "Running" in table and "64" in table
    assert_gangs_sound(kube)


def test_unplaceable_jobs_say_why_with_numbers(kube: Kube, running_operator: OperatorProcess, namespace: str):
    submit(
        kube,
        namespace,
        job("too-big", tp=4, ep=16, pp=1, dp=9),  # 9 groups of 64 on 8 racks
        job("fat-pods", tp=8, ep=1, pp=1, dp=1, gpusPerPod=8),  # nodes have 4 GPUs
        job("ok-small", tp=4, ep=1, pp=1, dp=1),
    )
    wait_phase(kube, namespace, "ok-small", "Running")
    for name, fragment in (
        ("too-big", "the whole cluster holds 8 such group(s) even when empty"),
        ("fat-pods", "a pod needs 8 nvidia.com/gpu but the largest node has 4"),
    ):
        st = eventually(
            lambda n=name, f=fragment: f in status(kube, namespace, n).get("reason", "") and status(kube, namespace, n),
            timeout=30,
            what=f"{name} reason",
        )
        assert st["phase"] == "Pending"
        cond = {c["type"]: c for c in st["conditions"]}["Schedulable"]
        assert cond["status"] == "False" and fragment in cond["message"]
        events = kube.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")["items"]
        assert any(e["type"] == "Warning" and fragment in e["message"] for e in events)
        assert pods_of(kube, namespace, name) == [], "nothing half-created"


def test_higher_priority_preempts_whole_gang_checkpoint_first(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    # Low-priority job holds 7 of the 8 racks (one 64-GPU group per rack).
    submit(
        kube,
        namespace,
        job(
            "batch",
            tp=4,
            ep=16,
            pp=1,
            dp=7,
            priorityClassName="tidal-batch",
            preemptible=True,
            checkpoint={"gracePeriodSeconds": 120},
        ),
    )
    wait_phase(kube, namespace, "batch", "Running")
    submit(kube, namespace, job("urgent", tp=4, ep=16, pp=1, dp=2, priorityClassName="tidal-training"))
    # The victim is asked to checkpoint first; its pods stay until it confirms.
    requested = eventually(
        lambda: (
            kube.get("trainingjob", "batch", "-n", namespace)["metadata"]
            .get("annotations", {})
            .get("tidal.dev/checkpoint-requested")
        ),
        timeout=30,
        what="checkpoint request",
    )
    time.sleep(2)
    assert len(pods_of(kube, namespace, "batch")) == 7 * 16, "no pod deleted before the checkpoint"
    assert all(
        p["metadata"]["annotations"].get("tidal.dev/checkpoint-requested") == requested
        for p in pods_of(kube, namespace, "batch")
    )
    assert "waiting for 1 preempted job(s)" in status(kube, namespace, "urgent")["reason"]
    kube.run("annotate", "-n", namespace, "trainingjob", "batch", f"tidal.dev/checkpoint-done={requested}")
    wait_phase(kube, namespace, "urgent", "Running")
    st = status(kube, namespace, "batch")
    assert st["phase"] == "Pending"
    preempted = {c["type"]: c for c in st["conditions"]}["Preempted"]
    assert preempted["status"] == "True" and f"{namespace}/urgent" in preempted["message"]
    assert "after checkpoint-done" in preempted["message"]
    # The eviction's end is the operator's own write, never refused as another writer's (the
    # server's nested defaults, model/server_defaults.py): a refusal left the victim holding its
    # nodes in the operator's view, and the preemptor placed on them restarted.
    events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=urgent")["items"]
    assert not [e["message"] for e in events if e["reason"] == "Restarting"], "the preemptor never restarted"
    refused = [line for line in running_operator.logs().splitlines() if "another writer" in line and namespace in line]
    assert refused == []
    assert_gangs_sound(kube)


def test_node_loss_replaces_only_the_broken_group(
    kube: Kube, running_operator: OperatorProcess, namespace: str, restore_nodes
):
    submit(kube, namespace, job("resilient", tp=4, ep=4, pp=2, dp=1, restartPolicy={"scope": "Group"}))
    wait_phase(kube, namespace, "resilient", "Running")
    before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, "resilient")}
    victim_node = before["resilient-5"]  # a pod of group 1
    kube.run("delete", "node", victim_node)

    def replaced_and_running():
        nodes = {p["spec"].get("nodeName") for p in pods_of(kube, namespace, "resilient")}
        return (s := status(kube, namespace, "resilient")).get("phase") == "Running" and victim_node not in nodes and s

    st = eventually(replaced_and_running, timeout=90, what="restarted and Running")
    assert st.get("restarts", 0) == 0, "a lost node is not charged to maxRestarts"
    after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, "resilient")}
    assert sorted(after) == sorted(before), "exactly one pod per rank"
    assert victim_node not in after.values()
    for name in (f"resilient-{i}" for i in range(4)):  # group 0 untouched
        assert after[name] == before[name]
    where = node_supernodes(kube)
    group1 = {where[after[f"resilient-{i}"]] for i in range(4, 8)}
    assert len(group1) == 1
    events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=resilient")["items"]
    assert any(e["reason"] == "Restarting" and victim_node in e["message"] for e in events)
    assert_gangs_sound(kube)


def test_a_drained_node_replaces_its_group_uncharged(
    kube: Kube, running_operator: OperatorProcess, namespace: str, restore_nodes
):
    """`kubectl drain` evicts through the Eviction API (the pod is marked DisruptionTarget and
    deleted) on a Ready node: a cluster's routine maintenance, not the job's failure."""
    submit(kube, namespace, job("drained", tp=4, ep=4, pp=2, dp=1, restartPolicy={"maxRestarts": 0}))
    wait_phase(kube, namespace, "drained", "Running")
    before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, "drained")}
    node = before["drained-5"]
    try:
        kube.run("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s")

        def replaced_and_running():
            nodes = {p["spec"].get("nodeName") for p in pods_of(kube, namespace, "drained")}
            st = status(kube, namespace, "drained")
            return st.get("phase") == "Running" and node not in nodes and len(nodes - {None}) == 8 and st

        st = eventually(replaced_and_running, timeout=90, what="drained group placed again and Running")
        assert st.get("restarts", 0) == 0, "a drain is not charged (maxRestarts=0 would have failed the job)"
        after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, "drained")}
        assert all(after[f"drained-{i}"] == before[f"drained-{i}"] for i in range(4)), "group 0 untouched"
        assert_gangs_sound(kube)
    finally:
        kube.run("uncordon", node)


def test_failed_pods_restart_until_max_restarts(kube: Kube, running_operator: OperatorProcess, namespace: str):
    submit(kube, namespace, job("flaky", tp=4, ep=1, pp=1, dp=2, restartPolicy={"scope": "Gang", "maxRestarts": 1}))
    wait_phase(kube, namespace, "flaky", "Running")

    def fail(pod: str) -> None:
        kube.run(
            "patch",
            "pod",
            pod,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status":{"phase":"Failed"}}',
        )

    fail("flaky-1")
    eventually(
        lambda: (s := status(kube, namespace, "flaky")).get("restarts") == 1 and s["phase"] == "Running",
        timeout=90,
        what="gang restarted once",
    )
    fail("flaky-0")
    st = wait_phase(kube, namespace, "flaky", "Failed")
    assert "exceeded maxRestarts=1" in st["reason"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["Failed"] == "True"
    eventually(
        lambda: not [p for p in pods_of(kube, namespace, "flaky") if not p["metadata"].get("deletionTimestamp")],
        timeout=60,
        what="pods of the failed job deleted",
    )


def test_operator_killed_mid_admission_leaves_one_pod_per_rank(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    # 64 pods (256 GPUs): kill the operator as soon as the first of them exist.
    submit(kube, namespace, job("big", tp=4, ep=16, pp=2, dp=2))
    eventually(lambda: len(pods_of(kube, namespace, "big")) > 0, timeout=60, interval=0.05, what="first pods")
    running_operator.kill()
    created = len(pods_of(kube, namespace, "big"))
    running_operator.start()
    wait_phase(kube, namespace, "big", "Running", timeout=120)
    pods = pods_of(kube, namespace, "big")
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == sorted(f"big-{i}" for i in range(64)), f"created {created} before the kill"
    ranks = sorted(int(p["metadata"]["labels"]["tidal.dev/rank"]) for p in pods)
    assert ranks == list(range(0, 256, 4))
    assert_gangs_sound(kube)


def test_operator_killed_mid_recovery_converges(
    kube: Kube, running_operator: OperatorProcess, namespace: str, restore_nodes
):
    submit(kube, namespace, job("phoenix", tp=4, ep=4, pp=2, dp=2))
    wait_phase(kube, namespace, "phoenix", "Running")
    node = next(
        p["spec"]["nodeName"] for p in pods_of(kube, namespace, "phoenix") if p["metadata"]["name"] == "phoenix-9"
    )
    kube.run("delete", "node", node)

    def restarting():
        events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=phoenix")["items"]
        return any(e["reason"] == "Restarting" for e in events)

    eventually(restarting, timeout=60, interval=0.05, what="recovery started")
    running_operator.kill()
    running_operator.start()
    st = wait_phase(kube, namespace, "phoenix", "Running", timeout=120)
    assert st.get("restarts", 0) == 0, "a lost node is charged neither before nor after the operator restart"
    pods = pods_of(kube, namespace, "phoenix")
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"phoenix-{i}" for i in range(16))
    assert node not in {p["spec"]["nodeName"] for p in pods}
    assert_gangs_sound(kube)


def test_deleting_a_job_deletes_its_pods_and_service(kube: Kube, running_operator: OperatorProcess, namespace: str):
    submit(kube, namespace, job("short", tp=4, ep=1, pp=1, dp=2))
    wait_phase(kube, namespace, "short", "Running")
    kube.run("delete", "trainingjob", "short", "-n", namespace, "--wait=true", "--timeout=60s")
    eventually(lambda: not pods_of(kube, namespace, "short"), timeout=90, what="pods garbage-collected")
    eventually(
        lambda: kube.run("get", "service", "short", "-n", namespace, check=False).returncode != 0,
        timeout=60,
        what="service garbage-collected",
    )
