"""Two operator replicas with kopf peering: only the higher-priority one acts; when it dies the
other takes over."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from .kube import Kube, eventually, token_kubeconfig
from .operator_process import OperatorProcess
from .test_operator import assert_gangs_sound, job, pods_of, submit, wait_phase


def test_standby_replica_waits_then_takes_over(
    kube: Kube, running_operator: OperatorProcess, namespace: str, tmp_path: Path
):
    standby = running_operator  # priority 0
    leader = OperatorProcess(kube.kubeconfig, tmp_path, "--priority", "100")
    leader.start()
    try:
        eventually(
            lambda: "Pausing operations in favour of" in standby.logs(),
            timeout=60,
            what="the priority-0 replica to pause",
        )
        submit(kube, namespace, job("led", tp=4, ep=1, pp=1, dp=2))
        wait_phase(kube, namespace, "led", "Running")
        assert len(pods_of(kube, namespace, "led")) == 2
        assert "led" in leader.logs() and '"name": "led"' not in standby.logs().split("Pausing operations")[-1]
    finally:
        leader.kill()  # no goodbye: the standby must notice the silence
    eventually(
        lambda: "Resuming operations after the pause" in standby.logs().split("Pausing operations")[-1],
        timeout=90,
        what="the standby to resume",
    )
    submit(kube, namespace, job("after", tp=4, ep=1, pp=1, dp=2))
    wait_phase(kube, namespace, "after", "Running")
    assert len(pods_of(kube, namespace, "led")) == 2 and len(pods_of(kube, namespace, "after")) == 2
    assert_gangs_sound(kube)


def test_missing_peering_object_is_created_not_waited_for(kube: Kube, namespace: str, tmp_path: Path):
    """kopf with a peering name waits, paused and silent, for an object nobody made: tidal makes
    it. This second operator serves only an empty namespace (--namespace), so it takes no job from
    the session operator."""
    name = "tidal-made-here"
    kube.delete("clusterkopfpeering", name)
    op = OperatorProcess(kube.kubeconfig, tmp_path, "--namespace", namespace, "--peering-name", name)
    op.start()
    try:
        peering = eventually(
            lambda: kube.get("clusterkopfpeering", name).get("status"),
            timeout=60,
            what="the created ClusterKopfPeering to carry this replica's keep-alive",
        )
        assert len(peering) == 1, peering
        assert f"created the missing ClusterKopfPeering '{name}'" in op.logs()
    finally:
        op.kill()
        kube.delete("clusterkopfpeering", name)


def test_a_restarted_container_takes_its_own_record_back_and_a_new_pod_waits_out_the_dead_one(
    kube: Kube, running_operator: OperatorProcess, namespace: str, tmp_path: Path
):
    """kopf's identity is POD_ID: the operator sets it to the pod's name in the container's own
    process (runner.peering_id; set by hand here, as these processes are no container's PID 1). A
    container restarted in its pod (the old process is gone) finds its own record and acts at
    once; a new pod of the same priority (another name) waits until the dead pod's record expires,
    as the old one may still run. This operator serves only its namespace, under a peering of its
    own; the session operator (which made the Supernodes) is stopped, so the jobs are this one's."""
    running_operator.kill()
    name = "tidal-restarts-here"
    kube.delete("clusterkopfpeering", name)
    args = ("--namespace", namespace, "--peering-name", name)
    first = OperatorProcess(kube.kubeconfig, tmp_path / "first", *args, env={"POD_ID": "tidal-7d4f-abcde"})
    (tmp_path / "first").mkdir()
    first.start()
    try:
        eventually(
            lambda: "tidal-7d4f-abcde" in (kube.get("clusterkopfpeering", name).get("status") or {}),
            timeout=60,
            what="the replica's keep-alive under its pod's name",
        )
        first.kill()  # no goodbye: its record stays
        assert record_age_s(kube, name, "tidal-7d4f-abcde") < 8, "alive for the restart to find (lifetime 15 s)"
        first.start()  # the same pod's container, restarted
        submit(kube, namespace, job("restarted", tp=4, ep=1, pp=1, dp=1))
        wait_phase(kube, namespace, "restarted", "Running")
        restarted = first.log_path.read_text()
        assert '"name": "restarted"' in restarted, "admitted by the restarted container"
        assert "Possibly conflicting operators" not in restarted and "Pausing operations" not in restarted, (
            "a restarted container waited for its own record"
        )
        first.kill()
        assert record_age_s(kube, name, "tidal-7d4f-abcde") < 8, "alive for the new pod to find"

        other = OperatorProcess(kube.kubeconfig, tmp_path / "other", *args, env={"POD_ID": "tidal-7d4f-fghij"})
        (tmp_path / "other").mkdir()
        other.start()
        try:
            eventually(  # same priority: kopf pauses with a warning until the record expires
                lambda: "same priority: [<Peer tidal-7d4f-abcde" in other.logs(),
                timeout=30,
                what="a new pod to wait for the dead pod's record",
            )
            eventually(
                lambda: "Resuming operations after the pause" in other.logs().split("same priority: [<Peer")[-1],
                timeout=60,
                what="the dead pod's record to expire",
            )
            submit(kube, namespace, job("new-pod", tp=4, ep=1, pp=1, dp=1))
            wait_phase(kube, namespace, "new-pod", "Running")
            assert '"name": "new-pod"' in other.logs(), "admitted by the new pod once it resumed"
        finally:
            other.kill()
    finally:
        first.kill()
        kube.delete("clusterkopfpeering", name)


def record_age_s(kube: Kube, peering: str, identity: str) -> float:
    """Seconds since the identity's keep-alive was last written (kopf's lastseen)."""
    lastseen = kube.get("clusterkopfpeering", peering)["status"][identity]["lastseen"]
    return (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(lastseen)).total_seconds()


def test_peering_that_cannot_be_created_stops_the_operator_with_the_reason(kube: Kube, namespace: str, tmp_path: Path):
    """An identity that may not create the peering object gets a non-zero exit naming the object
    and the ways out, instead of an operator that idles forever."""
    kube.run("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = token_kubeconfig(kube, "nobody", namespace, tmp_path / "nobody.kubeconfig")
    op = OperatorProcess(kubeconfig, tmp_path, "--peering-name", "tidal-nobody-may-make")
    with pytest.raises(RuntimeError, match="operator exited"):
        op.start()
    assert op.proc is not None and op.proc.wait(10) == 2
    logs = op.logs()
    assert "ClusterKopfPeering 'tidal-nobody-may-make'" in logs and "may not create it" in logs, logs[-2000:]
    assert "--standalone" in logs
    assert kube.run("get", "clusterkopfpeering", "tidal-nobody-may-make", check=False).returncode != 0


def test_namespace_mode_serves_its_namespaces_and_counts_every_gpu_pod(
    kube: Kube, running_operator: OperatorProcess, namespace: str, tmp_path: Path
):
    """`--namespace` limits the jobs served, not the pods seen: a GPU pod in another namespace
    still takes its GPUs from the supernode's free count (kopf scoped to a namespace would not see
    it, and tidal would book those GPUs twice)."""
    running_operator.kill()  # the namespaced operator must be the only one acting
    other = f"{namespace}-x"[:63]
    kube.run("create", "namespace", other)
    op = OperatorProcess(kube.kubeconfig, tmp_path, "--namespace", namespace, "--priority", "5")
    op.start()
    try:
        submit(kube, other, job("unserved", tp=4, ep=1, pp=1, dp=1))
        submit(kube, namespace, job("served", tp=4, ep=1, pp=1, dp=1))
        wait_phase(kube, namespace, "served", "Running")
        assert kube.get("trainingjob", "unserved", "-n", other).get("status", {}).get("phase") is None
        used = {p["spec"].get("nodeName") for p in pods_of(kube, namespace, "served")}
        supernode = kube.get("supernodes")["items"][0]
        node = next(n for n in reversed(supernode["status"]["nodes"]) if n not in used)
        before = supernode["status"]["gpus"]["allocated"]
        foreign = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "foreign-gpu-user"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}],
            },
        }
        submit(kube, other, foreign)
        name = supernode["metadata"]["name"]
        eventually(
            lambda: kube.get("supernode", name)["status"]["gpus"]["allocated"] == before + 4,
            timeout=60,
            what=f"the foreign pod's 4 GPUs on {node} counted in {name}'s status",
        )
    finally:
        op.kill()
        kube.delete("namespace", other)
    assert "unserved" not in op.logs()
