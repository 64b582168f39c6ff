"""The disruption budget's ledger of deleted jobs (k8s/disruption_ledger.py), function by function;
the operator-level case (deleted, restarted, aged out) is in test_rebalance.py."""

import dataclasses
import datetime as dt
import json

from tidal.clock import rfc3339
from tidal.k8s.disruption_ledger import DATA_KEY, DisruptionLedger
from tidal.k8s.state import ResourceView
from tidal.k8s.watch import WatchCache

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
    ledger.add_deleted(job(), status, NOW)  # the same deletion seen again (a relisting)
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
