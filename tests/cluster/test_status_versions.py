"""Optimistic status writes against the real API server: a status merge patch that names a
resourceVersion is refused (409) once the object moved on, and tidal's StatusWriter sends again
after a metadata change but never overwrites a status another writer changed.

The session operator is stopped for these tests (and started again after): the test is the
only writer, so it plays both sides."""

from __future__ import annotations

import pytest

from tidal.k8s.api import Api, StatusConflict, load_client
from tidal.k8s.compact import to_wire
from tidal.k8s.state import resource_view
from tidal.k8s.status import StatusWriter
from tidal.model.server_defaults import status_as_stored

from .kube import Kube
from .operator_process import OperatorProcess
from .test_operator import job, submit


@pytest.fixture
def no_operator(operator: OperatorProcess):
    """Nobody else writes status: a running operator would admit the job and race the test."""
    operator.stop()
    yield
    operator.start()


def read(kube: Kube, namespace: str, name: str) -> dict:
    return kube.get("trainingjob", name, "-n", namespace)


def test_a_status_patch_naming_an_old_version_is_refused_by_the_api_server(
    kube: Kube, namespace: str, no_operator: None
):
    submit(kube, namespace, job("a"))
    api = Api(load_client(str(kube.kubeconfig)), workers=1)
    old = read(kube, namespace, "a")["metadata"]["resourceVersion"]
    new = api.patch_status("TrainingJob", namespace, "a", {"phase": "Pending", "reason": "one"}, old)
    assert new and new != old
    with pytest.raises(StatusConflict):
        api.patch_status("TrainingJob", namespace, "a", {"reason": "two"}, old)
    assert read(kube, namespace, "a")["status"]["reason"] == "one"
    status, version, uid = api.read_status("TrainingJob", namespace, "a")
    assert uid == read(kube, namespace, "a")["metadata"]["uid"]
    assert status["reason"] == "one" and version == new


def test_the_writer_resends_after_a_metadata_change_and_keeps_a_foreign_status(
    kube: Kube, namespace: str, no_operator: None
):
    submit(kube, namespace, job("a"))
    api = Api(load_client(str(kube.kubeconfig)), workers=1)
    writer = StatusWriter(api)
    stale = resource_view(read(kube, namespace, "a"))  # the index, which never catches up here
    assert writer.write(stale, {"phase": "Pending", "reason": "one"})
    kube.run("annotate", "-n", namespace, "trainingjob", "a", "team=x")
    assert writer.write(stale, {"phase": "Pending", "reason": "two"}), "an annotation is no reason to give up"
    assert read(kube, namespace, "a")["status"]["reason"] == "two"
    api.patch_status("TrainingJob", namespace, "a", {"phase": "Suspended", "reason": "theirs"})  # unconditional
    assert not writer.write(stale, {"phase": "Pending", "reason": "three"})
    assert read(kube, namespace, "a")["status"]["reason"] == "theirs", "never clobbered"
    assert writer.effective(stale)["reason"] == "theirs"


def test_the_api_server_defaults_inside_the_status_and_the_writer_takes_that_for_its_own(
    kube: Kube, namespace: str, no_operator: None
):
    """The real server fills status.eviction.mode (a nested schema default) in what it stores;
    a write sent again after an annotation moved the version is ours to resend, not a status
    another writer changed (the refusal this once caused made a preemption restart its preemptor)."""
    submit(kube, namespace, job("a"))
    api = Api(load_client(str(kube.kubeconfig)), workers=1)
    writer = StatusWriter(api)
    stale = resource_view(read(kube, namespace, "a"))
    by = f"{namespace}/urgent (priority 100)"
    eviction = {"reason": "Preempted", "by": by, "requestedAt": "2026-05-01T00:00:00Z"}
    placement = [{"group": 0, "supernode": "nvl72-0000", "nodes": [f"nvl72-0000-n{i:02d}" for i in range(4)]}]
    condition = {"type": "Running", "status": "True", "reason": "AllPodsRunning", "message": "m"}
    running = {
        "phase": "Running",
        "reason": "running",
        "eviction": eviction,
        "placement": placement,
        "conditions": [{**condition, "lastTransitionTime": "2026-05-01T00:00:00Z"}],
    }
    assert writer.write(stale, running)
    held = read(kube, namespace, "a")["status"]
    assert held["eviction"]["mode"] == "Restart", "the server defaults it"
    assert held == status_as_stored("TrainingJob", to_wire(running)), "the server stores what the models' CRD says"
    kube.run("annotate", "-n", namespace, "trainingjob", "a", "tidal.dev/checkpoint-done=2026-05-01T00:00:05Z")
    assert writer.write(stale, {"phase": "Pending", "reason": "preempted"})
    status = read(kube, namespace, "a")["status"]
    assert status["phase"] == "Pending" and "eviction" not in status
    shown = resource_view(read(kube, namespace, "a"))
    assert writer.effective(shown) == writer.observed(shown), "the index showing our write is the ledger caught up"
