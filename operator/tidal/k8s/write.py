"""The write side of a cycle: apply the `ActionPlan` the deciding side recorded.

Order: statuses first (a job's placement is recorded before any of its pods exists, so a restarted
operator books every GPU a pod may hold), then events and annotations, pod deletions (they free
names and GPUs), Services, pod creations, gate removals.

A failed call (say, a namespace being deleted) is logged and retried by the next cycle, which will
find the same difference between the recorded state and the pods; it never stops the rest. A
workload whose status write failed, or a gang whose Service could not be made, gets no new pods
this time: the next cycle decides again from what the API server holds and makes them then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal.k8s import labels
from tidal.k8s.api import Api
from tidal.k8s.cycle import ActionPlan, log
from tidal.k8s.status import StatusWriter

_OWNER_LABEL = {"TrainingJob": labels.JOB, "InferencePool": labels.POOL}


@dataclass
class Applied:
    """What applying a plan did not manage (the next cycle tries again)."""

    failed_statuses: set[tuple[str, str | None, str]] = field(default_factory=set)
    """(kind, namespace, name) whose status write was refused."""
    withheld_pods: int = 0
    """Pod creations skipped because their owner's status or Service was not written."""


def apply_actions(plan: ActionPlan, api: Api, writer: StatusWriter) -> Applied:
    applied = Applied()
    for view, status in plan.statuses:
        if not writer.write(view, status):
            applied.failed_statuses.add((view.kind, view.namespace, view.name))
    for view, reason, message, warning in plan.events:
        log.info("event", kind=view.kind, namespace=view.namespace, name=view.name, reason=reason, message=message)
        api.event(view.kind, view.namespace, view.name, view.uid, reason, message, warning)
    if plan.annotations:
        api.parallel(_logged(_annotate(api)), plan.annotations)
    if plan.pod_deletes:
        api.parallel(_logged(lambda d: api.delete_pod(*d)), plan.pod_deletes)
    # (kind label, namespace, owner name) of workloads that must not get pods this time.
    withheld = {(_OWNER_LABEL[k], ns, name) for k, ns, name in applied.failed_statuses if k in _OWNER_LABEL}
    if plan.services:

        def create_service(body: dict[str, Any]) -> bool:
            api.ensure_service(body)
            return True

        made = api.parallel(_logged(create_service), plan.services)
        withheld |= {
            (labels.JOB, _meta(body)["namespace"], _meta(body)["name"])
            for body, ok in zip(plan.services, made, strict=True)
            if not ok
        }
    creates = plan.pod_creates
    if withheld:
        creates = [p for p in creates if not _owned_by(p, withheld)]
        applied.withheld_pods = len(plan.pod_creates) - len(creates)
    if creates:
        api.parallel(_logged(api.create_pod), creates)
    if plan.ungates:
        api.parallel(_logged(lambda u: api.remove_gate(u[0], u[1], labels.GANG_GATE, u[2])), plan.ungates)
    return applied


def _annotate(api: Api) -> Callable[[tuple[str, str | None, str, dict[str, str]]], None]:
    def annotate(item: tuple[str, str | None, str, dict[str, str]]) -> None:
        kind, namespace, name, annotations = item
        if kind == "Pod":
            api.annotate_pod(namespace or "", name, annotations)
        else:
            api.annotate(kind, namespace, name, annotations)

    return annotate


def _meta(body: dict[str, Any]) -> dict[str, Any]:
    return body["metadata"]


def _owned_by(pod: dict[str, Any], owners: set[tuple[str, str | None, str]]) -> bool:
    meta = _meta(pod)
    pod_labels = meta.get("labels") or {}
    return any((key, meta["namespace"], pod_labels.get(key)) in owners for key in _OWNER_LABEL.values())


def _logged(fn):
    def call(item):
        try:
            return fn(item)
        except Exception as e:  # one object's API error must not abort the cycle
            log.warning("api call failed", call=getattr(fn, "__name__", "pod call"), error=str(e)[:300])
            return None

    return call
