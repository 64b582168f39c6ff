"""Failure handling decided by the controller, on the in-memory cluster (the KWOK tests delete
nodes and fail pods for real; a NotReady node is exercised here)."""

import dataclasses
import datetime as dt

import pytest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.k8s.state import pod_view

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run


def test_not_ready_node_replaces_its_group_on_the_same_supernode_spares_first():
    cluster = FakeCluster("nvl72", 2)
    sn = cluster.get("Supernode", None, "nvl72-0000")
    cluster.objects[("Supernode", None, "nvl72-0000")] = dataclasses.replace(
        sn, spec={**sn.spec, "spares": {"count": 2}}
    )
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running"
    group = status["placement"][0]
    lost = group["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    cluster.calls.clear()
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status.get("restarts", 0) == 0, "a lost node is not charged to maxRestarts"
    assert status["phase"] == "Running"
    new_nodes = status["placement"][0]["nodes"]
    assert lost not in new_nodes and status["placement"][0]["supernode"] == group["supernode"]
    assert {"nvl72-0000-n16", "nvl72-0000-n17"} & set(new_nodes), "hot spares of the same rack first"
    assert ("delete_pod", "job-0") in cluster.calls
    assert any(v == "event" and d[1] == "Restarting" and "NotReady" in d[2] for v, d in cluster.calls)


def crash(cluster: FakeCluster, name: str) -> str:
    """The pod `name` of namespace ml fails on its own; returns its node."""
    pod = cluster.pods[("ml", name)]
    pod["status"] = {**pod["status"], "phase": "Failed"}
    return pod["spec"]["nodeName"]


def gang_on_racks_with_spares(racks: int, dp: int) -> tuple[FakeCluster, Controller, dict]:
    """A Gang-scope job of `dp` 64-GPU groups, running on NVL72 racks with 2 hot spares each."""
    cluster = FakeCluster("nvl72", racks)
    for i in range(racks):
        key = ("Supernode", None, f"nvl72-{i:04d}")
        sn = cluster.objects[key]
        cluster.objects[key] = dataclasses.replace(sn, spec={**sn.spec, "spares": {"count": 2}})
    spec = {"tp": 4, "ep": 16, "pp": 1, "dp": dp, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("TrainingJob", "ml", "job", {**spec, "restartPolicy": {"scope": "Gang"}})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running"
    return cluster, controller, status


def test_a_whole_gang_restart_takes_its_own_racks_spares_before_other_racks_free_nodes():
    """Gang scope gives everything back: the recovery went to whichever rack packed best, as if
    new, so an emptied rack of ordinary nodes won over its own rack with a spare (issue 10's
    spare order: own rack's spares, then other racks' ordinary free nodes)."""
    cluster, controller, status = gang_on_racks_with_spares(racks=3, dp=1)
    rack, lost = status["placement"][0]["supernode"], status["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running" and "recoverOn" not in status, status.get("reason")
    assert status["placement"][0]["supernode"] == rack, "its own rack, with a spare, not an emptier rack"
    assert lost not in status["placement"][0]["nodes"]
    assert {f"{rack}-n16", f"{rack}-n17"} & set(status["placement"][0]["nodes"]), "a hot spare of its rack"


def test_a_whole_gang_restart_after_a_crash_spares_the_racks_that_lost_nothing_and_avoids_the_node():
    """Review: preferring every rack the gang held took the hot spares of all of them (one crash at
    60 racks: ~120 spares gone) while the nodes it had just freed sat idle, and put the gang back
    on the node its pod crashed on."""
    cluster, controller, status = gang_on_racks_with_spares(racks=2, dp=2)
    crashed_rack = status["placement"][0]["supernode"]
    other_rack = status["placement"][1]["supernode"]
    bad = crash(cluster, "job-3")
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Running" and status["restarts"] == 1
    used = {n for g in status["placement"] for n in g["nodes"]}
    assert bad not in used, "back on the node its pod crashed on"
    assert not {f"{other_rack}-n16", f"{other_rack}-n17"} & used, "the spares of a rack that lost nothing"
    assert {f"{crashed_rack}-n16", f"{crashed_rack}-n17"} & used, "its broken group's rack: spares first"


class TerminatingNamespace(FakeCluster):
    """The API server refuses new content in a namespace being deleted (403), as for a Service."""

    def __init__(self, *args):
        super().__init__(*args)
        self.terminating: set[str] = set()

    def ensure_service(self, body):
        if body["metadata"]["namespace"] in self.terminating:
            raise RuntimeError("403 Forbidden: namespace is being terminated")
        super().ensure_service(body)


def test_a_service_the_api_refuses_stops_neither_the_cycle_nor_other_jobs_and_is_retried_with_its_pods():
    cluster = TerminatingNamespace("nvl72", 2)
    spec = {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("TrainingJob", "going", "a", {**spec, "priority": 5})  # admitted first
    cluster.add("TrainingJob", "ml", "b", spec)
    cluster.terminating.add("going")
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    assert controller.cycles == 3 and controller.failures == 0
    assert cluster.status("TrainingJob", "ml", "b")["phase"] == "Running"
    assert cluster.status("TrainingJob", "going", "a")["phase"] == "Admitted", "placed and written"
    assert not cluster.pods_of("tidal.dev/job", "a"), "no pods without their Service"

    cluster.terminating.clear()  # say, the deletion was cancelled
    run(cluster, controller)
    assert ("create_service", "a") in cluster.calls
    assert cluster.status("TrainingJob", "going", "a")["phase"] == "Running"


class RefusedStatus(FakeCluster):
    """The API server refuses one object's status patch (a conflict, a 5xx, a validating webhook)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.refuse: set[str] = set()

    def patch_status(self, kind, namespace, name, status, resource_version=None):
        if name in self.refuse:
            self._log("patch_status_refused", (kind, name))
            return None
        return super().patch_status(kind, namespace, name, status, resource_version)


def test_a_job_whose_placement_was_not_written_gets_no_pods_and_is_placed_again_next_cycle():
    """A pod on a node that no status books would be invisible to a restarted operator (and to the
    next cycle, which could place someone else there): pods only after their placement is written."""
    cluster = RefusedStatus("nvl72", 2)
    spec = {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("TrainingJob", "ml", "a", {**spec, "priority": 5})
    cluster.add("TrainingJob", "ml", "b", spec)
    cluster.refuse.add("a")
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    assert controller.failures == 0
    assert ("patch_status_refused", ("TrainingJob", "a")) in cluster.calls, "a was admitted and its write refused"
    assert not cluster.pods_of("tidal.dev/job", "a"), "no pods without a recorded placement"
    assert cluster.status("TrainingJob", "ml", "b")["phase"] == "Running", "the refusal stops nobody else"
    assert controller.last_report.applied is not None

    cluster.refuse.clear()
    cluster.calls.clear()
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "a")["phase"] == "Running"
    verbs = [v for v, d in cluster.calls if d in (("TrainingJob", "a"), "a-0")]
    assert verbs.index("patch_status") < verbs.index("create_pod"), "placement written before the first pod"


class SlowScheduler(FakeCluster):
    """Gates lift but nothing binds until `schedule()`, as while kube-scheduler is busy: the window
    in which another pod can take the GPUs a tidal pod is pinned to."""

    def remove_gate(self, namespace, name, gate, gates):
        self._log("ungate_pod", name)
        pod = self.pods.get((namespace, name))
        if pod is not None:
            self.pods[(namespace, name)] = {**pod, "spec": {**pod["spec"], "schedulingGates": []}}

    def schedule(self) -> None:
        """Bind what fits, as kube-scheduler would (it counts only bound pods)."""
        used: dict[str, int] = {}
        for pod in self.pods.values():
            if pod["spec"].get("nodeName"):
                used[pod["spec"]["nodeName"]] = used.get(pod["spec"]["nodeName"], 0) + _gpus(pod)
        for key, pod in sorted(self.pods.items()):
            spec = pod["spec"]
            if spec.get("nodeName") or spec.get("schedulingGates"):
                continue
            node = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            node = node["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
            if used.get(node, 0) + _gpus(pod) <= 4:
                used[node] = used.get(node, 0) + _gpus(pod)
                self.pods[key] = {**pod, "spec": {**spec, "nodeName": node}, "status": {"phase": "Running"}}


def _gpus(pod) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])


def test_a_group_whose_planned_node_a_foreign_pod_took_is_placed_again():
    # Found by bench.faults: a foreign pod bound (nodeName, or kube-scheduler while ours was gated)
    # onto a node tidal had planned left the tidal pod Pending forever and the job Admitted.
    cluster = SlowScheduler("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    planned = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]
    taken = planned[1]
    cluster.pods[("other", "foreign")] = {
        "metadata": {"name": "foreign", "namespace": "other", "uid": "foreign-uid", "labels": {}},
        "spec": {
            "nodeName": taken,
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    run(cluster, controller, cycles=4)
    cluster.schedule()
    run(cluster, controller, cycles=3)
    status = cluster.status("TrainingJob", "ml", "job")
    assert taken not in status["placement"][0]["nodes"], "re-planned away from the node the foreign pod took"
    assert status["phase"] == "Running" and status.get("restarts", 0) == 0, "nothing failed: not a restart"
    assert any(v == "event" and d[1] == "Replaced" and taken in d[2] for v, d in cluster.calls)


def test_a_gang_displaced_with_no_room_elsewhere_is_queued_again_uncharged():
    cluster = SlowScheduler("nvl72", 1)
    whole_rack = {"tp": 4, "ep": 18, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("TrainingJob", "ml", "job", {**whole_rack, "restartPolicy": {"maxRestarts": 0}})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    taken = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"][1]
    cluster.pods[("other", "foreign")] = {
        "metadata": {"name": "foreign", "namespace": "other", "uid": "foreign-uid", "labels": {}},
        "spec": {"nodeName": taken, "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    run(cluster, controller, cycles=2)
    status = cluster.status("TrainingJob", "ml", "job")
    assert status["phase"] == "Restarting" and "placement" not in status, "given back and queued again"
    assert status.get("restarts", 0) == 0, "others took its GPUs: not its failure (maxRestarts=0 would fail it)"


class FailingDeletes(FakeCluster):
    """The API server fails the first delete of each pod (a 500, a 429, a dropped connection)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.failed: set[str] = set()

    def delete_pod(self, namespace, name, grace_seconds=None, uid=""):
        if name not in self.failed:
            self.failed.add(name)
            self._log("delete_pod_failed", name)
            raise RuntimeError("(500) Internal Server Error")
        super().delete_pod(namespace, name, grace_seconds, uid)


def test_a_pod_delete_the_api_failed_is_tried_again():
    # Found by bench.faults: a failed delete still marked the pod deleted, so a group re-placed
    # under the same pod names waited forever on the old pod, pinned to the old node.
    cluster = FailingDeletes("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    lost = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=5)
    status = cluster.status("TrainingJob", "ml", "job")
    assert ("delete_pod_failed", "job-0") in cluster.calls and ("delete_pod", "job-0") in cluster.calls
    assert lost not in {p["spec"]["nodeName"] for p in cluster.pods_of("tidal.dev/job", "job")}
    assert status["phase"] == "Running" and status.get("restarts", 0) == 0  # a lost node: not charged


def four_groups(cls: type[FakeCluster] = FakeCluster) -> tuple[FakeCluster, Controller]:
    cluster = cls("nvl72", 4)
    spec = {"tp": 4, "ep": 4, "dp": 4, "gpusPerPod": 4, "template": TEMPLATE, "restartPolicy": {"maxRestarts": 2}}
    cluster.add("TrainingJob", "ml", "j", spec)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "j")["phase"] == "Running"
    return cluster, controller


def fail_group(cluster: FakeCluster, group: int) -> None:
    for i in range(4):
        pod = cluster.pods[("ml", f"j-{group * 4 + i}")]
        pod["status"] = {**pod["status"], "phase": "Failed"}


def test_one_lost_node_and_the_survivors_it_takes_down_are_not_charged_as_many_restarts():
    """Review: a node lost, then the other groups' collectives failing one per cycle, took a job
    through maxRestarts to Failed within four cycles (and a long job ran out on lost nodes alone)."""
    cluster, controller = four_groups()
    lost = cluster.status("TrainingJob", "ml", "j")["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=1)
    for group in (1, 2, 3):  # NCCL errors out on the survivors while group 0 is re-placed
        fail_group(cluster, group)
        run(cluster, controller, cycles=1)
        status = cluster.status("TrainingJob", "ml", "j")
        assert status["phase"] == "Restarting" and status.get("restarts", 0) == 0, (group, status.get("reason"))
    run(cluster, controller, cycles=3)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and "restartingGroups" not in status
    assert controller.last_report is not None
    fail_group(cluster, 2)  # the job ran whole again: a failure now is a new incident, and its own
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "ml", "j")["restarts"] == 1


def test_a_group_that_fails_again_before_the_job_runs_whole_is_charged_again():
    """A crash loop at start-up must still run out of restarts: the fold covers each group once."""
    cluster, controller = four_groups()
    fail_group(cluster, 1)
    run(cluster, controller, cycles=1)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["restarts"] == 1 and status["restartingGroups"] == [1]
    run(cluster, controller, cycles=1)  # group 1's pods made again
    fail_group(cluster, 1)  # and they crash at start-up, before the job ran whole
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "ml", "j")["restarts"] == 2
    run(cluster, controller, cycles=1)
    fail_group(cluster, 1)
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "ml", "j")["phase"] == "Failed", "maxRestarts=2 exceeded"


def disrupt(cluster: FakeCluster, name: str, why: str, **status) -> None:
    pod = cluster.pods[("ml", name)]
    condition = {"type": "DisruptionTarget", "status": "True", "reason": why}
    pod["status"] = {**pod["status"], **status, "conditions": [condition]}


def restarts(cluster: FakeCluster) -> int:
    return cluster.status("TrainingJob", "ml", "j").get("restarts", 0)


def test_a_drained_pod_is_placed_again_uncharged_and_so_are_peers_failing_while_it_terminates():
    """A drain (the Eviction API marks the pod DisruptionTarget, then deletes it) on a Ready node is
    not the job's failure; the other groups' collectives fail while it terminates: one incident."""
    cluster, controller = four_groups()
    disrupt(cluster, "j-5", "EvictionByEvictionAPI")
    pod = cluster.pods[("ml", "j-5")]
    pod["metadata"] = {**pod["metadata"], "deletionTimestamp": "2026-05-01T00:00:00Z"}
    run(cluster, controller, cycles=1)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Restarting" and status["restartingGroups"] == [1] and restarts(cluster) == 0
    assert "EvictionByEvictionAPI" in status["reason"]
    del cluster.pods[("ml", "j-5")]  # its termination ends
    fail_group(cluster, 2)  # NCCL errors out on a peer while the drained group is re-placed
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and restarts(cluster) == 0, status.get("reason")


def delete_as_watched(cluster: FakeCluster, controller: Controller, name: str, **meta) -> None:
    """The watch's view of a delete: the pod's final state (a MODIFIED with what the API server
    wrote last), then DELETED; the cycles after see no pod (`handlers._feed`)."""
    pod = cluster.pods.pop(("ml", name))
    final = {**pod, "metadata": {**pod["metadata"], **meta}}
    controller.cache.feed("pod", ("ml", name), pod_view(final))
    controller.cache.feed("pod", ("ml", name), None)
    controller._last_start = 0.0
    controller.cycle()


@pytest.mark.parametrize("terminating", [True, False])
def test_a_pod_deleted_with_a_disruption_on_its_final_state_is_uncharged_and_one_without_is_charged(terminating):
    """A cycle may see only what the watch last gave: the drained pod's final state carries the
    condition and its deletionTimestamp. A condition on a pod that was not being deleted is stale
    (an aborted preemption, cleared ~2 min later): that pod crashed, and is charged (review)."""
    cluster, controller = four_groups()
    disrupt(cluster, "j-5", "PreemptionByScheduler")
    meta = {"deletionTimestamp": "2026-05-01T00:00:00Z"} if terminating else {}
    delete_as_watched(cluster, controller, "j-5", **meta)
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and restarts(cluster) == (0 if terminating else 1), status.get("reason")


def test_the_departed_record_is_dropped_when_the_name_comes_back_and_with_its_job():
    cluster, controller = four_groups()
    cache = controller.cache
    disrupt(cluster, "j-5", "EvictionByEvictionAPI")
    body = cluster.pods[("ml", "j-5")]
    final = {**body, "metadata": {**body["metadata"], "deletionTimestamp": "2026-05-01T00:00:00Z"}}
    cache.feed("pod", ("ml", "j-5"), pod_view(final))
    cache.feed("pod", ("ml", "j-5"), None)
    cache.drain()
    assert ("ml", "j-5") in cache.departed
    cache.feed("pod", ("ml", "j-5"), pod_view(body))  # a pod of that name again
    cache.drain()
    assert ("ml", "j-5") not in cache.departed
    cache.feed("pod", ("ml", "j-5"), pod_view(final))
    cache.feed("pod", ("ml", "j-5"), None)
    cache.drain()
    cache.departed[("ml", "gone-0")] = dataclasses.replace(cache.departed[("ml", "j-5")], owner_uid="a-deleted-job")
    run(cluster, controller, cycles=1)
    assert ("ml", "gone-0") not in cache.departed, "its job is gone"


def test_a_group_disrupted_by_a_node_shutting_down_is_placed_off_that_node():
    """Graceful node shutdown marks the pod before the node goes NotReady: placed back there, the
    new pod is refused by the kubelet (NodeShutdown, no condition) and charged (review)."""
    cluster, controller = four_groups()
    node = cluster.pods[("ml", "j-5")]["spec"]["nodeName"]
    disrupt(cluster, "j-5", "TerminationByKubelet", reason="Terminated")
    run(cluster, controller, cycles=1)
    cluster.pods.pop(("ml", "j-5"), None)  # its termination ends (if the operator's delete has not)
    run(cluster, controller, cycles=3)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and restarts(cluster) == 0
    assert node not in status["placement"][1]["nodes"]


def test_a_pod_failed_by_graceful_node_shutdown_is_uncharged_and_one_evicted_for_node_pressure_is_charged():
    cluster, controller = four_groups()
    disrupt(cluster, "j-5", "TerminationByKubelet", phase="Failed", reason="Terminated")
    run(cluster, controller, cycles=4)
    assert cluster.status("TrainingJob", "ml", "j")["phase"] == "Running" and restarts(cluster) == 0
    # The kubelet evicts first the pod most over its requests: usually the one causing the pressure.
    disrupt(cluster, "j-9", "TerminationByKubelet", phase="Failed", reason="Evicted")
    run(cluster, controller, cycles=1)
    assert restarts(cluster) == 1


def test_a_peer_of_the_same_group_failing_after_a_disruption_is_the_same_incident():
    """Review: graceful node shutdown or a drain of one pod, and its group's peers on healthy nodes
    fail within seconds (their collectives): charged, as the disrupted pod's Failed came later."""
    cluster, controller = four_groups()
    disrupt(cluster, "j-4", "TerminationByKubelet", reason="Terminated")  # not yet Failed
    pod = cluster.pods[("ml", "j-6")]
    pod["status"] = {**pod["status"], "phase": "Failed"}
    run(cluster, controller, cycles=1)
    assert restarts(cluster) == 0 and "TerminationByKubelet" in cluster.status("TrainingJob", "ml", "j")["reason"]


def test_an_elastic_gang_restarted_after_a_crash_comes_back_whole_on_the_crash_node_rather_than_smaller():
    """Review: avoiding the crash node came before the size, so a gang that fits whole only with it
    came back with one DP replica fewer after every crash (most crashes are software)."""
    cluster = FakeCluster("nvl72", 1)
    spec = {"tp": 4, "ep": 1, "pp": 1, "dp": 18, "gpusPerPod": 4, "template": TEMPLATE}
    elastic = {"elastic": {"minDP": 1, "maxDP": 18}, "restartPolicy": {"scope": "Gang"}}
    cluster.add("TrainingJob", "ml", "j", {**spec, **elastic})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "j")["currentDP"] == 18
    pod = cluster.pods[("ml", "j-7")]
    pod["status"] = {**pod["status"], "phase": "Failed"}
    cluster.calls.clear()
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and status["currentDP"] == 18 and status["restarts"] == 1
    events = [(d[1], d[2]) for v, d in cluster.calls if v == "event"]
    assert events[0][0] == "Restarting" and "whole gang" in events[0][1]
    admitted = [m for reason, m in events if reason == "Admitted"]
    assert admitted == ["72 GPUs: 18 group(s) of 4 on 1 supernode(s)"], events  # not 68, then grown back


def test_a_whole_gang_restart_after_a_cascade_avoids_no_nodes():
    """A crash's collective fallout fails every pod: which node was bad cannot be told, and
    avoiding them all would push the gang off its racks for nothing (review)."""
    cluster, controller = four_groups()
    spec = cluster.get("TrainingJob", "ml", "j").spec
    cluster.objects[("TrainingJob", "ml", "j")] = dataclasses.replace(
        cluster.get("TrainingJob", "ml", "j"), spec={**spec, "restartPolicy": {"scope": "Gang", "maxRestarts": 2}}
    )
    racks = {g["supernode"] for g in cluster.status("TrainingJob", "ml", "j")["placement"]}
    for group in range(4):
        fail_group(cluster, group)
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert {g["supernode"] for g in status["placement"]} == racks, "pushed off its racks"


def test_a_pod_gone_with_no_disruption_on_record_is_charged():
    """A crash leaves a Failed pod, which pod GC, a cleanup job or a user may delete before a cycle
    sees it; a pod deleted by hand is counted as a Kubernetes Job counts it."""
    cluster, controller = four_groups()
    del cluster.pods[("ml", "j-5")]
    run(cluster, controller, cycles=1)
    assert restarts(cluster) == 1


def test_a_crash_whose_restart_status_was_refused_is_still_charged():
    """The restart's status write refused, its pod deletes went out: the next cycle finds the pods
    gone, and their last view (Failed, no disruption) still charges it (review)."""
    cluster, controller = four_groups(RefusedStatus)
    fail_group(cluster, 1)
    cluster.refuse.add("j")
    run(cluster, controller, cycles=1)
    assert ("patch_status_refused", ("TrainingJob", "j")) in cluster.calls and restarts(cluster) == 0
    cluster.refuse.clear()
    run(cluster, controller, cycles=1)
    assert restarts(cluster) == 1


def test_a_group_whose_pod_failed_is_placed_again_off_that_node_when_it_fits_elsewhere():
    """A bad GPU or link on a node no health checker has tainted: the group went straight back
    onto it (the freed nodes are the tightest fit) and failed again, through maxRestarts (review)."""
    cluster, controller = four_groups()
    bad = crash(cluster, "j-5")
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "j")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert bad not in status["placement"][1]["nodes"], "back on the node it failed on"
    assert cluster.pods[("ml", "j-5")]["spec"]["nodeName"] != bad


def test_a_group_whose_pod_failed_goes_back_on_that_node_when_nothing_else_fits():
    cluster = FakeCluster("nvl72", 1)
    whole_rack = {"tp": 4, "ep": 18, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("TrainingJob", "ml", "rack", whole_rack)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    before = cluster.status("TrainingJob", "ml", "rack")["placement"][0]["nodes"]
    pod = cluster.pods[("ml", "rack-3")]
    pod["status"] = {**pod["status"], "phase": "Failed"}
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "rack")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert sorted(status["placement"][0]["nodes"]) == sorted(before), "re-placed in its group, not queued whole"
    assert not [d for v, d in cluster.calls if v == "event" and "restarting the whole gang" in d[2]]


def job_pods_deleted(cluster: FakeCluster) -> list[str]:
    return [d for v, d in cluster.calls if v == "delete_pod" and d.startswith("job-")]


@pytest.mark.parametrize("not_ready", [2, 3], ids=["a rack's share", "most nodes"])
def test_most_nodes_not_ready_at_once_restart_nothing_but_a_few_do(not_ready: int):
    """4 racks of 18 nodes: a job's 2 racks NotReady (36 of 72 nodes, under the 0.55 share) are
    failed machines, placed again once the grace has passed (more than 2 NotReady: an outage may
    still be spreading); with a third rack (54 of 72) the control plane is the suspect
    (kube-controller-manager's partial disruption) and no gang group restarts until the nodes are
    Ready again, when nothing has changed (the pool's replica, stateless, is replaced on a Ready
    rack); a node deleted meanwhile still breaks its group."""
    cluster = FakeCluster("nvl72", 4)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE})
    pool = {"minReplicas": 1, "maxReplicas": 1, "tp": 4, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "serve", "chat", pool)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = Controller(cluster, clock)
    run(cluster, controller)
    before = cluster.status("TrainingJob", "ml", "job")
    replica = cluster.status("InferencePool", "serve", "chat")["placement"][0]
    used = {g["supernode"] for g in before["placement"]} | {replica["supernode"]}
    down = sorted(used) + sorted(set(f"nvl72-{i:04d}" for i in range(4)) - used)
    racks = down[:not_ready]
    assert used <= set(racks), "the workloads' racks go down first"
    for name in [n for n in cluster.nodes if n.rsplit("-", 1)[0] in racks]:
        cluster.nodes[name] = dataclasses.replace(cluster.nodes[name], ready=False)
    cluster.calls.clear()
    run(cluster, controller, cycles=3)
    assert not job_pods_deleted(cluster), "more than 2 NotReady: the grace first"
    clock.advance(seconds=31)  # past --not-ready-grace (30 s)
    run(cluster, controller, cycles=3)
    after = cluster.status("TrainingJob", "ml", "job")
    deleted = job_pods_deleted(cluster)
    if not_ready == 2:
        assert deleted and after["placement"] != before["placement"], "failed machines: placed again"
        return
    assert controller.not_ready.mass and not deleted, "a control-plane outage: nothing restarts"
    assert after["placement"] == before["placement"] and after["phase"] == "Running"
    serving = cluster.status("InferencePool", "serve", "chat")["placement"][0]["nodes"]
    assert all(cluster.nodes[n].ready for n in serving), "a stateless replica is replaced on Ready nodes"
    gone = before["placement"][0]["nodes"][0]
    del cluster.nodes[gone]  # deleted meanwhile: gone for good, outage or not
    run(cluster, controller, cycles=3)
    placed = cluster.status("TrainingJob", "ml", "job")["placement"]
    assert gone not in placed[0]["nodes"]
    # The outage ends node by node: the job's last nodes come back after the others, however late.
    clock.advance(minutes=10)
    last = set(placed[1]["nodes"][:2])  # 2 left: fewer than the outage rule counts, still the grace
    for name, node in list(cluster.nodes.items()):
        cluster.nodes[name] = dataclasses.replace(node, ready=name not in last)
    cluster.calls.clear()
    run(cluster, controller, cycles=3)
    assert not controller.not_ready.mass
    assert not job_pods_deleted(cluster), "the last nodes of an outage get the grace too"
    for name, node in list(cluster.nodes.items()):
        cluster.nodes[name] = dataclasses.replace(node, ready=True)
    clock.advance(seconds=10)
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "job")["placement"] == placed, "back: nothing moved"


def test_the_mass_not_ready_share_is_kube_controller_managers():
    from tidal.k8s.outage import mass_not_ready

    assert not mass_not_ready(0, 0) and not mass_not_ready(0, 10)
    assert mass_not_ready(1, 1) and mass_not_ready(2, 2), "none Ready: full disruption"
    assert not mass_not_ready(2, 3), "partial disruption needs more than 2 NotReady"
    assert mass_not_ready(3, 5) and not mass_not_ready(3, 6) and mass_not_ready(55, 100)
    assert not mass_not_ready(54, 100)


def test_after_more_than_2_were_not_ready_the_last_stragglers_wait_the_grace_too():
    from tidal.k8s.outage import NotReadyTracker

    t0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
    tracker = NotReadyTracker(dt.timedelta(seconds=30))
    assert tracker.update(["a"], 72, t0) == {"a"}, "one NotReady node: a failed machine, at once"
    tracker.update([], 72, t0 + dt.timedelta(seconds=1))
    spike = [f"n{i}" for i in range(10)]
    assert tracker.update(spike, 72, t0 + dt.timedelta(seconds=2)) == set()
    assert tracker.update(spike[:2], 72, t0 + dt.timedelta(seconds=7)) == set(), "2 left of a spike: still the grace"
    assert tracker.update(spike[:2], 72, t0 + dt.timedelta(seconds=33)) == set(spike[:2]), "the grace is over"


def test_only_the_supernodes_members_not_down_for_repair_count():
    """Three NotReady nodes outside every Supernode (CPU or system nodes) and three cordoned for
    repair leave a single NotReady member: a failed machine, replaced at once."""
    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller)
    placed = cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]
    for i in range(3):
        cpu = dataclasses.replace(cluster.nodes[placed[0]], name=f"cpu-{i}", labels={}, ready=False)
        cluster.nodes[cpu.name] = cpu
    spare = [n for n in cluster.nodes if n.startswith("nvl72") and n not in placed][:3]
    for name in spare:
        cluster.nodes[name] = dataclasses.replace(cluster.nodes[name], ready=False, unschedulable=True)
    run(cluster, controller)
    lost = placed[0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    cluster.calls.clear()
    run(cluster, controller, cycles=3)
    assert job_pods_deleted(cluster), "one member NotReady besides those known down: at once"
    assert lost not in cluster.status("TrainingJob", "ml", "job")["placement"][0]["nodes"]


def test_a_slow_recovery_from_an_outage_restarts_nothing_while_nodes_keep_coming_back():
    from tidal.k8s.outage import NotReadyTracker

    t0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
    tracker = NotReadyTracker(dt.timedelta(seconds=30))
    down = [f"n{i:02d}" for i in range(60)]
    tracker.update(down, 72, t0)
    assert tracker.mass
    left = down
    for k in range(1, 9):  # 5 nodes back every 20 s: 160 s from the outage's end to the last straggler
        left = left[:-5] if k > 1 else left[:-25]  # the first step ends the outage (35 of 72)
        assert tracker.update(left, 72, t0 + dt.timedelta(seconds=20 * k)) == set(), f"step {k}: {len(left)} left"
    stalled = t0 + dt.timedelta(seconds=20 * 8 + 31)
    assert tracker.update(left, 72, stalled) == set(left), "none back for a grace: failed machines"


def test_tidals_pods_tolerate_a_lost_node_without_a_time_limit_unless_the_template_says_otherwise():
    """kube-controller-manager's taint manager evicts a pod 300 s after its node went NotReady (the
    toleration the DefaultTolerationSeconds plugin gives a pod that has none), which would break a
    group mid-outage, while tidal holds it: tidal's pods tolerate a lost node with no time limit."""
    from tidal.k8s.manifests import pinned_pod

    lost = [
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    ]
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 1, "pp": 1, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE})
    pool = {"minReplicas": 1, "maxReplicas": 1, "tp": 4, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "serve", "chat", pool)
    run(cluster, Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))))
    pods = cluster.pods_of("tidal.dev/job", "job") + cluster.pods_of("tidal.dev/pool", "chat")
    assert len(pods) == 3
    assert all(t in p["spec"]["tolerations"] for p in pods for t in lost)

    def tolerations(template_tolerations: list[dict[str, object]]) -> list[dict[str, object]]:
        template = {"spec": {"tolerations": template_tolerations}}
        pod = pinned_pod(template, name="p", namespace="ml", node="n", accelerator="nvidia.com/gpu", gpus=4,
                         pod_labels={}, owner={}, env={})  # fmt: skip
        return [t for t in pod["spec"]["tolerations"] if t.get("effect") != "NoSchedule"]

    own = {**lost[0], "tolerationSeconds": 120}
    assert tolerations([own]) == [own, lost[1]], "the template's own limit for one taint is kept"
    assert tolerations([{"operator": "Exists"}]) == [{"operator": "Exists"}], "tolerates everything already"


def test_a_not_ready_node_outside_every_supernode_still_has_its_groups_placed_again():
    """A rack whose Supernode label was removed (or whose Supernode was deleted) under a running
    job: a NotReady node there is outside the outage rule's count, so it is a failed machine. The
    taint manager used to evict the pod after 300 s; tidal's pods now tolerate a lost node, so only
    tidal can break the group (a review found it held forever)."""
    from tidal.k8s import labels

    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = Controller(cluster, clock)
    run(cluster, controller)
    group = cluster.status("TrainingJob", "ml", "job")["placement"][0]
    for name in [n for n in cluster.nodes if n.startswith(group["supernode"])]:
        node = cluster.nodes[name]
        cluster.nodes[name] = dataclasses.replace(
            node, labels={k: v for k, v in node.labels.items() if k != labels.SUPERNODE}
        )
    run(cluster, controller)
    lost = group["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    cluster.calls.clear()
    run(cluster, controller, cycles=3)
    assert job_pods_deleted(cluster), "placed again, not held"
    assert lost in controller.failed_not_ready


def test_failures_while_a_node_of_the_job_is_held_not_ready_are_not_charged():
    """Review: an outage that is partly real (a rack lost along with the control plane) holds the
    job's group there while its peers on Ready nodes fail their collectives against it; each such
    failure was charged and the job ran out of maxRestarts (2 here) within minutes."""
    cluster, controller = four_groups()
    placement = cluster.status("TrainingJob", "ml", "j")["placement"]
    survivors = set(placement[1]["nodes"]) | set(placement[2]["nodes"]) | set(placement[3]["nodes"])
    for name in [n for n in cluster.nodes if n not in survivors]:
        cluster.nodes[name] = dataclasses.replace(cluster.nodes[name], ready=False)
    run(cluster, controller, cycles=2)
    assert controller.not_ready.mass, "60 of 72 nodes NotReady: held"
    for _ in range(3):
        for group in (1, 2, 3):
            fail_group(cluster, group)
        run(cluster, controller, cycles=2)
        status = cluster.status("TrainingJob", "ml", "j")
        assert status["phase"] != "Failed" and status.get("restarts", 0) == 0, status.get("reason")
    for name, node in list(cluster.nodes.items()):
        cluster.nodes[name] = dataclasses.replace(node, ready=True)
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "ml", "j")["phase"] == "Running"
    fail_group(cluster, 2)  # back: a failure is the job's own again
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "ml", "j")["restarts"] == 1
