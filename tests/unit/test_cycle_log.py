"""The controller's "cycle done" INFO line (k8s/cycle_log.py): the first cycle at once, then the
cycles that admitted or made pod calls, summed, at most every --cycle-log-seconds (0: a line for
each, as bench.operator splits a gang's seconds with them); never an idle one."""

import datetime as dt

import pytest
import structlog

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.cycle_log import CycleLog

from .fake_cluster import FakeCluster
from .manual_clock import ManualClock
from .test_rebalance import TEMPLATE


def cycle_lines(controller: Controller, cluster: FakeCluster) -> list[dict]:
    controller._last_start = 0.0
    with structlog.testing.capture_logs() as logs:
        assert controller.cycle(cluster.state()) is not None
    return [e for e in logs if e["event"] == "cycle done"]


def test_with_no_period_cycle_done_is_logged_for_the_first_cycle_and_each_cycle_that_acts():
    cluster = FakeCluster("nvl72", 1)
    settings = ControllerSettings(cycle_log_seconds=0)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)), settings)
    (first,) = cycle_lines(controller, cluster)
    assert first["first"] is True and first["admitted"] == 0 and first["log_level"] == "info"
    assert cycle_lines(controller, cluster) == [], "an idle cycle logs nothing"

    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    (admitting,) = cycle_lines(controller, cluster)
    assert admitting["first"] is False and admitting["admitted"] == 1 and admitting["pod_creates"] == 4
    assert admitting["seconds"] >= admitting["decide_seconds"] + admitting["supernodes_seconds"]
    (gates,) = cycle_lines(controller, cluster)
    assert gates["admitted"] == 0 and gates["ungates"] == 4


def test_by_default_the_cycles_that_acted_are_summed_into_one_line_every_30_seconds():
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    clock = ManualClock(100.0)
    controller.cycle_log.monotonic = clock
    (first,) = cycle_lines(controller, cluster)
    assert first["first"] is True
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    clock.now += 1
    assert cycle_lines(controller, cluster) == [], "the admission comes within 30 s of the last line"
    clock.now += 1
    assert cycle_lines(controller, cluster) == [], "so do the gates lifted"
    clock.now += 30
    (summary,) = cycle_lines(controller, cluster)
    assert (summary["cycles"], summary["admitted"], summary["pod_creates"], summary["ungates"]) == (2, 1, 4, 4)


def test_a_failed_cycle_logs_the_summary_pending_before_its_error(monkeypatch):
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    controller.cycle_log.monotonic = ManualClock(100.0)  # time stands still: nothing is due after the first
    cycle_lines(controller, cluster)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    assert cycle_lines(controller, cluster) == [], "the admission is pending"

    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(controller, "_cycle", broken)
    controller._last_start = 0.0
    with structlog.testing.capture_logs() as logs:
        assert controller.cycle(cluster.state()) is None
    events = [e["event"] for e in logs if e["event"] in ("cycle done", "cycle failed")]
    assert events == ["cycle done", "cycle failed"]
    assert next(e for e in logs if e["event"] == "cycle done")["admitted"] == 1


class BatchRecorder(FakeCluster):
    """Records the items of each api.parallel call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list] = []

    def parallel(self, fn, items):
        self.batches.append(list(items))
        return super().parallel(fn, items)


def test_supernode_statuses_of_one_cycle_are_written_as_one_parallel_batch():
    """A placement across racks changes one Supernode status per rack: written one after the
    other they held the cycle for seconds under load (bench.operator)."""
    cluster = BatchRecorder("nvl72", 3)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    cycle_lines(controller, cluster)

    def supernode_batches() -> list[set[str]]:
        return [
            {item[1].name for item in batch}
            for batch in cluster.batches
            if batch and isinstance(item := batch[0], tuple) and len(item) == 4 and item[1].kind == "Supernode"
        ]

    assert supernode_batches() == [{"nvl72-0000", "nvl72-0001", "nvl72-0002"}], "the first cycle writes all three"
    assert all(cluster.status("Supernode", None, f"nvl72-000{i}")["gpus"]["total"] == 72 for i in range(3))
    cluster.batches.clear()
    spec = {"tp": 8, "ep": 8, "pp": 2, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}  # 128 GPUs: two racks
    cluster.add("TrainingJob", "ml", "wide", spec)
    cycle_lines(controller, cluster)
    (batch,) = supernode_batches()
    assert len(batch) >= 2, "(at least) the two racks the job took, together"
    assert sum(cluster.status("Supernode", None, n)["gpus"]["allocated"] for n in batch) == 128


ACTED = {"admitted": 1, "statuses": 2, "pod_creates": 8, "ungates": 0, "pod_deletes": 0}
QUIET = {"admitted": 0, "statuses": 1, "pod_creates": 0, "ungates": 0, "pod_deletes": 0}
SECONDS = {"seconds": 0.5, "decide_seconds": 0.25, "write_seconds": 0.25, "supernodes_seconds": 0.0}


def lines(log: CycleLog, clock: ManualClock, cycles: list[tuple[float, dict, bool]]) -> list[dict]:
    out = []
    with structlog.testing.capture_logs() as captured:
        for at, counts, first in cycles:
            clock.now = at
            log.record(first, counts, SECONDS, nodes=72, pods=10)
        out = [c for c in captured if c["event"] == "cycle done"]
    return out


def test_cycles_that_acted_are_summed_into_one_line_at_most_every_period():
    clock = ManualClock(100.0)
    log = CycleLog(30.0, monotonic=clock)
    got = lines(
        log,
        clock,
        [(100, QUIET, True), (101, ACTED, False), (110, ACTED, False), (120, QUIET, False), (131, QUIET, False)],
    )
    assert [(c["first"], c["cycles"], c["admitted"], c["pod_creates"]) for c in got] == [
        (True, 1, 0, 0),  # the first cycle at once
        (False, 2, 2, 16),  # the two that acted, summed, once 30 s had passed
    ]
    assert got[1]["seconds"] == 1.0 and got[1]["statuses"] == 4


def test_a_flush_logs_what_is_pending_before_it_is_due_and_nothing_twice():
    """Before a failed cycle's error and at shutdown the summed cycles are logged, not lost."""
    clock = ManualClock(100.0)
    log = CycleLog(30.0, monotonic=clock)
    lines(log, clock, [(100, QUIET, True), (101, ACTED, False)])
    with structlog.testing.capture_logs() as captured:
        log.flush()
        log.flush()
    assert [(c["cycles"], c["admitted"]) for c in captured] == [(1, 1)]


def test_quiet_cycles_log_nothing_however_long_the_wait():
    clock = ManualClock(100.0)
    log = CycleLog(30.0, monotonic=clock)
    got = lines(log, clock, [(100, QUIET, True), (200, QUIET, False), (400, QUIET, False)])
    assert [c["first"] for c in got] == [True]


def test_with_no_period_each_cycle_that_acted_has_its_line():
    clock = ManualClock(100.0)
    log = CycleLog(0.0, monotonic=clock)
    got = lines(log, clock, [(100, QUIET, True), (100.5, ACTED, False), (100.5, QUIET, False), (101, ACTED, False)])
    assert [(c["cycles"], c["admitted"]) for c in got] == [(1, 0), (1, 1), (1, 1)]


def test_the_period_is_an_operator_flag_that_reaches_the_controller():
    from tidal.cli import build_parser
    from tidal.k8s.runner import controller_settings

    default = controller_settings(build_parser().parse_args(["run"]))
    assert default.cycle_log_seconds == ControllerSettings().cycle_log_seconds == 30.0
    every = controller_settings(build_parser().parse_args(["run", "--cycle-log-seconds", "0"]))
    assert Controller(api=None, settings=every).cycle_log.every_seconds == 0.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--cycle-log-seconds", "-1"])
