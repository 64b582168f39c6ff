"""Taints at planning, the admission timeout, and fencing of NotReady nodes, on the in-memory
cluster (tests/unit/fake_cluster.py) driving the real controller."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.state import NodeView
from tidal.k8s.taints import Taint, Toleration, tolerations_of, untolerated

from .fake_cluster import FakeCluster
from .test_failures import SlowScheduler
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
    drain = Taint("drain", "", "NoExecute")
    for timed in ({"key": "drain", "operator": "Exists", "tolerationSeconds": 60},
                  {"key": "drain", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}):  # fmt: skip
        tolerations = tolerations_of({"spec": {"tolerations": [timed]}})
        assert untolerated([drain], tolerations), "evicted after tolerationSeconds: not a place to plan on"
    assert not untolerated([drain], tolerations_of({"spec": {"tolerations": [{"key": "drain", "operator": "Exists"}]}}))


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


def test_gpu_nodes_tainted_for_gpu_pods_only_stay_open_and_the_pods_carry_the_toleration():
    # Review finding: GKE taints every GPU node nvidia.com/gpu=present:NoSchedule and relies on the
    # ExtendedResourceToleration plugin to tolerate it for GPU pods; counted closed, nothing ran.
    cluster = FakeCluster("nvl72", 1)
    for node in rack(cluster, "nvl72-0000"):
        taint(cluster, node, Taint("nvidia.com/gpu", "present", "NoSchedule"))
    cluster.add("TrainingJob", "ml", "job", SPEC)
    run(cluster, Controller(cluster, FixedClock(START)))
    assert cluster.status("TrainingJob", "ml", "job")["phase"] == "Running"
    implied = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert all(implied in p["spec"]["tolerations"] for p in cluster.pods_of("tidal.dev/job", "job"))
    free = [n for n in rack(cluster, "nvl72-0000") if n not in placed_nodes(cluster, "job")]
    for node in free[3:]:  # 3 free nodes left open: a 4-node gang does not fit
        taint(cluster, node, Taint("nvidia.com/gpu", "present", "NoExecute"))
    cluster.add("TrainingJob", "ml", "other", SPEC)
    run(cluster, Controller(cluster, FixedClock(START)))
    assert cluster.status("TrainingJob", "ml", "other")["phase"] == "Pending", "NoExecute is not implied"


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


def dedicated_racks(cluster: FakeCluster) -> dict[str, dict[str, Any]]:
    """Rack i is team "abcd"[i]'s (dedicated=<team>:NoSchedule on every node): team -> a template
    tolerating its own taint only."""
    racks = sorted({n.rsplit("-", 1)[0] for n in cluster.nodes})
    for team, supernode in zip("abcd", racks, strict=False):
        for node in rack(cluster, supernode):
            taint(cluster, node, Taint("dedicated", team, "NoSchedule"))
    tolerations = {t: [{"key": "dedicated", "operator": "Equal", "value": t}] for t in "abcd"}
    return {t: {"spec": {**TEMPLATE["spec"], "tolerations": tolerations[t]}} for t in "abcd"}


def test_queued_jobs_of_teams_with_their_own_taints_share_one_copy_of_the_preemption_inputs(monkeypatch):
    """20 queued jobs of 4 teams, interleaved in queue order, each tolerating its team's taint: the
    preemption inputs (a copy of the snapshot and a walk of every placed pod) are made once, not
    once per job (the copy is brought to each job's tolerated nodes instead)."""
    from tidal.k8s import admission

    made = []
    real = admission.without_evictions_in_flight
    monkeypatch.setattr(admission, "without_evictions_in_flight", lambda *a: made.append(1) or real(*a))
    cluster = FakeCluster("nvl72", 4)
    templates = dedicated_racks(cluster)
    cluster.add_priority_class("low", 1)
    controller = Controller(cluster, FixedClock(START))
    for t in "abcd":  # something preemptible of low priority, so preemption is planned at all
        cluster.add(
            "TrainingJob", t, "run", {**SPEC, "preemptible": True, "priorityClassName": "low", "template": templates[t]}
        )
    run(cluster, controller)
    assert all(cluster.status("TrainingJob", t, "run")["phase"] == "Running" for t in "abcd")
    big = {**SPEC, "ep": 18, "dp": 2, "priorityClassName": "low"}  # two racks: never fits
    for k in range(20):
        t = "abcd"[k % 4]
        cluster.add("TrainingJob", t, f"big-{k}", {**big, "template": templates[t]})
    made.clear()
    run(cluster, controller, cycles=1)
    assert len(made) <= 2, f"{len(made)} copies in one cycle"
    assert not any(cluster.status("TrainingJob", t, "run").get("eviction") for t in "abcd")


def test_the_tainted_nodes_are_scanned_once_per_cycle_for_many_jobs_with_the_same_tolerations(monkeypatch):
    """Each queued job asks for its tolerated nodes one to three times (its placement, preemption,
    defragmentation): 2,000 tainted nodes cost 5 ms a scan. One scan per set of tolerations per cycle."""
    from tidal.k8s import cycle

    scanned = []
    real = cycle.untolerated
    monkeypatch.setattr(cycle, "untolerated", lambda *a: scanned.append(1) or real(*a))
    cluster = FakeCluster("nvl72", 4)
    templates = dedicated_racks(cluster)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    big = {**SPEC, "ep": 18, "dp": 2, "template": templates["a"]}  # two racks, team a has one
    for k in range(10):
        cluster.add("TrainingJob", "a", f"big-{k}", big)
    scanned.clear()
    run(cluster, controller, cycles=1)
    assert all(cluster.status("TrainingJob", "a", f"big-{k}")["phase"] == "Pending" for k in range(10))
    assert len(scanned) <= len(cluster.nodes), f"{len(scanned)} taint checks for {len(cluster.nodes)} tainted nodes"


def test_a_copy_brought_to_other_flips_equals_one_made_under_them():
    """Cycle.reflip undoes one job's avoided and tolerated nodes and applies another's on a copy."""
    cluster = FakeCluster("nvl72", 4)
    templates = dedicated_racks(cluster)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    cyc = controller.last_report.cycle
    nodes = sorted(cluster.nodes)

    def flags(snapshot: Any) -> dict[str, tuple[bool, bool]]:
        return {n: (snapshot.nodes[n].cordoned, snapshot.nodes[n].tainted) for n in nodes}

    with cyc.avoiding(nodes[::3]), cyc.tolerating(templates["a"]):
        was = tuple(cyc.flipped)
        copy = cyc.snapshot.copy()
    with cyc.avoiding(nodes[::3]), cyc.tolerating(templates["b"]), cyc.avoiding(nodes[1::5]):
        now = tuple(cyc.flipped)
        wanted = flags(cyc.snapshot)
    assert wanted != flags(copy)
    type(cyc).reflip(copy, was, now)
    assert flags(copy) == wanted
    type(cyc).reflip(copy, now, ())
    assert flags(copy) == flags(cyc.snapshot)


# -- B: the admission timeout ---------------------------------------------------------------------


def unschedulable(cluster: FakeCluster, pod: str, message: str) -> None:
    body = cluster.pods[("ml", pod)]
    cluster.pods[("ml", pod)] = {
        **body,
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
        },
    }


class Stuck(SlowScheduler):
    """kube-scheduler binds every ungated pod except those on `refuse` nodes (a device plugin's
    resources gone, a taint added after placement), which stay Pending with PodScheduled=False."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.refuse: set[str] = set()

    def schedule(self) -> None:
        for (namespace, name), pod in sorted(self.pods.items()):
            spec = pod["spec"]
            if spec.get("nodeName") or spec.get("schedulingGates"):
                continue
            terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
            if node in self.refuse:
                unschedulable(self, name, "0/36 nodes are available: 1 node(s) had untolerated taint {gpu: bad}.")
            else:
                bound = {**spec, "nodeName": node}
                self.pods[(namespace, name)] = {**pod, "spec": bound, "status": {"phase": "Running"}}


def cycles(cluster: Stuck, controller: Controller, n: int = 3) -> None:
    for _ in range(n):
        run(cluster, controller, cycles=1)
        cluster.schedule()


def test_a_pod_stuck_pending_past_the_admission_timeout_has_its_group_placed_again_with_the_why():
    cluster = Stuck("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {**SPEC, "dp": 2})  # two groups of 4 pods
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    run(cluster, controller, cycles=1)
    placement = cluster.status("TrainingJob", "ml", "job")["placement"]
    bad = placement[1]["nodes"][2]
    cluster.refuse.add(bad)
    cycles(cluster, controller, 4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Admitted" and status["placement"] == placement, "waiting: within the timeout"

    clock.advance(seconds=599)
    cycles(cluster, controller, 2)
    assert cluster.status("TrainingJob", "ml", "job")["placement"] == placement, "not yet"

    clock.advance(seconds=2)
    cluster.calls.clear()
    cycles(cluster, controller, 4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running", status
    assert status["placement"][0] == placement[0], "the group whose pods run stays where it is"
    assert bad not in status["placement"][1]["nodes"], "the stuck group was placed again"
    assert status.get("restarts", 0) == 0, "not a failure restart: the restart budget is left alone"
    ready = next(c for c in status["conditions"] if c["type"] == "PodsReady")
    assert ready["status"] == "True", "true again once every pod runs"
    event = next(d for v, d in cluster.calls if v == "event" and d[1] == "AdmissionTimeout")
    assert "job-6" in event[2] and "Unschedulable: 0/36 nodes are available" in event[2], event
    assert ("delete_pod", "job-4") in cluster.calls and ("delete_pod", "job-0") not in cluster.calls


def test_the_admission_timeout_condition_names_the_pod_and_a_cordon_or_taint_and_survives_a_restart():
    cluster = Stuck("nvl72", 1)  # one rack: nowhere else to go, so the gang is queued again
    cluster.add("TrainingJob", "ml", "job", {**SPEC, "restartPolicy": {"scope": "Gang"}})
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    run(cluster, controller, cycles=1)
    nodes = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]
    cluster.refuse.add(nodes[1])
    taint(cluster, nodes[1], Taint("gpu", "bad", "NoSchedule"))
    cycles(cluster, controller, 3)

    clock.advance(minutes=11)
    restarted = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))  # nothing in memory
    cycles(cluster, restarted, 1)
    status = cluster.status("TrainingJob", "ml", "job")
    ready = next(c for c in status["conditions"] if c["type"] == "PodsReady")
    assert ready["status"] == "False" and ready["reason"] == "AdmissionTimeout"
    assert "pod job-1: Unschedulable" in ready["message"]
    assert f"node {nodes[1]} has taint(s) gpu=bad:NoSchedule the pod does not tolerate" in ready["message"]
    assert status.get("restarts", 0) == 0
    # scope Gang: the whole gang is given back and queued; placed again off the tainted node.
    cycles(cluster, restarted, 3)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running" and nodes[1] not in status["placement"][0]["nodes"]


def test_a_growth_that_never_starts_is_given_back_and_the_training_replica_keeps_running():
    # Review finding: the timeout of an elastic growth requeued the whole gang (scope Gang), which
    # deleted the replica that had been training, with no checkpoint.
    cluster = Stuck("nvl72", 1)
    cluster.add("TrainingJob", "ml", "filler", {**SPEC, "dp": 3})
    elastic = {**SPEC, "dp": 2, "elastic": {"minDP": 1, "maxDP": 2}, "restartPolicy": {"scope": "Gang"}}
    cluster.add("TrainingJob", "ml", "el", {**elastic, "preemptible": True})
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    cycles(cluster, controller, 3)
    status = cluster.status("TrainingJob", "ml", "el")
    assert status["phase"] == "Running" and status["currentDP"] == 1
    training = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods_of("tidal.dev/job", "el")}
    cluster.refuse |= set(cluster.nodes) - placed_nodes(cluster, "el")  # the growth will not start
    del cluster.objects[("TrainingJob", "ml", "filler")]
    for key in [k for k, p in cluster.pods.items() if p["metadata"]["labels"].get("tidal.dev/job") == "filler"]:
        del cluster.pods[key]
    cycles(cluster, controller, 3)
    assert cluster.status("TrainingJob", "ml", "el")["currentDP"] == 2, "grown onto the freed nodes"

    clock.advance(seconds=601)
    cluster.calls.clear()
    cycles(cluster, controller, 3)
    status = cluster.status("TrainingJob", "ml", "el")
    assert status["currentDP"] == 1 and status["phase"] == "Running", status
    now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods_of("tidal.dev/job", "el")}
    assert now == training, "the training replica's pods were never touched"
    assert not any(v == "delete_pod" and d in training for v, d in cluster.calls)
    assert any(v == "event" and "never started" in d[2] for v, d in cluster.calls)


def test_a_gang_queued_again_by_the_timeout_is_placed_off_the_nodes_that_refused_it():
    # Review finding: the whole-gang path forgot where its pods had waited in vain, and with no
    # taint or cordon to see, the next admission picked the same nodes again.
    cluster = Stuck("nvl72", 1)
    cluster.add("TrainingJob", "ml", "job", {**SPEC, "restartPolicy": {"scope": "Gang"}})
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    run(cluster, controller, cycles=1)
    first = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]
    cluster.refuse.add(first[1])  # refused by something tidal cannot see (a device plugin gone)
    cycles(cluster, controller, 3)
    clock.advance(seconds=601)
    cycles(cluster, controller, 4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running", status
    assert first[1] not in status["placement"][0]["nodes"]
    assert "refusedNodes" not in status, "cleared at admission"


def test_a_settled_gang_waiting_for_its_pods_is_looked_at_again_when_the_timeout_passes():
    cluster = Stuck("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", SPEC)
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=60))
    run(cluster, controller, cycles=1)
    nodes = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]
    cluster.refuse.add(nodes[3])
    cycles(cluster, controller, 3)
    # Nothing moves any more: the job is settled and skipped, yet the deadline must still fire.
    for _ in range(3):
        controller._last_start = 0.0
        controller.cycle()
    clock.advance(seconds=61)
    controller._last_start = 0.0
    controller.cycle()
    assert nodes[3] not in cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]


# -- C: fencing -----------------------------------------------------------------------------------


class Kubelets(FakeCluster):
    """Deletes as the API server does them: a pod bound to a node is removed only once its kubelet
    confirms (a Ready node's does at once), or at once if forced (grace 0). A NotReady node's pods
    stay Terminating. `gc()` is the pod garbage collector: it removes terminating pods of nodes
    that are gone or carry the out-of-service taint."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.graces: list[tuple[str, int | None]] = []

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str = "") -> None:
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
    assert status["phase"] == "Running" and status.get("restarts", 0) == 0  # a lost node: not charged
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


def test_a_pod_deleted_with_a_grace_period_is_forced_once_its_node_is_fenced():
    # Issue 34: the group's pods were deleted with a grace period while the node was only
    # NotReady; once it is fenced nothing will confirm that delete, and the rank's new pod (its
    # name is fixed) waited for the pod GC. No gc() here: tidal forces them itself.
    cluster = Kubelets("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", SPEC)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    lost = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=3)
    assert cluster.pods[("ml", "job-0")]["metadata"].get("deletionTimestamp"), "deleted, with a grace period"
    taint(cluster, lost, Taint("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute"))
    run(cluster, controller, cycles=6)
    assert [g for name, g in cluster.graces if name == "job-0"].count(0) == 1, "forced once, in the cycle that saw it"
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running"
    assert cluster.pods[("ml", "job-0")]["spec"]["nodeName"] in status["placement"][0]["nodes"]


def test_a_deleted_job_s_pod_on_a_lost_node_is_forced_though_no_decision_deletes_it():
    # A job being deleted is not reconciled (the garbage collector deletes its pods, gracefully):
    # its pod on a node that is then deleted would hold its GPUs and name until the pod GC. The
    # cycle's sweep of lost nodes forces it.
    cluster = Kubelets("nvl72", 2)
    view = cluster.add("TrainingJob", "ml", "job", SPEC)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    node = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"][0]
    cluster.nodes[node] = dataclasses.replace(cluster.nodes[node], ready=False)  # no kubelet confirms
    stored = cluster.objects[("TrainingJob", "ml", "job")]
    cluster.objects[("TrainingJob", "ml", "job")] = dataclasses.replace(stored, deleting=True)
    pod = cluster.pods[("ml", "job-0")]
    cluster.pods[("ml", "job-0")] = {
        **pod,
        "metadata": {**pod["metadata"], "deletionTimestamp": "2026-05-01T00:00:00Z"},
    }
    run(cluster, controller, cycles=2)
    assert not [g for name, g in cluster.graces if name == "job-0"], "a NotReady node's pod is left to its kubelet"
    del cluster.nodes[node]
    run(cluster, controller, cycles=2)
    assert [g for name, g in cluster.graces if name == "job-0"] == [0], view.name


def test_the_out_of_service_taint_on_a_ready_node_does_not_force_a_delete():
    # Review finding: the pod GC reads the taint on NotReady nodes only; on a live node put by
    # mistake it must not make tidal force-delete a pod that is still running there.
    cluster = Kubelets("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", SPEC)
    controller = Controller(cluster, FixedClock(START))
    run(cluster, controller)
    node = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"][0]
    taint(cluster, node, Taint("node.kubernetes.io/out-of-service", "nodeshutdown", "NoExecute"))
    pod = cluster.pods[("ml", "job-0")]
    cluster.pods[("ml", "job-0")] = {**pod, "status": {**pod["status"], "phase": "Failed"}}
    run(cluster, controller, cycles=2)
    graces = [g for name, g in cluster.graces if name == "job-0"]
    assert graces and 0 not in graces, cluster.graces


def test_a_pool_replica_stuck_past_the_admission_timeout_is_placed_again_off_its_node():
    cluster = Stuck("nvl72", 2)
    pool = {"minReplicas": 2, "maxReplicas": 2, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "ml", "chat", pool)  # two replicas of two 4-GPU pods
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    run(cluster, controller, cycles=1)
    placement = cluster.status("InferencePool", "ml", "chat")["placement"]
    bad = placement[1]["nodes"][1]
    cluster.refuse.add(bad)
    cycles(cluster, controller, 3)
    clock.advance(seconds=599)
    cycles(cluster, controller, 2)
    status = cluster.status("InferencePool", "ml", "chat")
    assert [r["nodes"] for r in status["placement"]] == [r["nodes"] for r in placement], "within the timeout"
    assert status["readyReplicas"] == 1

    clock.advance(seconds=2)
    cluster.calls.clear()
    cycles(cluster, controller, 4)
    status = cluster.status("InferencePool", "ml", "chat")
    assert status["readyReplicas"] == 2, status
    nodes = [r["nodes"] for r in status["placement"]]
    assert placement[0]["nodes"] in nodes, "the replica that serves stays where it is"
    assert all(bad not in n for n in nodes), "the stuck replica was placed again, off the node that refused it"
    event = next(d for v, d in cluster.calls if v == "event" and d[1] == "AdmissionTimeout")
    assert "chat-1-1" in event[2] and "Unschedulable: 0/36 nodes are available" in event[2], event
    ready = next(c for c in status["conditions"] if c["type"] == "PodsReady")
    assert ready["status"] == "True", "true again once every replica runs"
    assert not status.get("refusedNodes")


def test_a_serving_replica_whose_pod_is_deleted_gets_it_back_and_its_own_timeout():
    """A pod of a replica that served for an hour is deleted (kubectl, a drain, the descheduler):
    the pod is made again and the replica's clock starts again; the replica is not torn down."""
    cluster = Stuck("nvl72", 2)
    pool = {"minReplicas": 2, "maxReplicas": 2, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "ml", "chat", pool)
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    cycles(cluster, controller, 3)
    before = [r["nodes"] for r in cluster.status("InferencePool", "ml", "chat")["placement"]]
    clock.advance(seconds=3600)
    cycles(cluster, controller, 1)
    del cluster.pods[("ml", "chat-1-0")]
    cluster.calls.clear()
    cycles(cluster, controller, 3)
    status = cluster.status("InferencePool", "ml", "chat")
    assert [r["nodes"] for r in status["placement"]] == before, "the replica was torn down"
    assert status["readyReplicas"] == 2
    assert not [d for v, d in cluster.calls if v == "event" and d[1] == "AdmissionTimeout"]
    assert ("delete_pod", "chat-1-1") not in cluster.calls


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_serving_replicas_pod_that_ends_while_it_is_deleted_is_made_again_not_torn_down(phase: str):
    """kubectl delete (or a drain) of a pod of a replica that served for an hour: its container
    exits on SIGTERM and the kubelet writes Failed (exit 143) or Succeeded (exit 0) before the
    object goes (restartPolicy Never). The replica keeps its nodes and healthy pods, gets the pod
    back once it is gone and its clock starts again: no restart, no admission timeout."""
    cluster = Stuck("nvl72", 2)
    pool = {"minReplicas": 2, "maxReplicas": 2, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "ml", "chat", pool)
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    cycles(cluster, controller, 3)
    before = [r["nodes"] for r in cluster.status("InferencePool", "ml", "chat")["placement"]]
    clock.advance(seconds=3600)
    cycles(cluster, controller, 1)
    pod = cluster.pods[("ml", "chat-1-0")]
    pod["metadata"]["deletionTimestamp"] = "2026-05-01T01:00:30Z"
    pod["status"]["phase"] = phase
    cluster.calls.clear()
    cycles(cluster, controller, 1)
    status = cluster.status("InferencePool", "ml", "chat")
    assert [r["nodes"] for r in status["placement"]] == before, "the replica was torn down"
    assert ("delete_pod", "chat-1-1") not in cluster.calls, "its healthy pod was deleted"
    assert not controller.last_report.cycle.counters.get("restarts")
    assert not [c for c in status["conditions"] if c["type"] == "PodsReady" and c["status"] == "False"], "not stuck"
    del cluster.pods[("ml", "chat-1-0")]  # the kubelet is done: the object goes
    cycles(cluster, controller, 3)
    status = cluster.status("InferencePool", "ml", "chat")
    assert [r["nodes"] for r in status["placement"]] == before
    assert status["readyReplicas"] == 2
    assert not [d for v, d in cluster.calls if v == "event" and d[1] == "AdmissionTimeout"]
    assert not [c for c in status["conditions"] if c["type"] == "PodsReady" and c["status"] == "False"]


class RefusingCreate(Stuck):
    """The API server refuses one pod's create every time (a ResourceQuota 403, a webhook, PSA)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.refuse_create: set[str] = set()

    def create_pod(self, body: dict[str, Any]) -> bool:
        if body["metadata"]["name"] in self.refuse_create:
            self._log("create_pod_refused", body["metadata"]["name"])
            raise ApiException(status=403, reason="Forbidden: exceeded quota")
        return super().create_pod(body)


def test_a_pool_replica_whose_pod_is_never_made_times_out():
    cluster = RefusingCreate("nvl72", 2)
    pool = {"minReplicas": 2, "maxReplicas": 2, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "ml", "chat", pool)
    clock = FixedClock(START)
    controller = Controller(cluster, clock, ControllerSettings(admission_timeout_seconds=600))
    cluster.refuse_create.add("chat-1-1")
    cycles(cluster, controller, 3)
    for _ in range(4):
        clock.advance(seconds=300)
        cycles(cluster, controller, 1)
    events = [d for v, d in cluster.calls if v == "event" and d[1] == "AdmissionTimeout"]
    assert events and "chat-1-1 does not exist yet" in events[0][2], events
