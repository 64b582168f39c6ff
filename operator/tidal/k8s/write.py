"""The write side of a cycle: apply the `ActionPlan` the deciding side recorded.

Order: statuses first (a job's placement is recorded before any of its pods exists, so a restarted
operator books every GPU a pod may hold), then events and annotations, pod deletions (they free
names and GPUs), ComputeDomain deletions (their pods are going), ComputeDomain creations and
rendezvous Services, gate removals, pod creations, pod label merges, pool Services.

A failed call (say, a namespace being deleted) is logged and retried by the next cycle, which will
find the same difference between the recorded state and the pods; it never stops the rest: each
object's write is isolated, so any exception fails that object only. A workload whose status write
failed, or a gang whose ComputeDomain or Service could not be made, gets no new pods this time
(made without their claim's domain they would wait on a template nobody makes): the next cycle
decides again from what the API server holds and makes them then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tidal.k8s import labels
from tidal.k8s.api import Api
from tidal.k8s.cycle import ActionPlan, PodDelete, log
from tidal.k8s.state import ResourceView
from tidal.k8s.status import StatusWriter

SERVICE_CONFLICT_RETRY_SECONDS = 30.0
"""A pool Service name held by another owner is looked at again this often: soon enough for a pool
deleted and made again (the old Service goes with the garbage collector), rarely enough not to read
a user's Service of that name every cycle."""
WRITE_BUDGET_SECONDS = 60.0
"""Longest a cycle spends applying its plan: half the liveness bound (`--max-cycle-age`, 120 s)."""
_OWNER_LABEL = {"TrainingJob": labels.JOB, "InferencePool": labels.POOL}


@dataclass
class Applied:
    """What applying a plan did not manage (the next cycle tries again), and what it counted."""

    failed_statuses: set[tuple[str, str | None, str]] = field(default_factory=set)
    """(kind, namespace, name) whose status write was refused."""
    withheld_pods: int = 0
    """Pod creations skipped because their owner's status, ComputeDomain or Service was not written."""
    withheld_domains: int = 0
    """ComputeDomain creations skipped because their owner's status write was refused."""
    failed_pod_deletes: list[PodDelete] = field(default_factory=list)
    """Pod deletes that failed: the caller forgets them as deleted, so the next cycle deletes them
    again (kept as deleted, a gang re-placed under the same names would wait on them forever:
    bench.faults found it)."""
    deleted_domains: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, name) of ComputeDomains whose delete succeeded (or found them gone)."""
    gates_sent: list[str] = field(default_factory=list)
    """uids of the pods whose gate removal the API server took (k8s/gate_ledger.py)."""
    counters: dict[str, int] = field(default_factory=dict)
    """What the writes did, for the cycle's counters (services:created, services:updated...)."""

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n


def apply_actions(
    plan: ActionPlan,
    api: Api,
    writer: StatusWriter,
    applied_services: dict[tuple[str, str], dict[str, Any]] | None = None,
    service_conflicts: dict[tuple[str, str], float] | None = None,
    budget_seconds: float | None = WRITE_BUDGET_SECONDS,
) -> Applied:
    """Apply `plan`. `applied_services` and `service_conflicts` are the pool Service memos kept
    across cycles (see `Controller.resync_due`); without them every pool Service is applied.

    Past `budget_seconds` every call not yet made is skipped and counted as failed, as if the API
    server had refused it (`writes_skipped_after_budget`): a slow API server (each call may retry
    for up to the API's own budget) must not hold the cycle past the liveness bound, and what is
    skipped the next cycle decides again from what the API server holds."""
    applied = Applied()
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds

    def guarded(fn: Callable[[Any], Any], call: str) -> Callable[[Any], Any]:
        one = _isolated(fn, call)

        def within_budget(item: Any) -> Any:
            if deadline is not None and time.monotonic() > deadline:
                applied.count("writes_skipped_after_budget")
                return None
            return one(item)

        return within_budget

    # The last status decided for each object only: a later one was decided on top of the earlier
    # ones and a write is a whole status (keys it lacks are removed), so it carries them. Sent one
    # by one, an earlier one could land and the last fail, leaving a state the cycle passed through
    # (a checkpoint request called off, then taken over) as the object's status.
    by_object: dict[tuple[str, str | None, str], tuple[ResourceView, dict[str, Any]]] = {}
    for view, status in plan.statuses:
        by_object[(view.kind, view.namespace, view.name)] = (view, status)
    write_status = guarded(lambda s: writer.write(*s), "write_status")
    # Objects in parallel: one whose write hangs costs the cycle one request timeout, not one each.
    written = api.parallel(lambda w: bool(write_status(w)), list(by_object.values()))
    applied.failed_statuses |= {key for key, ok in zip(by_object, written, strict=True) if not ok}
    send_event = guarded(lambda e: api.event(*e), "event")
    for view, reason, message, warning in plan.events:
        log.info("event", kind=view.kind, namespace=view.namespace, name=view.name, reason=reason, message=message)
        send_event((view.kind, view.namespace, view.name, view.uid, reason, message, warning))
    if plan.annotations:
        api.parallel(guarded(_annotate(api), "annotate"), plan.annotations)
    # Sent even for a workload whose status write was refused: the GPUs a delete frees may already
    # be booked by another workload decided in the same cycle (a preemptor on its victim's nodes),
    # so holding the delete back would leave both on them (review).
    if plan.pod_deletes:
        done = api.parallel(
            guarded(_succeeds(lambda d: api.delete_pod(d.namespace, d.name, d.grace_seconds, d.uid)), "delete_pod"),
            plan.pod_deletes,
        )
        applied.failed_pod_deletes = [d for d, ok in zip(plan.pod_deletes, done, strict=True) if not ok]
    if plan.domain_deletes:
        done = api.parallel(
            guarded(_succeeds(lambda d: api.delete_compute_domain(*d)), "delete_compute_domain"), plan.domain_deletes
        )
        applied.deleted_domains = {d for d, ok in zip(plan.domain_deletes, done, strict=True) if ok}
    # (kind label, namespace, owner name) of workloads that must not get pods this time.
    withheld = {(_OWNER_LABEL[k], ns, name) for k, ns, name in applied.failed_statuses if k in _OWNER_LABEL}
    domains = plan.domain_creates
    if withheld:  # a domain for pods not made now would be recorded nowhere: made with them later
        domains = [d for d in domains if _owner_of(d) not in withheld]
        applied.withheld_domains = len(plan.domain_creates) - len(domains)
    if domains:
        # A refused domain (DomainTerminating: one of that name is still going) holds back the pods
        # of its owner, a TrainingJob or an InferencePool.
        made = api.parallel(guarded(_succeeds(api.create_compute_domain), "create_compute_domain"), domains)
        withheld |= {_owner_of(body) for body, ok in zip(domains, made, strict=True) if not ok}
    if plan.services:
        made = api.parallel(guarded(_succeeds(api.ensure_service), "ensure_service"), plan.services)
        withheld |= {_owner_of(body) for body, ok in zip(plan.services, made, strict=True) if not ok}
    # Gates before creations: a gang whose pods all exist is finished before new gangs are started
    # (at 50 jobs admitted at once, a 1,024-GPU gang's gates waited behind 488 other pods' creates:
    # bench.operator). Gates are only lifted for gangs none of whose pods is made this cycle.
    if plan.ungates:
        lifted = api.parallel(
            guarded(
                _succeeds(lambda u: api.remove_gate(u.namespace, u.name, labels.GANG_GATE, u.gates)), "remove_gate"
            ),
            plan.ungates,
        )
        applied.gates_sent = [u.uid for u, ok in zip(plan.ungates, lifted, strict=True) if ok and u.uid]
    creates = plan.pod_creates
    if withheld:
        creates = [p for p in creates if _owner_of(p) not in withheld]
        applied.withheld_pods = len(plan.pod_creates) - len(creates)
    if creates:
        api.parallel(guarded(api.create_pod, "create_pod"), creates)
    if plan.pod_labels:
        api.parallel(guarded(lambda p: api.label_pod(*p), "label_pod"), plan.pod_labels)
    if plan.pool_services:
        _apply_pool_services(
            plan.pool_services,
            guarded,
            api,
            applied,
            {} if applied_services is None else applied_services,
            {} if service_conflicts is None else service_conflicts,
        )
    return applied


def _apply_pool_services(
    bodies: list[dict[str, Any]],
    guarded: Callable[[Callable[[Any], Any], str], Callable[[Any], Any]],
    api: Api,
    applied: Applied,
    done: dict[tuple[str, str], dict[str, Any]],
    conflicts: dict[tuple[str, str], float],
) -> None:
    """Each pool's Service, read and written only when it differs from what was last brought about
    (`done`); a name another owner holds is looked at again after SERVICE_CONFLICT_RETRY_SECONDS."""
    now = time.monotonic()
    todo = [b for b in bodies if done.get(_meta_key(b)) != b and conflicts.get(_meta_key(b), 0.0) <= now]
    if not todo:
        return
    outcomes = api.parallel(guarded(api.apply_service, "apply_service"), todo)
    for body, outcome in zip(todo, outcomes, strict=True):
        key = _meta_key(body)
        if outcome is None:  # the call failed (logged): tried again next cycle
            continue
        if outcome == "conflict":
            log.warning("service name taken by another owner", namespace=key[0], name=key[1])
            conflicts[key] = now + SERVICE_CONFLICT_RETRY_SECONDS
            continue
        applied.count(f"services:{outcome}")
        conflicts.pop(key, None)
        done[key] = body


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


def _meta_key(body: dict[str, Any]) -> tuple[str, str]:
    return _meta(body)["namespace"], _meta(body)["name"]


def _owner_of(body: dict[str, Any]) -> tuple[str, str, str | None]:
    """(owner label, namespace, owner name) of a ComputeDomain, pod or rendezvous Service: a
    pool's, else a job's (each carries one of the two labels)."""
    body_labels = _meta(body).get("labels") or {}
    key = labels.POOL if labels.POOL in body_labels else labels.JOB
    return key, _meta(body)["namespace"], body_labels.get(key)


def _succeeds(fn: Callable[[Any], Any]) -> Callable[[Any], bool]:
    """`fn`, returning True when it returns at all (under `guarded`, None means it raised)."""

    def call(item: Any) -> bool:
        fn(item)
        return True

    return call


def _isolated(fn: Callable[[Any], Any], call: str) -> Callable[[Any], Any]:
    """`fn` for one object: any exception (not only an ApiException) is logged and returns None,
    so one object's failure never aborts the rest of the plan."""

    def one(item: Any) -> Any:
        try:
            return fn(item)
        except Exception as e:  # one object's API error must not abort the cycle
            log.warning("api call failed", call=call, error=str(e)[:300])
            return None

    return one
