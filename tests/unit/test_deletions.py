"""When a deleted object kopf still holds is nudged (tidal.k8s.deletions); the cluster test
tests/cluster/test_deletion.py shows the nudge frees it on a real API server."""

from __future__ import annotations

from dataclasses import replace

from tidal.k8s.deletions import FINALIZER, DeletionNudger
from tidal.k8s.state import ResourceView


def view(name: str, deleting: bool = True, finalizers: tuple[str, ...] = (FINALIZER,)) -> ResourceView:
    return ResourceView("TrainingJob", "ns", name, f"uid-{name}", 1, "", {}, {}, {}, "1", deleting, finalizers)


def test_a_deleted_object_held_by_kopf_is_nudged_after_the_interval_and_every_interval_after():
    now = [100.0]
    nudger = DeletionNudger(after=10, clock=lambda: now[0])
    held, live, foreign = view("held"), view("live", deleting=False), view("foreign", finalizers=("other/f",))
    assert nudger.due([held, live, foreign]) == []  # first seen deleted now
    now[0] = 109.9
    assert nudger.due([held, live, foreign]) == []
    now[0] = 110.0
    assert nudger.due([held, live, foreign]) == [held]
    now[0] = 115.0
    assert nudger.due([held]) == []
    now[0] = 120.0
    assert nudger.due([held]) == [held]


def test_an_object_gone_or_released_is_forgotten_and_starts_over_if_seen_again():
    now = [0.0]
    nudger = DeletionNudger(after=10, clock=lambda: now[0])
    held = view("held")
    nudger.due([held])
    now[0] = 5.0
    assert nudger.due([replace(held, finalizers=())]) == []  # kopf let it go
    now[0] = 12.0
    assert nudger.due([held]) == []  # seen held again: a full interval from now
    now[0] = 22.0
    assert nudger.due([held]) == [held]
