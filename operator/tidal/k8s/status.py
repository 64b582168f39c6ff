"""Status writes with a ledger, so a cycle never acts on a status older than the one it wrote.

The watch (and so the kopf index) lags our own writes by a little; the ledger holds what we wrote,
as the API server stores it (the CRD schema's defaults filled in, model/server_defaults.py), until
the index shows it. Statuses are validated against the pydantic models before they are sent:
the CRD schema would otherwise silently prune a misspelt field.

Every write carries the resourceVersion of the status it was decided from: the one the ledger
holds (what our last write returned) while the index lags, else the one the index read. A 409
means the object moved on since. Moved by something that left the status as we decided from it
(our own write through a lagging index, an annotation, a spec edit), the write is sent again
against the fresh version; moved to a status of someone else's, it is not sent: the write fails,
the fresh status goes into the ledger, and the next cycle decides from it.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from tidal.k8s import compact
from tidal.k8s.api import Api, StatusConflict
from tidal.k8s.state import ResourceView
from tidal.model import InferencePoolStatus, SupernodeStatus, TrainingJobStatus
from tidal.model.server_defaults import status_as_stored

_MODELS = {"TrainingJob": TrainingJobStatus, "InferencePool": InferencePoolStatus, "Supernode": SupernodeStatus}
LEDGER_TTL_SECONDS = 60.0
CONFLICT_ATTEMPTS = 3
"""Sends of one status write at most: each 409 that finds the status still as decided from
re-reads the object and sends again; a third 409 in a row leaves it to the next cycle."""
log = structlog.get_logger("tidal")


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
    (`status.assignment`, k8s/compact.py). Every status, ours and read, is held as the API server
    stores it under the models' CRD (`status_as_stored`), so that they compare equal exactly when
    they are; the form is kept per status object read."""

    def __init__(self, api: Api):
        self.api = api
        self._ledger: dict[str, tuple[dict[str, Any], float, str]] = {}
        """uid -> (status as held, when, the object's resourceVersion holding it)."""
        self._decoded: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def observed(self, view: ResourceView) -> dict[str, Any]:
        """The status as read, in the operator's form: placements decoded, and as the models'
        CRD would store it (`status_as_stored`: the installed CRD may be older or newer than the
        operator). Made once per object version seen."""
        seen = self._decoded.get(view.uid)
        if seen is not None and seen[0] is view.status:
            return seen[1]
        held = self._as_held(view.kind, view.status)
        self._decoded[view.uid] = (view.status, held)
        return held

    def effective(self, view: ResourceView) -> dict[str, Any]:
        observed = self.observed(view)
        entry = self._ledger.get(view.uid)
        if entry is None:
            return observed
        written, at, _ = entry
        caught_up = all(observed.get(k) == v for k, v in written.items())
        if caught_up or time.monotonic() - at > LEDGER_TTL_SECONDS:
            del self._ledger[view.uid]
            return observed
        return written

    def version(self, view: ResourceView) -> str:
        """The resourceVersion of the status `effective` returns."""
        entry = self._ledger.get(view.uid)
        return entry[2] if entry is not None else view.resource_version

    def write(self, view: ResourceView, status: dict[str, Any]) -> bool:
        """Send `status` if it differs from the effective one; keys it lacks are removed.
        Returns False when it was not written (the caller must decide again), else True."""
        status = {k: v for k, v in status.items() if v is not None}
        base = self.effective(view)
        if base == status:  # the usual case, decided from what is held and left as it was
            return True
        wire = compact.to_wire(status) if view.kind == "TrainingJob" else status
        stored = self._as_held(view.kind, wire)
        if base == stored:  # differs only by what the API server fills in
            return True
        _MODELS[view.kind].model_validate(wire)
        wire_base = compact.to_wire(base) if view.kind == "TrainingJob" else base
        olds = [wire_base, view.status]
        version = self.version(view)
        for _ in range(CONFLICT_ATTEMPTS):
            patch = _merge_patch(olds, wire)
            try:
                written = self.api.patch_status(view.kind, view.namespace, view.name, patch, version or None)
            except StatusConflict:
                fresh = self.api.read_status(view.kind, view.namespace, view.name)
                if fresh is None:
                    return False
                fresh_wire, version, uid = fresh
                if uid and uid != view.uid:
                    # Deleted and made again under the same name since this was decided: the
                    # decision was for another object; the new one is decided from its own state.
                    return False
                held = self._as_held(view.kind, fresh_wire)
                if held == stored:  # a send whose answer was lost had made it after all
                    self._ledger[view.uid] = (stored, time.monotonic(), version)
                    return True
                if held != base:
                    self._refuse(view, held, base, version)
                    return False
                olds.append(fresh_wire)
                continue
            if written is None:
                return False
            self._ledger[view.uid] = (stored, time.monotonic(), written)
            return True
        log.warning("status write conflicted repeatedly", kind=view.kind, namespace=view.namespace, name=view.name)
        return False

    @staticmethod
    def _as_held(kind: str, wire: dict[str, Any]) -> dict[str, Any]:
        """A status in the wire form as the operator holds it, ours or read: as the API server
        stores it under the models' CRD, the placement decoded."""
        stored = status_as_stored(kind, wire)
        return compact.from_wire(stored) if kind == "TrainingJob" else stored

    def _refuse(self, view: ResourceView, held: dict[str, Any], base: dict[str, Any], version: str) -> None:
        """Another writer changed the status since it was decided from: keep theirs, and make the
        next cycle decide from it even if the index has not shown it yet."""
        log.warning(
            "status changed by another writer; not overwritten, decided again next cycle",
            kind=view.kind,
            namespace=view.namespace,
            name=view.name,
            changed=sorted(k for k in set(held) | set(base) if held.get(k) != base.get(k)),
        )
        self._ledger[view.uid] = (held, time.monotonic(), version)

    def forget(self, live_uids: set[str]) -> None:
        for store in (self._ledger, self._decoded):
            for uid in [u for u in store if u not in live_uids]:
                del store[uid]


def _merge_patch(olds: list[dict[str, Any]], new: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) that turns any of `olds` into `new`. The server merges
    nested objects too: a key gone from one (status.load.error once the load is read again) must
    be sent as null, or it stays for good."""
    patch: dict[str, Any] = {k: None for old in olds for k in old if k not in new}
    for k, v in new.items():
        nested = [old[k] for old in olds if isinstance(old.get(k), dict)]
        patch[k] = _merge_patch(nested, v) if nested and isinstance(v, dict) else v
    return patch
