"""The disruption budget's ledger of deleted jobs (k8s/disruption_ledger.py), function by function;
the operator-level case (deleted, restarted, aged out) is in test_rebalance.py."""

import dataclasses
import datetime as dt
import json

import pytest

from tidal.clock import rfc3339
from tidal.k8s.disruption_ledger import DATA_KEY, DisruptionLedger, LedgerStore
from tidal.k8s.state import ResourceView
from tidal.k8s.watch import WatchCache

from .fake_cluster import FakeCluster

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


def job(uid: str = "uid-1", name: str = "train") -> ResourceView:
    return ResourceView("TrainingJob", "ml", name, uid, 1, "2026-05-01T00:00:00Z", {}, {}, {}, "1", False)


def record(minutes_ago: float, gpus: int, reason: str = "Rebalanced") -> dict:
    return {"at": rfc3339(NOW - dt.timedelta(minutes=minutes_ago)), "gpus": gpus, "reason": reason}


def test_only_the_hours_disruptions_are_kept():
    ledger = DisruptionLedger()
    history = [
        record(90, 64),  # older than the hour
        record(30, 32),
        record(20, 16, "Defragmented"),
        record(10, 8, "Preempted"),  # a priority preemption: not a disruption the budget counts
    ]
    ledger.add_deleted(job(), {"evictionHistory": history}, NOW)
    assert ledger.changed
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1)) == 48
    ledger.age_out(NOW + dt.timedelta(minutes=35))
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1)) == 16


def test_a_record_seen_twice_counts_once():
    ledger = DisruptionLedger()
    status = {"evictionHistory": [record(5, 32)]}
    ledger.add_deleted(job(), status, NOW)
    ledger.add_deleted(job(), status, NOW + dt.timedelta(minutes=3))  # the same deletion seen again (a relisting)
    saved = ledger.data()
    ledger.merge(saved, NOW)  # and read back from the ConfigMap
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1)) == 32
    other = DisruptionLedger()
    other.add_deleted(job("uid-2"), status, NOW)  # another job's eviction at the same instant: its own
    other.merge(saved, NOW)
    assert other.gpus_since(NOW - dt.timedelta(hours=1)) == 64


def test_merge_marks_the_configmap_behind_only_when_it_lacks_a_record():
    ledger = DisruptionLedger()
    ledger.add_deleted(job(), {"evictionHistory": [record(5, 32)]}, NOW)
    saved = ledger.data()
    ledger.changed = False
    ledger.merge(saved, NOW)
    assert not ledger.changed, "nothing to write: the ConfigMap has every record"
    ledger.merge({DATA_KEY: "[]"}, NOW)  # another replica saved without it
    assert ledger.changed


def test_an_unreadable_configmap_is_skipped_not_fatal():
    ledger = DisruptionLedger()
    rows = [
        {"job": "uid-1", "at": rfc3339(NOW), "gpus": 8},
        {"job": "uid-2", "at": "yesterday", "gpus": 8},
        {"job": "uid-3", "at": rfc3339(NOW), "gpus": "many"},
        {"job": 4, "at": rfc3339(NOW), "gpus": 8},
        "a line",
    ]
    for data in (None, {}, {DATA_KEY: "{not json"}, {DATA_KEY: json.dumps({"a": 1})}, {DATA_KEY: json.dumps(rows)}):
        ledger.merge(data, NOW)
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1)) == 8


def test_the_cache_hands_over_a_job_deleted_or_made_anew_under_its_name():
    cache = WatchCache()
    first = job("uid-1")
    cache.apply("job", first.key, first)
    cache.apply("job", first.key, dataclasses.replace(first, resource_version="2"))  # an update
    assert cache.deleted_jobs == []
    second = job("uid-2")
    cache.apply("job", second.key, second)  # deleted and made again while the watch was down
    cache.apply("job", second.key, None)
    assert [v.uid for v in cache.deleted_jobs] == ["uid-1", "uid-2"]


def test_a_job_already_handed_over_adds_nothing_from_an_older_view():
    ledger = DisruptionLedger()
    ledger.add_deleted(job(), {"evictionHistory": [record(5, 32)]}, NOW)
    older = {"evictionHistory": [record(50, 16)]}  # a replica's view from before the last eviction
    ledger.add_deleted(job(), older, NOW + dt.timedelta(minutes=1))
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1)) == 32


def test_records_of_jobs_that_exist_and_far_future_records_do_not_count():
    ledger = DisruptionLedger()
    ledger.add_deleted(job("uid-1"), {"evictionHistory": [record(5, 32)]}, NOW)
    ledger.add_deleted(job("uid-2"), {"evictionHistory": [record(5, 8)]}, NOW)
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1), live={"uid-2"}) == 32
    future = [{"job": "uid-3", "at": "2099-01-01T00:00:00Z", "gpus": 4096}]
    ledger.merge({DATA_KEY: json.dumps(future)}, NOW)  # would never age out
    assert ledger.gpus_since(NOW - dt.timedelta(hours=1)) == 40


class BrokenApi:
    def read_config_map(self, namespace, name):
        raise OSError("connection refused")

    def save_config_map(self, namespace, name, data, resource_version):
        raise AssertionError("never saved without a read")


def test_until_the_configmap_is_read_the_budget_counts_as_used_up_for_at_most_an_hour():
    store = LedgerStore("tidal-system", "tidal-disruptions")
    store.update(BrokenApi(), [(job(), {"evictionHistory": [record(5, 8)]})], NOW)
    assert store.gpus(NOW, (), budget=64) == 64, "jobs deleted before this replica started are unknown"
    assert store.gpus(NOW, (), budget=None) == 8
    later = NOW + dt.timedelta(minutes=61)
    assert store.gpus(later, (), budget=64) == 0, "an hour on, nothing unknown can still count"
    assert LedgerStore(None, "x").gpus(NOW, (), budget=64) == 0, "in memory only: nothing to wait for"


def test_a_save_from_an_old_read_overwrites_nothing_and_is_merged_next_cycle(monkeypatch):
    cluster = FakeCluster("hgx8", 1)
    a, b = LedgerStore("ns", "cm"), LedgerStore("ns", "cm")
    b.update(cluster, [], NOW)  # B reads (nothing yet)
    a.update(cluster, [(job("uid-a"), {"evictionHistory": [record(1, 32)]})], NOW)
    real_read = cluster.read_config_map
    monkeypatch.setattr(cluster, "read_config_map", lambda ns, name: (None, None))  # B's read was before A's save
    b.update(cluster, [(job("uid-b"), {"evictionHistory": [record(1, 8)]})], NOW)  # 409: not written
    monkeypatch.setattr(cluster, "read_config_map", real_read)
    assert json.loads(cluster.config_maps[("ns", "cm")][0][DATA_KEY])[0]["job"] == "uid-a"
    assert b.ledger.changed, "still behind: tried again"
    b.update(cluster, [], NOW + dt.timedelta(seconds=1))
    saved = json.loads(cluster.config_maps[("ns", "cm")][0][DATA_KEY])
    assert sorted(r["job"] for r in saved) == ["uid-a", "uid-b"]
    assert b.gpus(NOW, (), budget=64) == 40


@pytest.mark.parametrize(
    ("step", "cycles", "reads"),
    [(1, 3, 1), (10, 1, 2), (1, 31, 2)],
    ids=["cycles a second apart", "after a pause", "every 30 s"],
)
def test_the_configmap_is_read_again_after_a_pause_or_periodically(step, cycles, reads):
    cluster = FakeCluster("hgx8", 1)
    store = LedgerStore("ns", "cm")
    store.update(cluster, [], NOW)
    for k in range(1, cycles + 1):
        store.update(cluster, [], NOW + dt.timedelta(seconds=k * step))
    assert cluster.requests["get_configmap"] == reads
