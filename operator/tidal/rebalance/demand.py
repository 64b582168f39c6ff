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
