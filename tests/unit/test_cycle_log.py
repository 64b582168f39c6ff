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
    assert admitting["seconds"] >= admitting["decide_seconds"] + admitting["supernodes_seconds"]
    (gates,) = cycle_lines(controller, cluster)
    assert gates["admitted"] == 0 and gates["ungates"] == 4


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
