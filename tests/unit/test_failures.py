"""Failure handling decided by the controller, on the in-memory cluster (the KWOK tests delete
nodes and fail pods for real; a NotReady node is exercised here)."""

import dataclasses
import datetime as dt

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller

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
    assert status["restarts"] == 1 and status["phase"] == "Running"
    new_nodes = status["placement"][0]["nodes"]
    assert lost not in new_nodes and status["placement"][0]["supernode"] == group["supernode"]
    assert {"nvl72-0000-n16", "nvl72-0000-n17"} & set(new_nodes), "hot spares of the same rack first"
    assert ("delete_pod", "job-0") in cluster.calls
    assert any(v == "event" and d[1] == "Restarting" and "NotReady" in d[2] for v, d in cluster.calls)


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

    def patch_status(self, kind, namespace, name, status):
        if name in self.refuse:
            self._log("patch_status_refused", (kind, name))
            return False
        return super().patch_status(kind, namespace, name, status)


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
