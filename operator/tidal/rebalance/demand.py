"""Desired inference replicas = max(time-of-day floor, requested replicas, load), within
[min, max], stabilized.

Three signals each ask for *at least* so many replicas, and the largest wins: the schedule floor,
`spec.replicas` (written by an HPA, KEDA or `kubectl scale` through the scale subresource) and
the load signal (`spec.load`). None can take the pool below another: an autoscaler's scale-down
never undercuts the day's floor, and two autoscalers that disagree never under-provision. The
result is then clamped to [minReplicas, maxReplicas], so maxReplicas bounds every signal.

Scale-up follows demand at once; scale-down waits until the demand has stayed lower for a whole
stabilization window (the largest desired value seen in the window wins), so a noisy signal
cannot make the pool, and the training behind it, flap.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def schedule_floor(schedule: dict | None, min_replicas: int, now: dt.datetime) -> tuple[int, str]:
    """(floor, why): the largest minReplicas of the open windows, else the pool's minReplicas."""
    if not schedule or not schedule.get("windows"):
        return min_replicas, "minReplicas"
    local = now.astimezone(ZoneInfo(schedule.get("timezone", "UTC")))
    minute = local.hour * 60 + local.minute
    best, why = min_replicas, "outside every schedule window"
    for w in schedule["windows"]:
        start, end = _minutes(w["start"]), _minutes(w["end"])
        is_open = start <= minute < end if start <= end else (minute >= start or minute < end)
        if is_open and w["minReplicas"] >= best:
            best, why = w["minReplicas"], f"window {w['start']}-{w['end']} {schedule.get('timezone', 'UTC')}"
    return max(best, min_replicas), why


SCHEDULE_STEP = dt.timedelta(minutes=10)
"""How finely `scheduled_rise_s` walks the schedules (a window opens at a minute of the day; a
rise is seen at most this late, and a grow-back looks this much less far)."""


@dataclass(frozen=True)
class ScheduledPool:
    """What a pool's schedule will ask of the GPUs: its spec (API field names) and what it holds."""

    spec: dict
    placed: int
    """Replicas it holds now."""

    @property
    def replica_gpus(self) -> int:
        return self.spec.get("tp", 1) * self.spec.get("ep", 1)


def scheduled_rise_s(pools: list[ScheduledPool], now: dt.datetime, spare_gpus: int, horizon_s: float) -> float:
    """Seconds until the pools' schedule floors rise by more GPUs than `spare_gpus` (the free GPUs
    a decision leaves), or `horizon_s` if not before then. A rise is counted from what a pool
    holds or its floor asks now, whichever is more: a floor unmet now (a pool that does not fit)
    is today's shortfall, not the schedule's coming demand. The operator's only forecast: the
    schedule is what the pool's owner said the day will ask for (its live load is not foreseen).
    A grow-back weighs its cost against the work it does until then (`ResizeCosts.grow_pays`)."""

    def floor_at(pool: ScheduledPool, at: dt.datetime) -> int:
        floor, _ = schedule_floor(pool.spec.get("schedule"), pool.spec.get("minReplicas", 0), at)
        return min(floor, pool.spec.get("maxReplicas", floor))

    base = [max(pool.placed, floor_at(pool, now)) for pool in pools]
    end = now + dt.timedelta(seconds=horizon_s)
    steps = int(horizon_s // SCHEDULE_STEP.total_seconds())
    # Every step, and every window's opening (a window shorter than a step falls between steps).
    instants = {now + k * SCHEDULE_STEP for k in range(1, steps + 1)}
    instants.update(t for pool in pools for t in _window_starts(pool.spec.get("schedule"), now, end))
    for at in sorted(instants):
        wanted = 0
        for pool, held in zip(pools, base, strict=True):
            wanted += max(floor_at(pool, at) - held, 0) * pool.replica_gpus
        if wanted > spare_gpus:
            return (at - now).total_seconds()
    return horizon_s


def _window_starts(schedule: dict | None, now: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The instants in (now, end] at which one of the schedule's windows opens."""
    if not schedule or not schedule.get("windows"):
        return []
    zone = ZoneInfo(schedule.get("timezone", "UTC"))
    today = now.astimezone(zone).date()
    out = []
    for days in range(int((end - now).total_seconds() // 86_400) + 2):
        day = today + dt.timedelta(days=days)
        for w in schedule["windows"]:
            h, m = (int(x) for x in w["start"].split(":"))
            at = dt.datetime.combine(day, dt.time(h, m), tzinfo=zone).astimezone(now.tzinfo or dt.UTC)
            if now < at <= end:
                out.append(at)
    return out


def desired_replicas(spec: dict, now: dt.datetime, current_rate: float | None) -> tuple[int, str]:
    """Unstabilized desired replicas and the reason, from a pool spec (API field names).

    On a tie the earlier signal names the reason: schedule, then spec.replicas, then load."""
    floor, why = schedule_floor(spec.get("schedule"), spec.get("minReplicas", 0), now)
    desired = floor
    requested = spec.get("replicas")
    if requested is not None and requested > desired:
        desired, why = requested, f"spec.replicas {requested} (autoscaler or kubectl scale)"
    load = spec.get("load")
    if load and current_rate is not None and math.isfinite(current_rate):
        by_load = math.ceil(current_rate / load["targetPerReplica"] - 1e-9)
        if by_load > desired:
            desired, why = by_load, f"load {current_rate:g} req/s / {load['targetPerReplica']:g} per replica"
    bounded = min(max(desired, spec.get("minReplicas", 0)), spec["maxReplicas"])
    if bounded != desired:
        why += f" (bounded to {bounded})"
    return bounded, why


@dataclass
class DemandTracker:
    """Per-pool history of desired replicas for the scale-down stabilization window."""

    window: dt.timedelta = dt.timedelta(minutes=5)
    history: dict[str, list[tuple[dt.datetime, int]]] = field(default_factory=dict)

    def stabilized(self, pool: str, now: dt.datetime, desired: int, last: int | None = None) -> int:
        """The largest desired value of the window. `last`: what the pool last held and still
        wanted (the operator passes its status' placed replicas, at most its desired ones), taken
        as seen now when this tracker has no history of the pool (a restarted or new active
        operator), so a restart never skips the window and drops warm replicas at once."""
        if pool not in self.history and last is not None:
            self.history[pool] = [(now, last)]
        points = [(t, d) for t, d in self.history.get(pool, []) if now - t < self.window and t <= now]
        points.append((now, desired))
        self.history[pool] = points
        return max(d for _, d in points)

    def forget(self, live: set[str]) -> None:
        for pool in list(self.history):
            if pool not in live:
                del self.history[pool]
