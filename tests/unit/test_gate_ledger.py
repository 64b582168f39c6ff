"""The ledger of gate removals sent (k8s/gate_ledger.py): a cycle whose watch has not yet shown a
lifted gate does not lift it again, until the resend interval has passed with the pod still
gated; a pod made again under the same name is gated anew."""

import datetime as dt

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.k8s.gate_ledger import RESEND_SECONDS, GateLedger

from .fake_cluster import FakeCluster
from .manual_clock import ManualClock
from .test_rebalance import TEMPLATE


def test_a_sent_removal_is_recent_while_the_pod_stays_gated_and_not_after_the_resend_interval():
    clock = ManualClock(100.0)
    ledger = GateLedger(monotonic=clock)
    ledger.sent(["a", "b", "c"])
    clock.now += 1
    assert ledger.recent(["a", "b"]) == {"a", "b"}, "c is lifted (or gone): forgotten"
    clock.now += RESEND_SECONDS
    assert ledger.recent(["a", "b"]) == frozenset(), "still gated after the interval: sent again"


class LaggingWatch(FakeCluster):
    """A gate removal the API server takes, that the cache does not show yet (as under load)."""

    def remove_gate(self, namespace, name, gate, gates):
        self._log("ungate_pod", name)


def ungated(cluster: LaggingWatch) -> list[str]:
    return [name for verb, name in cluster.calls if verb == "ungate_pod"]


def test_a_cycle_does_not_lift_again_the_gates_it_lifted_until_the_resend_interval():
    cluster = LaggingWatch("nvl72", 1)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    clock = ManualClock(100.0)
    controller.gate_ledger.monotonic = clock
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE})
    for _ in range(2):  # admission and its pods, then every pod exists: the gates go
        controller._last_start = 0.0
        controller.cycle(cluster.state())
    assert sorted(ungated(cluster)) == ["job-0", "job-1", "job-2", "job-3"]
    cluster.calls.clear()
    clock.now += 1
    controller._last_start = 0.0
    controller.cycle(cluster.state())
    assert ungated(cluster) == [], "the watch still shows the gates: not sent again"
    clock.now += RESEND_SECONDS
    controller._last_start = 0.0
    controller.cycle(cluster.state())
    assert sorted(ungated(cluster)) == ["job-0", "job-1", "job-2", "job-3"], "still gated after the interval"
