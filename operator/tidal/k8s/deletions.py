"""Deleted tidal objects kopf has not let go of: nudged with an annotation so kopf looks again.

kopf keeps its finalizer on every object that has a timer (tidal's cycle ticks from them) and
takes it off, once the object is deleted, in one JSON patch. It tries that patch again only on the
object's next watch event, and a deleted object gets none from tidal: no status is written to it
and its timer has stopped. One refused patch (a 409, or a connection lost through all of kopf's
retries) would keep it for good, `kubectl delete` waiting on it. A timer still in its tick when the
object is deleted delays the release the same way, by kopf's 60 s cancellation polling.

So a deleted object still holding kopf's finalizer `NUDGE_SECONDS` after tidal first saw it deleted
gets an annotation write (a watch event, on which kopf tries again), and again every
`NUDGE_SECONDS` while it is there. Time is measured from when this operator first saw the deletion,
on its own monotonic clock: a restarted operator waits a full interval before its first nudge.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable

from tidal import API_GROUP
from tidal.k8s.state import ResourceView

FINALIZER = f"{API_GROUP}/finalizer"
"""kopf's finalizer on tidal's objects (set as `settings.persistence.finalizer` in handlers.py)."""
NUDGE_ANNOTATION = f"{API_GROUP}/deletion-nudged"
NUDGE_SECONDS = 10.0


class DeletionNudger:
    def __init__(self, after: float = NUDGE_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.after = after
        self.clock = clock
        self._due: dict[str, float] = {}
        """uid -> when (monotonic) a deleted object still held by kopf's finalizer is nudged next."""

    def due(self, views: Iterable[ResourceView]) -> list[ResourceView]:
        """The deleted objects to nudge now; each is due again `after` seconds later."""
        now = self.clock()
        held = [v for v in views if v.deleting and FINALIZER in v.finalizers]
        self._due = {v.uid: self._due.get(v.uid, now + self.after) for v in held}
        ready = [v for v in held if self._due[v.uid] <= now]
        for v in ready:
            self._due[v.uid] = now + self.after
        return ready


def nudge_annotation() -> dict[str, str | None]:
    # A new value every time: an unchanged annotation would be a no-op write and bring no event.
    return {NUDGE_ANNOTATION: dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")}
