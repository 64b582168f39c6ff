"""Cluster gauges are computed at scrape time from the controller's cache; names are stable."""

import datetime as dt

from prometheus_client import generate_latest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.metrics import Metrics

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

NAMES = (
    "tidal_supernode_gpus",
    "tidal_supernode_largest_free_slice_gpus",
    "tidal_supernode_fragmentation_ratio",
    "tidal_fragmentation_ratio",
    "tidal_gpus",
    "tidal_jobs",
    "tidal_placement_duration_seconds",
    "tidal_pending_duration_seconds",
    "tidal_oldest_pending_seconds",
    "tidal_preemptions_total",
    "tidal_rebalance_moves_total",
    "tidal_checkpoint_wait_seconds",
    "tidal_hbd_violations_total",
    "tidal_restarts_total",
    "tidal_lost_pods_deleted_total",
    "tidal_overbooked_gpus",
    "tidal_api_requests",
    "tidal_cycle_duration_seconds",
    "tidal_cycles_total",
    "tidal_pending_jobs",
    "tidal_evictions_total",
    "tidal_nodes_not_ready",
    "tidal_mass_not_ready",
)


def scrape(metrics: Metrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_every_metric_name_is_exposed_before_and_after_a_cycle():
    metrics = Metrics()
    before = generate_latest(metrics.registry).decode()
    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "a", {"tp": 4, "ep": 4, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    metrics.attach(controller)
    run(cluster, controller, cycles=3)
    after = generate_latest(metrics.registry).decode()
    for name in NAMES:
        assert f"# TYPE {name.removesuffix('_total')}" in before or name in before, name
        assert name in after, name
    m = scrape(metrics)
    assert m['tidal_gpus{class="training"}'] == 32
    assert m['tidal_jobs{kind="TrainingJob",phase="Running"}'] == 1
    assert m['tidal_supernode_gpus{state="total",supernode="nvl72-0000"}'] == 72
    assert m["tidal_hbd_violations_total"] == 0 and m["tidal_overbooked_gpus"] == 0
    assert m["tidal_cycles_total"] == 3


def test_a_scrape_reads_the_cache_not_the_cycle():
    """The cycle does no metrics walk: its listener only feeds the cycle's own short lists."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    metrics = Metrics()
    metrics.attach(controller)
    run(cluster, controller, cycles=1)
    node = next(iter(cluster.nodes))
    controller.keeper.snapshot.update_node(node, ready=False)  # as the next cycle would see it
    assert scrape(metrics)['tidal_supernode_gpus{state="failed",supernode="nvl72-0000"}'] == 4
