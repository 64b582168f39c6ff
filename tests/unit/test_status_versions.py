"""Status writes carry the resourceVersion they were decided from (optimistic concurrency).

The in-memory cluster answers as the API server does: a status patch naming a resourceVersion the
object has moved past is refused (409), and an annotation moves the version too."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from tidal.clock import FixedClock
from tidal.k8s.api import StatusConflict
from tidal.k8s.compact import from_wire
from tidal.k8s.controller import Controller
from tidal.k8s.cycle import ActionPlan
from tidal.k8s.state import ResourceView, pod_view
from tidal.k8s.status import CONFLICT_ATTEMPTS, StatusWriter
from tidal.k8s.write import apply_actions

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run
from .test_write import Recorder, view

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
SPEC = {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}


def job(cluster: FakeCluster) -> ResourceView:
    """The job as the (lagging) index read it: the version the deciding side saw."""
    return cluster.get("TrainingJob", "ml", "a")


def verbs(cluster: FakeCluster) -> list[str]:
    return [verb for verb, detail in cluster.calls if verb in ("patch_status", "get_status")]


def test_a_write_after_our_own_write_carries_the_version_that_write_returned():
    """The index lags our own write: the next write is decided from the ledger, and is sent with
    the version our write returned, not the stale one the index holds: no 409, no lost cycle."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    assert writer.write(stale, {"phase": "Pending", "reason": "one"})
    assert writer.write(stale, {"phase": "Pending", "reason": "two"})
    assert cluster.status("TrainingJob", "ml", "a")["reason"] == "two"
    assert verbs(cluster) == ["patch_status", "patch_status"]


def test_a_conflict_that_left_the_status_alone_is_sent_again_against_the_fresh_version():
    """Something moved the version without touching the status (an annotation from kopf, a spec
    edit): the write is re-read and sent again in the same cycle."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    assert writer.write(stale, {"phase": "Pending", "reason": "one"})
    cluster.annotate("TrainingJob", "ml", "a", {"kopf.zalando.org/last-handled-configuration": "{}"})
    cluster.calls.clear()
    assert writer.write(stale, {"phase": "Pending", "reason": "two"})
    assert cluster.status("TrainingJob", "ml", "a")["reason"] == "two"
    assert verbs(cluster) == ["patch_status", "get_status", "patch_status"]


EVICTION = {"reason": "Preempted", "by": "ml/urgent (priority 100)", "requestedAt": "2026-05-01T00:00:00Z"}
"""An eviction as start_eviction writes it: no `mode`, which the CRD schema defaults to Restart."""


def test_a_field_the_api_server_defaults_inside_the_status_is_no_other_writers_change():
    """The server fills status.eviction.mode in what it stores. Our own write, the version then
    moved by an annotation (checkpoint-done), is sent again: before the ledger held statuses as
    the server stores them, the defaulted field made it look like another writer's status, the
    eviction's end was refused while its pods were deleted, and the preemptor placed on its
    victim's nodes restarted for want of room (tests/cluster/test_operator.py, CI)."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    asked = {"phase": "Running", "reason": "running", "eviction": EVICTION}
    assert writer.write(stale, asked)
    assert cluster.status("TrainingJob", "ml", "a")["eviction"]["mode"] == "Restart", "the fake defaults as the server"
    cluster.annotate("TrainingJob", "ml", "a", {"tidal.dev/checkpoint-done": "2026-05-01T00:00:05Z"})
    assert writer.write(stale, {"phase": "Pending", "reason": "preempted"}), "our own status, not another writer's"
    assert cluster.status("TrainingJob", "ml", "a")["phase"] == "Pending"
    # The index showing our write (defaults filled) is the ledger caught up: decided from it.
    shown = job(cluster)
    assert writer.effective(shown) is writer.observed(shown)


class SkewedCrd(FakeCluster):
    """A server whose installed CRD is not the operator's (Helm never upgrades CRDs): older, it
    does not default status.eviction.mode; newer, it defaults a field the operator's models lack."""

    def __init__(self, newer: bool):
        super().__init__("nvl72", 1)
        self.newer = newer

    def patch_status(self, kind, namespace, name, status, resource_version=None):
        written = super().patch_status(kind, namespace, name, status, resource_version)
        key = (kind, namespace, name)
        held = dict(self.objects[key].status)
        if "eviction" in held:
            eviction = {k: v for k, v in held["eviction"].items() if k != "mode"}
            held["eviction"] = {**eviction, "drainHint": "none"} if self.newer else eviction
        if self.newer:
            held["observedWorld"] = 0
        self.objects[key] = dataclasses.replace(self.objects[key], status=held)
        return written


@pytest.mark.parametrize("newer", [False, True], ids=["older CRD", "newer CRD"])
def test_a_crd_older_or_newer_than_the_operator_does_not_make_our_write_anothers(newer: bool):
    cluster = SkewedCrd(newer)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    assert writer.write(stale, {"phase": "Running", "reason": "running", "eviction": EVICTION})
    shown = job(cluster)
    assert writer.effective(shown) is writer.observed(shown), "the ledger catches up on the skewed copy"
    cluster.annotate("TrainingJob", "ml", "a", {"tidal.dev/checkpoint-done": "2026-05-01T00:00:05Z"})
    assert writer.write(shown, {"phase": "Pending", "reason": "preempted"}), "our own status, not another writer's"
    assert cluster.status("TrainingJob", "ml", "a")["phase"] == "Pending"
    again = job(cluster)
    cluster.calls.clear()
    assert writer.write(again, writer.effective(again)) and verbs(cluster) == [], "and no write loop"


def test_a_status_another_writer_changed_is_not_overwritten_and_is_decided_from_next():
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    assert writer.write(stale, {"phase": "Pending", "reason": "one"})
    theirs = {"phase": "Suspended", "reason": "suspended by another writer"}
    cluster.patch_status("TrainingJob", "ml", "a", theirs)  # no version: as a foreign writer may
    assert not writer.write(stale, {"phase": "Pending", "reason": "two"})
    held = cluster.status("TrainingJob", "ml", "a")
    assert {k: held[k] for k in theirs} == theirs, "never clobbered"
    assert writer.effective(stale) == held, "the next cycle decides from the fresh status"
    # ...and a write decided from it goes through, against its version.
    assert writer.write(stale, {**theirs, "reason": "three"})
    assert cluster.status("TrainingJob", "ml", "a")["reason"] == "three"


class CommitThenConflict(FakeCluster):
    """The first patch is committed but its answer is lost; the client's retry then conflicts with
    the version the lost write made (a 500 after commit, then a 409)."""

    lost = True

    def patch_status(self, kind, namespace, name, status, resource_version=None):
        done = super().patch_status(kind, namespace, name, status, resource_version)
        if self.lost and resource_version:
            self.lost = False
            raise StatusConflict("the answer to the committed write was lost")
        return done


def test_a_write_whose_answer_was_lost_is_found_made_on_the_re_read():
    cluster = CommitThenConflict("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    assert writer.write(stale, {"phase": "Pending", "reason": "one"})
    assert verbs(cluster) == ["patch_status", "get_status"], "not sent twice"
    assert writer.write(stale, {"phase": "Pending", "reason": "two"}), "the ledger holds the re-read version"
    assert cluster.status("TrainingJob", "ml", "a")["reason"] == "two"


class AlwaysMoving(FakeCluster):
    """Every status patch finds the object moved on (its status untouched)."""

    def patch_status(self, kind, namespace, name, status, resource_version=None):
        if resource_version:
            self.annotate(kind, namespace, name, {"bump": resource_version})
        return super().patch_status(kind, namespace, name, status, resource_version)


def test_conflicts_are_retried_a_bounded_number_of_times():
    cluster = AlwaysMoving("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    assert not writer.write(job(cluster), {"phase": "Pending", "reason": "one"})
    assert verbs(cluster).count("patch_status") == CONFLICT_ATTEMPTS
    assert cluster.status("TrainingJob", "ml", "a") == {}


def test_a_later_write_of_an_object_whose_write_was_refused_is_not_sent():
    """It was decided on top of the refused one: sent against the fresh version, it would clobber."""
    api = Recorder(refuse={"a"})
    plan = ActionPlan()
    plan.statuses = [(view("TrainingJob", "a"), {"phase": "Admitted"}), (view("TrainingJob", "a"), {"phase": "X"})]
    applied = apply_actions(plan, api, api)
    assert [c for c in api.calls if c[0] == "status"] == [("status", "a")]
    assert applied.failed_statuses == {("TrainingJob", "ns", "a")}


def placed_elsewhere() -> dict[str, Any]:
    """A's recorded placement in a twin cluster where b holds the first rack: a placement the
    operator under test would not choose."""
    twin = FakeCluster("nvl72", 2)
    twin.add("TrainingJob", "ml", "b", {**SPEC, "priority": 9})
    twin.add("TrainingJob", "ml", "a", SPEC)
    run(twin, Controller(twin, FixedClock(NOW)), cycles=1)  # recorded, its pods not yet seen
    return twin.get("TrainingJob", "ml", "a").status


def test_a_placement_another_writer_recorded_after_the_read_gets_no_pods_from_this_cycle():
    """Split brain: another operator recorded a placement for the job after this one's index read
    it. This cycle's placement is not written, so none of its pods are made; the next cycle
    follows the recorded placement."""
    theirs = placed_elsewhere()
    their_nodes = {n for group in from_wire(theirs)["placement"] for n in group["nodes"]}
    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    controller = Controller(cluster, FixedClock(NOW))
    controller.cache.resync(cluster.state())  # the index: a as yet unplaced
    cluster.patch_status("TrainingJob", "ml", "a", theirs)  # the other writer, after the read
    controller.cycle()
    assert not cluster.pods_of("tidal.dev/job", "a"), "no pod for a placement that was not recorded"
    assert cluster.get("TrainingJob", "ml", "a").status == theirs, "their placement stands"
    assert controller.last_report.applied.failed_statuses == {("TrainingJob", "ml", "a")}

    controller._last_start = 0.0
    controller.cycle()  # the index still lags: decided from the fresh status the conflict read
    pods = cluster.pods_of("tidal.dev/job", "a")
    assert pods and {pod_view(p).node for p in pods} <= their_nodes


def test_a_decision_for_a_deleted_job_is_never_written_onto_its_namesake():
    """Review finding: the job was deleted and made again under its name before the index caught
    up; the 409 re-read found an empty status, as the decision's base was, and sent the old job's
    placement onto the new object."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "a", SPEC)
    writer = StatusWriter(cluster)
    stale = job(cluster)
    made = cluster.add("TrainingJob", "ml", "a", {**SPEC, "gpusPerPod": 2})  # a new uid, an empty status
    cluster.objects[("TrainingJob", "ml", "a")] = dataclasses.replace(made, resource_version=cluster._next_version())
    assert not writer.write(stale, {"phase": "Admitted", "reason": "placed for the old job"})
    assert cluster.status("TrainingJob", "ml", "a") == {}
