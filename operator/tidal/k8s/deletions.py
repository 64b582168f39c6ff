"""Deleted tidal objects kopf has not let go of: nudged with an annotation so kopf looks again.

kopf keeps its finalizer on every object that has a timer (tidal's cycle ticks from them) and
takes it off, once the object is deleted, in one JSON patch. When that patch fails with an error
kopf's client does not retry (a 409 or 400, a closed session, a 5xx or timeout through all its
retries), kopf logs it and tries again only on the object's next watch event; a deleted object
gets none from tidal (no status is written to it, its timer has stopped), so it would stay, and
`kubectl delete` wait, for good. A timer still in its tick when the object is deleted also delays
the release, by up to kopf's cancellation polling (set shorter in handlers.configure).

So a deleted object still holding kopf's finalizer `NUDGE_SECONDS` after this operator first saw
it deleted gets an annotation write, a watch event on which kopf tries again; then again after 2x,
4x ... the interval, capped at `NUDGE_CAP_SECONDS`: kopf throttles an object whose processing
keeps failing (its delays grow to minutes) and drops the events that arrive meanwhile, so nudging
faster would only add writes. Time runs on this operator's monotonic clock from when it first saw
the deletion; a restarted operator needs no nudge for what it lists (kopf processes every listed
object), and nudges later ones after a full interval.

The writes are made off the cycle, one round at a time: a write that hangs or is throttled delays
the next round, never the cycle's placements.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import structlog

from tidal import API_GROUP
from tidal.k8s.state import ResourceView

log = structlog.get_logger("tidal")

FINALIZER = f"{API_GROUP}/finalizer"
"""kopf's finalizer on tidal's objects (set as `settings.persistence.finalizer` in handlers.py)."""
NUDGE_ANNOTATION = f"{API_GROUP}/deletion-nudged"
NUDGE_SECONDS = 10.0
NUDGE_CAP_SECONDS = 300.0
NUDGES_PER_ROUND = 20
"""A mass deletion is nudged over several rounds, the longest-waiting first, not all at once."""


class DeletionNudger:
    def __init__(
        self,
        after: float = NUDGE_SECONDS,
        cap: float = NUDGE_CAP_SECONDS,
        per_round: int = NUDGES_PER_ROUND,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.after = after
        self.cap = cap
        self.per_round = per_round
        self.clock = clock
        self._schedule: dict[str, tuple[float, float]] = {}
        """uid -> (when it is next due, the interval after that) for deleted objects kopf holds."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-nudge")
        self._round: Future[None] | None = None

    def due(self, views: Iterable[ResourceView]) -> list[ResourceView]:
        """The deleted objects to nudge now, longest-waiting first; each next due after a doubled
        interval. Objects no longer deleted-and-held are forgotten."""
        now = self.clock()
        held = [v for v in views if v.deleting and FINALIZER in v.finalizers]
        self._schedule = {v.uid: self._schedule.get(v.uid, (now + self.after, self.after)) for v in held}
        ready = sorted((v for v in held if self._schedule[v.uid][0] <= now), key=lambda v: self._schedule[v.uid][0])
        ready = ready[: self.per_round]
        for v in ready:
            interval = min(self._schedule[v.uid][1] * 2, self.cap)
            self._schedule[v.uid] = (now + self._schedule[v.uid][1], interval)
        return ready

    def nudge(self, api: Any, views: Iterable[ResourceView]) -> Future[None] | None:
        """Start a round of nudges in the background, unless the last round is still going."""
        if self._round is not None and not self._round.done():
            return None
        ready = self.due(views)
        if not ready:
            return None
        self._round = self._pool.submit(_nudge_all, api, ready)
        return self._round

    def wait(self) -> None:
        """Until the round in flight (if any) is over."""
        if self._round is not None:
            self._round.result()


def _nudge_all(api: Any, views: list[ResourceView]) -> None:
    for view in views:
        try:
            # A new value every time: an unchanged annotation would be a no-op write, with no event.
            stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
            api.annotate(view.kind, view.namespace, view.name, {NUDGE_ANNOTATION: stamp})
            log.info("deleted object still held by kopf's finalizer: nudged", kind=view.kind, name=view.ref)
        except Exception as e:  # nudged again after the next interval
            log.warning("deletion nudge failed", kind=view.kind, name=view.ref, error=str(e)[:200])
