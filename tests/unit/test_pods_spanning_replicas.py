"""A job whose pod holds ranks of several DP replicas (plain data parallelism, gpusPerPod > tp*ep*pp):
placed like any gang, and taken whole or not at all. Such a job once made every controller cycle
fail (a zero replica size) as soon as anything queued missed (review)."""

from __future__ import annotations

import datetime as dt

import pytest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.model import TrainingJobSpec, describe_errors
from tidal.placement.shape import GangShape

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
PLAIN_DP = {"tp": 1, "dp": 8, "gpusPerPod": 4, "template": TEMPLATE}  # 2 pods of 4 DP replicas each
RACK_GANG = {"tp": 4, "ep": 18, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE}  # 2 whole NVL72 racks


@pytest.mark.parametrize(
    "shape", [GangShape(1, 1, 1, 8, 4), GangShape(4, 1, 3, 2, 8)], ids=["plain-dp", "pod-across-replicas"]
)
def test_the_shape_is_known_to_span_replicas(shape):
    assert shape.pods_span_replicas
    assert not GangShape(4, 1, 3, 2, 4).pods_span_replicas and not GangShape(2, 1, 4, 2, 8).pods_span_replicas


def test_a_higher_priority_gang_preempts_it_whole_and_no_cycle_fails():
    cluster = FakeCluster("nvl72", 2)
    cluster.add_priority_class("low", 0)
    cluster.add_priority_class("high", 10)
    spec = {**PLAIN_DP, "preemptible": True, "priorityClassName": "low", "checkpoint": {"gracePeriodSeconds": 0}}
    cluster.add("TrainingJob", "ml", "ddp", spec)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "ddp")["phase"] == "Running"
    cluster.add("TrainingJob", "ml", "big", {**RACK_GANG, "priorityClassName": "high"})
    run(cluster, controller, cycles=6)
    assert controller.failures == 0 and controller.cycles >= 9, "a cycle failed"
    assert cluster.status("TrainingJob", "ml", "big")["phase"] == "Running"
    assert cluster.status("TrainingJob", "ml", "ddp")["phase"] == "Pending", "taken whole, back in the queue"
    assert not cluster.pods_of("tidal.dev/job", "ddp")


def test_an_elastic_job_may_not_hold_two_replicas_in_one_pod():
    data = {**PLAIN_DP, "elastic": {"minDP": 4, "maxDP": 8}}
    with pytest.raises(ValueError) as info:
        TrainingJobSpec.model_validate(data)
    messages = describe_errors(info.value)
    assert any(m.startswith("spec.gpusPerPod: 4 does not divide tp*ep*pp=1 in an elastic job") for m in messages)
    TrainingJobSpec.model_validate(PLAIN_DP)  # not elastic: placed and preempted whole
