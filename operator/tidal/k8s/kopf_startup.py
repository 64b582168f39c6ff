"""kopf's startup gate, made linear: a restarted operator's warm-up at thousands of nodes.

kopf holds every handler and timer until each indexed object of the first listings has been
indexed (`operator_indexed`, an `aiotoggles.ToggleSet` of one toggle per object). Each object's
worker drops its toggle and waits for the whole set; kopf 1.45's `make_toggle` and `drop_toggle`
notify *every* waiter on *every* call, and each woken waiter takes the condition's lock in turn to
re-check the set. With n objects that is O(n^2) lock hand-offs before the first handler runs:
1,000 objects 33 s, 2,000 objects 121 s on the shared 2-core machine (a model of the gate driven
as kopf's watcher drives it), which was ~45 s of a 59 s warm-up at 1,008 nodes and 768 pods
(tests/cluster/test_warm_restart.py).

Adding or dropping a toggle changes no individual toggle's state, so the only waiters that can
proceed afterwards are those of the set's own state: we notify only when `is_on()` changed. Waits
on single toggles (`Toggle.turn_to` notifies as before) are unaffected.

The gate's two moments a warm-up is made of are logged at INFO (bench.operator times the warm-up's
phases from them): each resource kind's first listing received, and the gate opening.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from kopf._cogs.aiokits import aiotoggles

log = structlog.get_logger("tidal")

_PATCHED = "_tidal_linear_gate"
_NOT_A_LISTING = "orchestration blocker"
"""kopf's own toggle held while it spawns the watchers; each other toggle not named after an object
key (a tuple's repr) is one resource kind's first listing."""


def _note_drops(gate: aiotoggles.ToggleSet, dropped: list[aiotoggles.Toggle], before: bool) -> None:
    # Only kopf's indexing gate is a ToggleSet(all); its peering pause is a ToggleSet(any).
    if gate._fn is not all:
        return
    for toggle in dropped:
        name = toggle.name or ""
        if name and name != _NOT_A_LISTING and not name.startswith("("):
            log.info("startup gate: listing received", resource=name, objects_not_indexed=len(gate._toggles))
    if not before and gate.is_on():
        log.info("startup gate open: every listed object indexed")


async def _make_toggle(
    self: aiotoggles.ToggleSet, __val: bool = False, *, name: str | None = None
) -> aiotoggles.Toggle:
    toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
        _note_drops(self, [toggle], before)


async def _drop_toggles(self: aiotoggles.ToggleSet, toggles: Iterable[aiotoggles.Toggle]) -> None:
    toggles = list(toggles)
    async with self._condition:
        before = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != before:
            self._condition.notify_all()
        _note_drops(self, toggles, before)


def install() -> bool:
    """Patch kopf's ToggleSet (idempotent); False, and kopf untouched, if its internals moved."""
    cls = aiotoggles.ToggleSet
    if getattr(cls, _PATCHED, False):
        return True
    probe = cls(all)
    if not all(hasattr(probe, a) for a in ("_condition", "_toggles", "_fn", "is_on")) or not all(
        hasattr(cls, m) for m in ("make_toggle", "drop_toggle", "drop_toggles")
    ):
        log.warning("kopf's ToggleSet changed; startup gate left as is (slow warm-up at many objects)")
        return False
    cls.make_toggle = _make_toggle  # type: ignore[method-assign]
    cls.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    cls.drop_toggles = _drop_toggles  # type: ignore[method-assign]
    setattr(cls, _PATCHED, True)
    return True
