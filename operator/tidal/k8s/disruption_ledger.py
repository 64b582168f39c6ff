"""The disruption budget's memory of deleted TrainingJobs.

The hourly budget (`--disruption-budget-gpus-per-hour`) is counted from each job's
`status.evictionHistory`. A job deleted within the hour of its eviction (a pipeline that deletes
finished jobs, a user who resubmits a suspended one) would take its records with it and let the
rebalancer and defragmentation evict the same GPUs again in that hour. So the records of the last
hour of every deleted job move here, and from here into a ConfigMap (`--state-namespace`), read
back when this operator starts or takes over, so neither a deletion nor a restart resets the budget.
Replicas write it read-merge-write, conditional on the resourceVersion read, so a replica that was
standing by never overwrites what the active one saved.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from tidal.clock import parse_time, rfc3339
from tidal.k8s.cycle import log
from tidal.k8s.state import ResourceView
from tidal.k8s.training import DEFRAGMENTED, HISTORY_WINDOW, REBALANCED, leaving_groups

DISRUPTIONS = frozenset({REBALANCED, DEFRAGMENTED})
"""Eviction reasons that draw on the hourly disruption budget: the rebalancer's and defragmentation's."""
CONFIGMAP_SUFFIX = "-disruptions"
"""The ConfigMap is named after the operator's peering name (the chart's release), so two releases
in one namespace keep their own."""
DATA_KEY = "records.json"
CLOCK_SLACK = dt.timedelta(minutes=10)


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
        """Records were added or aged out since the ConfigMap was last written: it is behind."""

    def add_deleted(self, view: ResourceView, status: dict[str, Any], now: dt.datetime) -> None:
        """Keep what a deleted job's status counted against the budget in the last hour. An
        eviction still under way when the job went counts as taken now. A job the ledger already
        has records of was already handed over (by this replica, or by another one whose records
        were merged first), maybe from a newer view: seen again, it adds nothing."""
        if any(r.job == view.uid for r in self.records):
            return
        for at, gpus in disruption_records(status, now - HISTORY_WINDOW):
            self._add(LedgerRecord(view.uid, min(at, now), gpus))
        self._add(LedgerRecord(view.uid, now, leaving_disruption_gpus(view, status)))

    def gpus_since(self, since: dt.datetime, live: Collection[str] = ()) -> int:
        """GPUs of the records after `since`, but for jobs in `live` (uids of jobs that exist:
        counted from their own status, should one have been handed over by mistake)."""
        return sum(r.gpus for r in self.records if r.at > since and r.job not in live)

    def age_out(self, now: dt.datetime) -> None:
        since = now - HISTORY_WINDOW
        old = {r for r in self.records if r.at <= since}
        if old:
            self.records -= old
            self.changed = True

    def merge(self, data: dict[str, str] | None, now: dt.datetime) -> None:
        """Add the records of a ConfigMap's data (what this or another replica saved); the ConfigMap
        is behind when it lacks any record kept here. A record more than `CLOCK_SLACK` in the
        future (a hand edit, a clock far off) would never age out: it is dropped."""
        since, latest = now - HISTORY_WINDOW, now + CLOCK_SLACK
        saved = {r for r in _decode(data) if since < r.at <= latest}
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


REREAD = dt.timedelta(seconds=30)
"""The active replica reads the ConfigMap again this often, and after any pause between cycles
longer than `PAUSE` (a standby resumed by peering): what another replica saved meanwhile counts."""
PAUSE = dt.timedelta(seconds=5)
RETRY_SECONDS = 30.0
"""After a failed read or write, the next try waits this long: a ConfigMap call must not stall
every cycle (its calls are not retried within the cycle)."""


class LedgerStore:
    """The ledger kept in step with its ConfigMap (None: in memory only)."""

    def __init__(self, namespace: str | None, name: str) -> None:
        self.namespace, self.name = namespace, name
        self.ledger = DisruptionLedger()
        self.read_at: dt.datetime | None = None
        """When (operator clock) the ConfigMap was last read; None: never, since this replica started."""
        self.started_at: dt.datetime | None = None
        self.last_cycle: dt.datetime | None = None
        self.retry_at = 0.0
        self.failing = False

    def update(self, api: Any, deleted: list[tuple[ResourceView, dict[str, Any]]], now: dt.datetime) -> None:
        """Merge what the ConfigMap holds (when due, and always before taking deleted jobs, so one
        another replica already handed over is not counted twice), take the deleted jobs, age
        records out, and write the ConfigMap if it is behind."""
        self.started_at = self.started_at or now
        version: str | None = None
        read = False
        if self.namespace and time.monotonic() >= self.retry_at and (deleted or self.ledger.changed or self._due(now)):
            try:
                data, version = api.read_config_map(self.namespace, self.name)
                self.ledger.merge(data, now)
                self.read_at, read = now, True
            except Exception as e:
                self._failed(e)
        self.last_cycle = now
        for view, status in deleted:
            try:
                self.ledger.add_deleted(view, status, now)
            except Exception:  # one unreadable job must not fail every cycle
                log.exception("deleted job's disruptions not kept", namespace=view.namespace, name=view.name)
        self.ledger.age_out(now)
        if not (read and self.ledger.changed):
            self.failing = self.failing and not read
            return
        try:
            api.save_config_map(self.namespace, self.name, self.ledger.data(), version)
            self.ledger.changed = False
            self.failing = False
        except ApiException as e:
            if e.status != 409:
                self._failed(e)
            # 409: another replica wrote since the read; the next cycle reads and merges again.
        except Exception as e:
            self._failed(e)

    def gpus(self, now: dt.datetime, live: Collection[str], budget: int | None) -> int:
        """GPUs the budget counts this hour for deleted jobs. Until the ConfigMap has been read
        once, for at most an hour after this replica started, the budget counts as used up: the
        jobs deleted before the restart are unknown, and the budget is a limit, so it fails closed."""
        unknown = self.namespace and self.read_at is None and self.started_at and now - self.started_at < HISTORY_WINDOW
        if unknown and budget is not None:
            return budget
        return self.ledger.gpus_since(now - HISTORY_WINDOW, live)

    def _due(self, now: dt.datetime) -> bool:
        if self.read_at is None or now < self.read_at or now - self.read_at >= REREAD:
            return True
        return self.last_cycle is None or now - self.last_cycle > PAUSE

    def _failed(self, error: Exception) -> None:
        self.retry_at = time.monotonic() + RETRY_SECONDS
        if not self.failing:
            log.warning(
                "disruption ledger not read or saved; tried again in 30 s",
                namespace=self.namespace,
                name=self.name,
                error=str(error)[:200],
                budget_fails_closed=self.read_at is None,
            )
        self.failing = True
