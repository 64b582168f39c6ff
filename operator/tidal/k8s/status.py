"""Status writes with a ledger, so a cycle never acts on a status older than the one it wrote.

The watch (and so the kopf index) lags our own writes by a little; the ledger holds what we wrote
until the index shows it. Statuses are validated against the pydantic models before they are sent:
the CRD schema would otherwise silently prune a misspelt field.
"""

from __future__ import annotations

import time
from typing import Any

from tidal.k8s import compact
from tidal.k8s.api import Api
from tidal.k8s.state import ResourceView
from tidal.model import InferencePoolStatus, SupernodeStatus, TrainingJobStatus

_MODELS = {"TrainingJob": TrainingJobStatus, "InferencePool": InferencePoolStatus, "Supernode": SupernodeStatus}
LEDGER_TTL_SECONDS = 60.0


def set_condition(
    conditions: list[dict[str, Any]], ctype: str, status: bool, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """Conditions with `ctype` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    out = []
    found = False
    for c in conditions:
        if c.get("type") == ctype:
            found = True
            moved = c.get("status") != value
            c = {**c, "status": value, "reason": reason, "message": message}
            if moved or not c.get("lastTransitionTime"):
                c["lastTransitionTime"] = now
        out.append(c)
    if not found:
        out.append({"type": ctype, "status": value, "reason": reason, "message": message, "lastTransitionTime": now})
    return out


def condition(conditions: list[dict[str, Any]], ctype: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


class StatusWriter:
    """TrainingJob placements are held expanded (a list of groups) and written compacted
    (`status.assignment`, k8s/compact.py); the decoded form is kept per status object read."""

    def __init__(self, api: Api):
        self.api = api
        self._ledger: dict[str, tuple[dict[str, Any], float]] = {}
        self._decoded: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def observed(self, view: ResourceView) -> dict[str, Any]:
        """The status as read, in the operator's form (decoded once per object seen)."""
        if view.kind != "TrainingJob":
            return view.status
        seen = self._decoded.get(view.uid)
        if seen is not None and seen[0] is view.status:
            return seen[1]
        held = compact.from_wire(view.status)
        self._decoded[view.uid] = (view.status, held)
        return held

    def effective(self, view: ResourceView) -> dict[str, Any]:
        observed = self.observed(view)
        entry = self._ledger.get(view.uid)
        if entry is None:
            return observed
        written, at = entry
        caught_up = all(observed.get(k) == v for k, v in written.items())
        if caught_up or time.monotonic() - at > LEDGER_TTL_SECONDS:
            del self._ledger[view.uid]
            return observed
        return written

    def write(self, view: ResourceView, status: dict[str, Any]) -> bool:
        """Send `status` if it differs from the effective one; keys it lacks are removed.
        Returns False only when the patch failed (the caller must try again), else True."""
        status = {k: v for k, v in status.items() if v is not None}
        current = self.effective(view)
        if all(current.get(k) == v for k, v in status.items()) and set(current) <= set(status) | _defaulted(current):
            return True
        wire = compact.to_wire(status) if view.kind == "TrainingJob" else status
        _MODELS[view.kind].model_validate(wire)
        wire_current = compact.to_wire(current) if view.kind == "TrainingJob" else current
        patch: dict[str, Any] = {k: None for k in {*wire_current, *view.status} if k not in wire}
        patch.update(wire)
        if not self.api.patch_status(view.kind, view.namespace, view.name, patch):
            return False
        self._ledger[view.uid] = (status, time.monotonic())
        return True

    def forget(self, live_uids: set[str]) -> None:
        for store in (self._ledger, self._decoded):
            for uid in [u for u in store if u not in live_uids]:
                del store[uid]


def _defaulted(status: dict[str, Any]) -> set[str]:
    """Keys the API server fills from schema defaults; their presence alone is no change."""
    return {k for k, v in status.items() if v in (0, [], "", "Pending")}
