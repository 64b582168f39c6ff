"""The checkpoint grace period starts when the operator first sends the request to the job and its
pods, not when the eviction was decided: an operator down for longer than the grace period in
between must still ask, and wait, before it deletes anything."""

import datetime as dt

from tidal.clock import FixedClock, parse_time
from tidal.k8s.controller import Controller

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

BASE = {"tp": 4, "ep": 4, "pp": 1, "gpusPerPod": 4, "template": TEMPLATE}
GRACE = 300


def preempting(cluster: FakeCluster, clock: FixedClock) -> Controller:
    """One rack, a preemptible job on all of it, then a high-priority job: one cycle records the
    eviction of the low one (and nothing else happens before the operator is 'killed')."""
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    low = {**BASE, "dp": 4, "preemptible": True, "priorityClassName": "low"}
    cluster.add("TrainingJob", "ml", "low", {**low, "checkpoint": {"gracePeriodSeconds": GRACE}})
    controller = Controller(cluster, clock)
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "low")["phase"] == "Running"
    cluster.add("TrainingJob", "ml", "high", {**BASE, "dp": 1, "priorityClassName": "high"})
    run(cluster, controller, cycles=1)
    eviction = cluster.status("TrainingJob", "ml", "low")["eviction"]
    assert eviction["reason"] == "Preempted" and "askedAt" not in eviction
    return controller


def low_pods(cluster: FakeCluster) -> list[dict]:
    return cluster.pods_of("tidal.dev/job", "low")


def preempted_message(cluster: FakeCluster) -> str:
    conditions = cluster.status("TrainingJob", "ml", "low")["conditions"]
    return next(c["message"] for c in conditions if c["type"] == "Preempted")


def test_an_operator_down_past_the_grace_period_still_asks_and_waits_before_it_evicts():
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    preempting(cluster, clock)
    assert not any(
        "tidal.dev/checkpoint-requested" in (p["metadata"].get("annotations") or {}) for p in low_pods(cluster)
    )

    clock.advance(seconds=GRACE + 1)  # the operator was down; a new one takes over
    restarted = Controller(cluster, clock)
    cluster.calls.clear()
    run(cluster, restarted, cycles=1)
    verbs = [v for v, _ in cluster.calls]
    assert "annotate_pod" in verbs and "delete_pod" not in verbs, "asked first, nothing deleted"

    run(cluster, restarted, cycles=2)  # the request is now seen everywhere: the grace period starts
    eviction = cluster.status("TrainingJob", "ml", "low")["eviction"]
    assert parse_time(eviction["askedAt"]) == clock.now()
    assert parse_time(eviction["deadline"]) == clock.now() + dt.timedelta(seconds=GRACE)
    clock.advance(seconds=GRACE - 1)
    run(cluster, restarted)
    assert len(low_pods(cluster)) == 16, "inside the grace period counted from when it was asked"

    clock.advance(seconds=2)
    run(cluster, restarted)
    assert not low_pods(cluster)
    assert "pods deleted after the grace period without checkpoint-done" in preempted_message(cluster)


def test_a_request_a_pod_refuses_delays_nothing_past_the_grace_period_and_is_reported():
    """A webhook refusing the pods' annotation must not hold the preemptor for ever: the grace
    period runs from the first time the request was sent, and the eviction says who never got it."""
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    cluster.annotate_pod = lambda namespace, name, annotations: None  # written nowhere
    run(cluster, controller, cycles=1)
    sent = parse_time(cluster.status("TrainingJob", "ml", "low")["eviction"]["askedAt"])
    assert sent == clock.now()
    clock.advance(seconds=GRACE - 1)
    run(cluster, controller)
    assert len(low_pods(cluster)) == 16, "inside the grace period"
    clock.advance(seconds=2)
    cluster.calls.clear()
    run(cluster, controller)
    assert not low_pods(cluster)
    warnings = [d for v, d in cluster.calls if v == "event" and d[1] == "CheckpointRequestNotDelivered"]
    assert warnings and "pod low-0" in warnings[0][2], warnings


def test_checkpoint_done_evicts_at_once_even_before_the_grace_period_starts():
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    requested = cluster.status("TrainingJob", "ml", "low")["eviction"]["requestedAt"]
    cluster.annotate("TrainingJob", "ml", "low", {"tidal.dev/checkpoint-done": requested})
    run(cluster, controller)
    assert not low_pods(cluster)
    assert "pods deleted after checkpoint-done" in preempted_message(cluster)
