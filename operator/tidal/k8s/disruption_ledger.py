"""The disruption budget's memory of deleted TrainingJobs.

The hourly budget (`--disruption-budget-gpus-per-hour`) is counted from each job's
`status.evictionHistory`. A job deleted within the hour of its eviction (a pipeline that deletes
finished jobs, a user who resubmits a suspended one) would take its records with it and let the
rebalancer and defragmentation evict the same GPUs again in that hour. So the records of the last
hour of every deleted job move here, and from here into a ConfigMap (`--state-namespace`), read
back when this operator starts or takes over, so neither a deletion nor a restart resets the budget.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tidal.clock import parse_time, rfc3339
from tidal.k8s.state import ResourceView
from tidal.k8s.training import DEFRAGMENTED, HISTORY_WINDOW, REBALANCED, leaving_groups

DISRUPTIONS = frozenset({REBALANCED, DEFRAGMENTED})
"""Eviction reasons that draw on the hourly disruption budget: the rebalancer's and defragmentation's."""
CONFIGMAP_NAME = "tidal-disruptions"
DATA_KEY = "records.json"


def disruption_records(status: dict[str, Any], since: dt.datetime) -> Iterable[tuple[dt.datetime, int]]:
    """(when, GPUs) of each eviction in `status.evictionHistory` after `since` that the budget counts."""
    for record in status.get("evictionHistory", []):
        at = parse_time(record.get("at"))
        if record.get("reason") in DISRUPTIONS and at is not None and at > since:
            yield at, int(record.get("gpus", 0))


def leaving_disruption_gpus(view: ResourceView, status: dict[str, Any]) -> int:
    """GPUs a disruption under way is taking from the job (counted before its record is written)."""
    if (status.get("eviction") or {}).get("reason") not in DISRUPTIONS:
        return 0
    evicting, gpus_per_pod = leaving_groups(view, status)
    return sum(len(g["nodes"]) for g in evicting) * gpus_per_pod


@dataclass(frozen=True)
class LedgerRecord:
    job: str
    """The deleted job's uid: a second copy of the same record (a reload, another replica) is one record."""
    at: dt.datetime
    gpus: int


class DisruptionLedger:
    def __init__(self) -> None:
        self.records: set[LedgerRecord] = set()
        self.changed = False
        """Records were added or aged out since the last `saved()`: the ConfigMap is behind."""

    def add_deleted(self, view: ResourceView, status: dict[str, Any], now: dt.datetime) -> None:
        """Keep what a deleted job's status counted against the budget in the last hour. An
        eviction still under way when the job went counts as taken now."""
        for at, gpus in disruption_records(status, now - HISTORY_WINDOW):
            self._add(LedgerRecord(view.uid, at, gpus))
        self._add(LedgerRecord(view.uid, now, leaving_disruption_gpus(view, status)))

    def gpus_since(self, since: dt.datetime) -> int:
        return sum(r.gpus for r in self.records if r.at > since)

    def age_out(self, now: dt.datetime) -> None:
        since = now - HISTORY_WINDOW
        old = {r for r in self.records if r.at <= since}
        if old:
            self.records -= old
            self.changed = True

    def merge(self, data: dict[str, str] | None, now: dt.datetime) -> None:
        """Add the records of a ConfigMap's data (what this or another replica saved); the ConfigMap
        is behind when it lacks any record kept here."""
        since = now - HISTORY_WINDOW
        saved = {r for r in _decode(data) if r.at > since}
        if not self.records <= saved:
            self.changed = True
        self.records |= saved

    def data(self) -> dict[str, str]:
        rows = sorted(self.records, key=lambda r: (r.at, r.job, r.gpus))
        return {DATA_KEY: json.dumps([{"job": r.job, "at": rfc3339(r.at), "gpus": r.gpus} for r in rows])}

    def _add(self, record: LedgerRecord) -> None:
        if record.gpus > 0 and record not in self.records:
            self.records.add(record)
            self.changed = True


def _decode(data: dict[str, str] | None) -> Iterable[LedgerRecord]:
    """Records of a ConfigMap's data; anything unreadable is skipped (a hand edit must not stop the cycle)."""
    try:
        rows = json.loads((data or {}).get(DATA_KEY) or "[]")
    except ValueError:
        return
    if not isinstance(rows, list):
        return
    for row in rows:
        if not isinstance(row, dict):
            continue
        at = parse_time(row.get("at"))
        try:
            gpus = int(row.get("gpus", 0))
        except (TypeError, ValueError):
            continue
        if at is not None and gpus > 0 and isinstance(row.get("job"), str):
            yield LedgerRecord(row["job"], at, gpus)
