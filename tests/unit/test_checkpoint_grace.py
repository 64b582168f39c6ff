"""The checkpoint grace period starts when the operator first sends the request to the job and its
pods, not when the eviction was decided: an operator down for longer than the grace period in
between must still ask, and wait, before it deletes anything."""

import dataclasses
import datetime as dt
import types

import pytest

from tidal.clock import FixedClock, parse_time
from tidal.k8s import training
from tidal.k8s.controller import Controller
from tidal.metrics import Metrics

from .fake_cluster import FakeCluster
from .test_metrics import scrape
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


def watched(controller: Controller) -> Metrics:
    metrics = Metrics()
    metrics.attach(controller)
    return metrics


def preempted_outcomes(metrics: Metrics) -> dict[str, float]:
    """tidal_evictions_total of reason Preempted, by outcome."""
    counted = scrape(metrics)
    return {
        outcome: counted[f'tidal_evictions_total{{outcome="{outcome}",reason="Preempted"}}']
        for outcome in ("whole", "shrink", "cancelled", "taken_over")
    }


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


def test_pods_that_all_exit_during_the_wait_end_it_at_once_and_the_job_is_queued_not_succeeded():
    """A trainer may save and exit 0 on the request (SLURM-requeue style): taking that for a
    finished job would drop unfinished training (review); nothing is left to wait for either."""
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    run(cluster, controller, cycles=1)
    for pod in low_pods(cluster):
        pod["status"] = {**pod["status"], "phase": "Succeeded"}
    clock.advance(seconds=10)
    run(cluster, controller, cycles=1)
    status = cluster.status("TrainingJob", "ml", "low")
    assert status["phase"] == "Pending" and "eviction" not in status, "queued again, well inside the grace period"
    assert "its pods all exited during the wait" in preempted_message(cluster)
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "ml", "high")["phase"] == "Running"


def test_a_rank_that_fails_during_the_wait_ends_it_at_once():
    """A checkpoint is collective: with a rank down it cannot complete, so waiting out the grace
    period only keeps the preemptor off its GPUs."""
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    run(cluster, controller, cycles=1)
    pod = low_pods(cluster)[3]
    pod["status"] = {**pod["status"], "phase": "Failed"}
    clock.advance(seconds=10)
    run(cluster, controller, cycles=1)
    assert not low_pods(cluster), "evicted now, not after the grace period"
    status = cluster.status("TrainingJob", "ml", "low")
    assert status["phase"] == "Pending" and status.get("restarts", 0) == 0, "an eviction, not a restart"
    assert "group 0 broke during the wait (pod low-3 failed)" in preempted_message(cluster)
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "ml", "high")["phase"] == "Running"


@pytest.mark.parametrize("how", ["deleted", "being deleted", "suspended"])
def test_a_preemption_whose_preemptor_no_longer_waits_is_called_off(how: str):
    """The preemptor went away (or found room elsewhere) inside the victim's grace period: the
    victim keeps training, nothing is deleted or charged (it was evicted anyway: review)."""
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    run(cluster, controller, cycles=1)
    key = ("TrainingJob", "ml", "high")
    high = cluster.objects[key]
    if how == "deleted":
        del cluster.objects[key]
    elif how == "being deleted":
        cluster.objects[key] = dataclasses.replace(high, deleting=True)
    else:
        cluster.objects[key] = dataclasses.replace(high, spec={**high.spec, "suspend": True}, generation=2)
    run(cluster, controller, cycles=1)
    clock.advance(seconds=GRACE + 1)
    run(cluster, controller, cycles=2)
    status = cluster.status("TrainingJob", "ml", "low")
    assert "eviction" not in status and status["phase"] == "Running", how
    assert len(low_pods(cluster)) == 16 and not status.get("evictionHistory")
    requested = next(c for c in status["conditions"] if c["type"] == "CheckpointRequested")
    assert requested["reason"] == "Cancelled" and "ml/high is" in requested["message"], requested


def test_a_called_off_preemption_a_queued_job_needs_is_taken_over_not_asked_again():
    """The preemptor went away while another queued job needs the same victim: the checkpoint
    request already sent stands for that job (one checkpoint, not a cancel and a second request),
    so a checkpoint-done made for the first request evicts at once for the second."""
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    metrics = watched(controller)
    cluster.add_priority_class("mid", 50)
    cluster.add("TrainingJob", "ml", "mid", {**BASE, "dp": 1, "priorityClassName": "mid"})
    run(cluster, controller, cycles=1)
    asked = cluster.status("TrainingJob", "ml", "low")["eviction"]
    assert asked["by"].startswith("ml/high ") and asked.get("askedAt")
    assert cluster.status("TrainingJob", "ml", "mid")["phase"] == "Pending"

    clock.advance(seconds=60)
    del cluster.objects[("TrainingJob", "ml", "high")]
    cluster.calls.clear()
    run(cluster, controller, cycles=1)
    eviction = cluster.status("TrainingJob", "ml", "low")["eviction"]
    assert eviction["by"].startswith("ml/mid "), eviction
    assert {k: eviction.get(k) for k in ("requestedAt", "askedAt", "deadline")} == {
        k: asked[k] for k in ("requestedAt", "askedAt", "deadline")
    }, "the request already sent, its grace period already running"
    reasons = [d[1] for v, d in cluster.calls if v == "event" and d[0] == "low"]
    assert reasons == ["CheckpointRequestTakenOver"], reasons
    writes = [d for v, d in cluster.calls if v == "patch_status" and d == ("TrainingJob", "low")]
    assert len(writes) == 1, "one status, never the called-off one the cycle passed through"
    assert "tidal.dev/checkpoint-cancelled" not in cluster.get("TrainingJob", "ml", "low").annotations
    assert not any(
        "tidal.dev/checkpoint-cancelled" in (p["metadata"].get("annotations") or {}) for p in low_pods(cluster)
    )
    requested = next(
        c for c in cluster.status("TrainingJob", "ml", "low")["conditions"] if c["type"] == "CheckpointRequested"
    )
    assert requested["status"] == "True" and requested["reason"] == "Preempted" and "ml/mid" in requested["message"]
    assert parse_time(requested["lastTransitionTime"]) == parse_time(asked["requestedAt"])

    cluster.annotate("TrainingJob", "ml", "low", {"tidal.dev/checkpoint-done": asked["requestedAt"]})
    run(cluster, controller, cycles=1)
    assert not low_pods(cluster), "the checkpoint made for the first request counts"
    assert "Preempted by ml/mid" in preempted_message(cluster) and "after checkpoint-done" in preempted_message(cluster)
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "mid")["phase"] == "Running"
    assert preempted_outcomes(metrics) == {"whole": 1, "shrink": 0, "cancelled": 0, "taken_over": 1}


def test_a_called_off_preemption_nobody_takes_over_is_told_once_at_the_end_of_the_cycle():
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    metrics = watched(controller)
    run(cluster, controller, cycles=1)
    requested_at = cluster.status("TrainingJob", "ml", "low")["eviction"]["requestedAt"]
    del cluster.objects[("TrainingJob", "ml", "high")]
    cluster.calls.clear()
    run(cluster, controller, cycles=2)
    cancelled = [d for v, d in cluster.calls if v == "event" and d[0] == "low" and d[1] == "EvictionCancelled"]
    assert len(cancelled) == 1 and "ml/high is gone" in cancelled[0][2], cancelled
    annotations = [p["metadata"].get("annotations") or {} for p in low_pods(cluster)]
    annotations.append(cluster.get("TrainingJob", "ml", "low").annotations)
    assert len(annotations) == 17 and all(a.get("tidal.dev/checkpoint-cancelled") == requested_at for a in annotations)
    assert preempted_outcomes(metrics) == {"whole": 0, "shrink": 0, "cancelled": 1, "taken_over": 0}


def test_a_job_suspended_while_its_preemption_is_called_off_keeps_the_request_for_the_suspension():
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    run(cluster, controller, cycles=1)
    asked = cluster.status("TrainingJob", "ml", "low")["eviction"]
    clock.advance(seconds=60)
    del cluster.objects[("TrainingJob", "ml", "high")]
    low = cluster.objects[("TrainingJob", "ml", "low")]
    cluster.objects[("TrainingJob", "ml", "low")] = dataclasses.replace(
        low, spec={**low.spec, "suspend": True}, generation=2
    )
    cluster.calls.clear()
    run(cluster, controller, cycles=1)
    eviction = cluster.status("TrainingJob", "ml", "low")["eviction"]
    assert (eviction["reason"], eviction["requestedAt"]) == ("Suspended", asked["requestedAt"]), eviction
    assert [d[1] for v, d in cluster.calls if v == "event" and d[0] == "low"] == ["CheckpointRequestTakenOver"]


def test_a_call_off_whose_status_was_not_recorded_is_not_told():
    """A reconcile that failed after calling an eviction off recorded nothing: the job still has
    its eviction, and is not told to stand down (the next cycle decides again)."""
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    preempting(cluster, clock)
    view = cluster.get("TrainingJob", "ml", "low")
    status = cluster.status("TrainingJob", "ml", "low")
    called_off = training.CalledOff(view, {}, status["eviction"], status["conditions"], "ml/high is gone")
    events: list[tuple] = []
    cyc = types.SimpleNamespace(
        called_off={view.uid: called_off},
        event=lambda *a, **k: events.append(a),
        annotate=lambda *a: events.append(a),
        count=lambda *a: events.append(a),
    )
    training.tell_called_off(cyc, {view.uid: (view, status)})
    assert not events and not cyc.called_off
    cyc.called_off[view.uid] = called_off
    training.tell_called_off(cyc, {view.uid: (view, {k: v for k, v in status.items() if k != "eviction"})})
    assert [e[1] for e in events if len(e) == 3] == ["EvictionCancelled"], events


def test_a_preemption_is_called_off_when_a_finished_job_leaves_the_preemptor_room_elsewhere():
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    low = {**BASE, "dp": 3, "preemptible": True, "priorityClassName": "low"}
    cluster.add("TrainingJob", "ml", "low", {**low, "checkpoint": {"gracePeriodSeconds": GRACE}})
    cluster.add("TrainingJob", "ml", "short", {**BASE, "dp": 1, "priorityClassName": "low"})  # not preemptible
    controller = Controller(cluster, clock)
    run(cluster, controller)
    cluster.add("TrainingJob", "ml", "high", {**BASE, "dp": 1, "priorityClassName": "high"})  # 16 GPUs, 8 free
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "low")["eviction"]["reason"] == "Preempted"
    for pod in cluster.pods_of("tidal.dev/job", "short"):
        pod["status"] = {**pod["status"], "phase": "Succeeded"}
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "ml", "high")["phase"] in ("Admitted", "Running")
    clock.advance(seconds=GRACE + 1)
    run(cluster, controller, cycles=2)
    status = cluster.status("TrainingJob", "ml", "low")
    assert "eviction" not in status and status["phase"] == "Running" and len(low_pods(cluster)) == 12
    requested = next(c for c in status["conditions"] if c["type"] == "CheckpointRequested")
    assert requested["reason"] == "Cancelled" and "ml/high is" in requested["message"], requested


def test_a_preemption_whose_preemptor_still_waits_goes_ahead():
    cluster = FakeCluster("nvl72", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC))
    controller = preempting(cluster, clock)
    run(cluster, controller, cycles=1)
    clock.advance(seconds=GRACE + 1)
    run(cluster, controller, cycles=3)
    assert not low_pods(cluster) and cluster.status("TrainingJob", "ml", "high")["phase"] == "Running"


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        ({"phase": "Restarting", "placement": [{"group": 0, "supernode": "s", "nodes": ["n"]}]}, "ml/high is placed"),
        ({"phase": "Restarting"}, None),  # back in the queue after a failure: it may be the one waiting
        ({"phase": "Pending", "reason": "WaitingForPreemption"}, None),
        ({"phase": "Succeeded"}, "ml/high is Succeeded"),
    ],
)
def test_a_recovering_preemptor_placed_again_counts_as_placed(status: dict, verdict: str | None):
    """Admission keeps a recovering job's phase Restarting when it places it: judged by what it
    holds, not by the phase's name (review)."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "ml", "high", {**BASE, "dp": 1})
    cluster.patch_status("TrainingJob", "ml", "high", status)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    cyc = types.SimpleNamespace(state=cluster.state(), writer=controller.writer)
    assert (
        training._job_no_longer_waiting(cyc, training.job_evictor(cluster.get("TrainingJob", "ml", "high"), "x"))
        == verdict
    )
