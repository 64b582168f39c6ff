"""When a deleted object kopf still holds is nudged (tidal.k8s.deletions), and the controller's
round of nudges; tests/cluster/test_deletion.py shows a nudge frees such an object on a real API
server."""

from __future__ import annotations

import dataclasses
import datetime as dt

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.k8s.deletions import FINALIZER, NUDGE_ANNOTATION, DeletionNudger
from tidal.k8s.state import ResourceView

from .fake_cluster import FakeCluster
from .manual_clock import ManualClock
from .test_rebalance import TEMPLATE


def view(name: str, deleting: bool = True, finalizers: tuple[str, ...] = (FINALIZER,)) -> ResourceView:
    return ResourceView(
        kind="TrainingJob",
        namespace="ns",
        name=name,
        uid=f"uid-{name}",
        generation=1,
        created="",
        spec={},
        status={},
        annotations={},
        resource_version="1",
        deleting=deleting,
        finalizers=finalizers,
    )


def test_a_held_deleted_object_is_nudged_after_the_interval_then_at_doubling_intervals_up_to_the_cap():
    clock = ManualClock()
    nudger = DeletionNudger(after=10, cap=40, clock=clock)
    held, live, foreign = view("held"), view("live", deleting=False), view("foreign", finalizers=("other/f",))
    nudged = []
    for t in range(0, 200):
        clock.now = float(t)
        if nudger.due([held, live, foreign]):
            nudged.append(t)
    # First seen deleted at 0: nudged at 10, then after 10, 20, 40, 40 ... (capped).
    assert nudged == [10, 20, 40, 80, 120, 160]


def test_a_round_takes_the_longest_waiting_first_and_at_most_its_share():
    clock = ManualClock()
    nudger = DeletionNudger(after=10, per_round=2, clock=clock)
    nudger.due([view("a")])
    clock.now = 5.0
    nudger.due([view("a"), view("b"), view("c")])
    clock.now = 15.0
    # a waits since 10, b and c since 15 (a tie kept in the given order); two per round.
    assert [v.name for v in nudger.due([view("c"), view("b"), view("a")])] == ["a", "c"]
    clock.now = 16.0
    assert [v.name for v in nudger.due([view("a"), view("b"), view("c")])] == ["b"]


def test_an_object_gone_or_released_is_forgotten_and_starts_over_if_seen_again():
    clock = ManualClock()
    nudger = DeletionNudger(after=10, clock=clock)
    held = view("held")
    nudger.due([held])
    clock.now = 5.0
    assert nudger.due([dataclasses.replace(held, finalizers=())]) == []  # kopf let it go
    clock.now = 12.0
    assert nudger.due([held]) == []  # seen held again: a full interval from now
    clock.now = 22.0
    assert nudger.due([held]) == [held]


class RefusingCluster(FakeCluster):
    """An API server that refuses every write to one object."""

    refused = "stuck"

    def annotate(self, kind, namespace, name, annotations):
        if name == self.refused:
            self._log("annotate_refused", (kind, name))
            raise RuntimeError("refused")
        super().annotate(kind, namespace, name, annotations)


def test_the_controller_nudges_held_deleted_jobs_and_supernodes_and_survives_a_refused_nudge():
    cluster = RefusingCluster("nvl72", 2)
    spec = {"tp": 4, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
    for name in ("stuck", "doomed", "kept"):
        cluster.add("TrainingJob", "ml", name, spec)
    deleted = (("TrainingJob", "ml", "stuck"), ("TrainingJob", "ml", "doomed"), ("Supernode", None, "nvl72-0001"))
    for kind, ns, name in deleted:
        cluster.objects[(kind, ns, name)] = dataclasses.replace(
            cluster.get(kind, ns, name), deleting=True, finalizers=(FINALIZER,)
        )
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    clock = ManualClock()
    controller.nudger = DeletionNudger(after=10, clock=clock)
    controller.cycle(cluster.state())
    controller.nudger.wait()
    assert not [c for c in cluster.calls if c[0].startswith("annotate")], "nudged before the interval"
    clock.now = 10.0
    controller.cycle(cluster.state())
    controller.nudger.wait()  # the refused nudge raised nothing out of the round
    nudged = {
        (kind, name)
        for verb, (kind, name, ann) in (c for c in cluster.calls if c[0] == "annotate")
        if NUDGE_ANNOTATION in ann
    }
    assert nudged == {("TrainingJob", "doomed"), ("Supernode", "nvl72-0001")}
    assert ("annotate_refused", ("TrainingJob", "stuck")) in cluster.calls
    assert NUDGE_ANNOTATION in cluster.get("Supernode", None, "nvl72-0001").annotations
    assert NUDGE_ANNOTATION not in cluster.get("TrainingJob", "ml", "kept").annotations
