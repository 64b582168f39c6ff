"""The controller's "cycle done" INFO line: the first cycle and each that admitted or made pod
calls, never an idle one (bench.operator splits a gang's seconds with it)."""

import datetime as dt

import structlog

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE


def cycle_lines(controller: Controller, cluster: FakeCluster) -> list[dict]:
    controller._last_start = 0.0
    with structlog.testing.capture_logs() as logs:
        assert controller.cycle(cluster.state()) is not None
    return [e for e in logs if e["event"] == "cycle done"]


def test_cycle_done_is_logged_for_the_first_cycle_and_for_cycles_that_act():
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    (first,) = cycle_lines(controller, cluster)
    assert first["first"] is True and first["admitted"] == 0 and first["log_level"] == "info"
    assert cycle_lines(controller, cluster) == [], "an idle cycle logs nothing"

    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    (admitting,) = cycle_lines(controller, cluster)
    assert admitting["first"] is False and admitting["admitted"] == 1 and admitting["pod_creates"] == 4
    assert admitting["seconds"] >= admitting["decide_seconds"] >= 0
    (gates,) = cycle_lines(controller, cluster)
    assert gates["admitted"] == 0 and gates["ungates"] == 4
