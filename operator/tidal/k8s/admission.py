"""Which pending TrainingJobs get GPUs: priority order, then submission order, with preemption
and defragmentation.

A job that needs victims waits for their checkpoints; meanwhile the nodes its plan needs are
reserved, so lower-priority jobs may backfill elsewhere but never take its place. A job blocked
only by fragmentation (enough free GPUs, none where a group needs them) may have preemptible work
of its own or lower priority *moved* (`placement/defrag.py`): checkpoint-first eviction, back to
the queue, re-admitted elsewhere; the moves count against the hourly disruption budget.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from tidal.clock import parse_time
from tidal.k8s import compact
from tidal.k8s.compute_domains import DOMAIN_PODS_SHARE_NODE
from tidal.k8s.cycle import Cycle
from tidal.k8s.live_resize import resize_kind
from tidal.k8s.priority import UNKNOWN_PRIORITY_CLASS
from tidal.k8s.quota import QUOTA_EXCEEDED
from tidal.k8s.return_rooms import book_rest_of_rooms, keep_return_room, return_to, room_groups, take_return_room
from tidal.k8s.state import ResourceView
from tidal.k8s.status import condition, set_condition
from tidal.k8s.training import (
    DEFRAGMENTED,
    evicted_for,
    holds_gpus,
    job_domain_problem,
    job_evictor,
    job_request,
    leaving_groups,
    placement_of,
    reconcile_placed,
    shape_of,
    spec_problem,
    start_eviction,
    summary_fields,
)
from tidal.placement import (
    GangRequest,
    GangShape,
    PlacementPlan,
    PreemptionPlan,
    RunningGang,
    Unplaceable,
    apply_plan,
    plan_gang,
    plan_preemption,
)
from tidal.placement.defrag import MovableGang, free_gpus, is_fragmentation_blocked, move_cap, plan_defrag
from tidal.placement.gang import group_fits_some_supernode
from tidal.placement.leftover import ArrivalHistory, GroupDemand
from tidal.placement.preemption import eligible_gangs, with_released
from tidal.placement.quota_eviction import plan_quota_eviction
from tidal.placement.types import UnplaceableReason
from tidal.topology.snapshot import ClusterSnapshot

QUEUED = frozenset({"Pending", "Restarting", ""})
WAITING = frozenset({"WaitingForPreemption", "WaitingForDefragmentation"})
"""Reasons of a queued job that is re-planned every cycle (it must re-reserve its nodes)."""
NEVER_FITS = frozenset(
    {
        "InvalidSpec",
        UNKNOWN_PRIORITY_CLASS,
        DOMAIN_PODS_SHARE_NODE,
        UnplaceableReason.NO_MATCHING_SUPERNODES.value,
        UnplaceableReason.POD_LARGER_THAN_NODES.value,
        UnplaceableReason.GROUP_LARGER_THAN_SUPERNODES.value,
        UnplaceableReason.LARGER_THAN_CLUSTER.value,
    }
)
"""Pending reasons that no free capacity clears (configuration or shape): such a job's size is not
demand to keep room for."""
DEFRAG_COOLDOWN = dt.timedelta(minutes=10)
"""A job moved by defragmentation is not moved again sooner than this (no ping-pong)."""

Budget = Callable[[], int | None]
"""GPUs the disruption budget still allows this hour (None: no limit), asked only when needed."""


def is_queued(view: ResourceView, status: dict[str, Any]) -> bool:
    return (
        not view.deleting
        and not view.spec.get("suspend")
        and status.get("phase", "") in QUEUED
        and not holds_gpus(status)
    )


def placement_demand(
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]], arrivals: ArrivalHistory, snapshot: ClusterSnapshot
) -> GroupDemand:
    """The group sizes placement keeps leftovers for: each TrainingJob's once as an arrival (in
    `arrivals`, kept across cycles; jobs first seen in one cycle, e.g. every job after a restart,
    in creation order) and the queued ones' again, QUEUE_WEIGHT each. A job that can never be
    placed as it is (invalid, a group larger than every supernode, a reason no capacity change
    clears) asks for nothing, from its first cycle on."""
    queued: list[tuple[str, int]] = []
    first_seen: list[tuple[str, str, str, int]] = []
    for view, status in statuses.values():
        accelerator = view.spec.get("accelerator", "nvidia.com/gpu")
        group_gpus = _group_gpus(view.spec, accelerator, snapshot)
        if group_gpus is None or _schedulable_reason(status) in NEVER_FITS:
            continue
        if not arrivals.seen(view.uid):
            first_seen.append((view.created or "", view.uid, accelerator, group_gpus))
        if is_queued(view, status):
            queued.append((accelerator, group_gpus))
    for _, uid, accelerator, group_gpus in sorted(first_seen):
        arrivals.arrive(uid, accelerator, group_gpus)
    arrivals.forget(statuses)
    return arrivals.demand(queued)


def _group_gpus(spec: dict[str, Any], accelerator: object, snapshot: ClusterSnapshot) -> int | None:
    """The job's HBD-group size if one such group fits an empty supernode, else None."""
    if not isinstance(accelerator, str):
        return None
    try:
        shape = GangShape.of(spec)
        one_group = GangRequest("demand", 1, shape.group_gpus, shape.gpus_per_pod, accelerator)
    except (KeyError, TypeError, ValueError):
        return None  # an invalid spec is refused by admission
    return shape.group_gpus if group_fits_some_supernode(snapshot, one_group) else None


def queue_order(cyc: Cycle, item: tuple[ResourceView, dict[str, Any]]) -> tuple:
    view, status = item
    recovering = status.get("phase") == "Restarting"
    return (
        not recovering,
        -cyc.priorities.of(view),
        # A job others are leaving for re-reserves its nodes before its equals (its movers) are tried.
        _schedulable_reason(status) not in WAITING,
        status.get("pendingSince") or view.created,
        view.namespace or "",
        view.name,
    )


def running_gangs(cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]) -> list[RunningGang]:
    """Placed jobs as the preemption planner sees them (jobs already being evicted excluded)."""
    gangs = []
    for view, status in statuses.values():
        if not holds_gpus(status) or status.get("eviction"):
            continue
        shape = shape_of(view, status)
        elastic = view.spec.get("elastic")
        if shape.pods_span_replicas:  # one unit, taken whole (an elastic one was stored before the rule)
            replicas = [[(node, shape.gpus_per_pod) for group in status["placement"] for node in group["nodes"]]]
            elastic = None
        else:
            replicas = [[] for _ in range(shape.dp)]
            for group in status["placement"]:
                r = shape.replica_of_group(group["group"])
                replicas[r].extend((node, shape.gpus_per_pod) for node in group["nodes"])
        gangs.append(
            RunningGang(
                name=view.uid,
                priority=cyc.priorities.of(view),
                preemptible=bool(view.spec.get("preemptible")),
                replicas=tuple(tuple(r) for r in replicas),
                min_replicas=elastic.get("minDP") if elastic else None,
                resize=resize_kind(view).value,
            )
        )
    return gangs


def without_evictions_in_flight(
    cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]
) -> ClusterSnapshot:
    """The snapshot as it will be once every eviction already under way has finished."""
    scratch = cyc.snapshot.copy()
    for view, status in statuses.values():
        groups, gpus_per_pod = leaving_groups(view, status)
        for group in groups:
            for node in group["nodes"]:
                scratch.release(node, gpus_per_pod)
    book_rest_of_rooms(cyc, scratch)  # what leaving work frees on a mover's way back is the mover's
    return scratch


def admit_queued(
    cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]], defrag_budget: Budget | None = None
) -> None:
    """`defrag_budget`: what defragmentation moves may still take; None turns defragmentation off."""
    queue = sorted((item for item in statuses.values() if is_queued(*item)), key=lambda item: queue_order(cyc, item))
    queued = {view.uid for view, _ in queue}
    for uid in [u for u in cyc.held_before if u not in queued]:
        cyc.release_hold(uid)  # deleted, suspended, or a pool (planned again already): it waits no more
    with _HeldNodes(cyc) as held:
        for view, status in queue:
            mark = retry_mark(cyc, view, status)
            if cyc.pending_memo.get(view.uid) == mark:
                cyc.count("queue_skipped")  # nothing that could change its answer has moved
                continue
            cyc.release_hold(view.uid)
            held.avoid(view.uid, cyc.priorities.of(view))
            new_status = _try_admit(cyc, view, status, statuses, defrag_budget)
            cyc.quotas.release_room(view.uid)  # a mover's room share, if it was not taken: tried now
            statuses[view.uid] = (view, new_status)
            if holds_gpus(new_status):
                cyc.pending_memo.pop(view.uid, None)
                held.close()  # as before: an admitted job's pods and groups are planned without the holds
                new_status = reconcile_placed(cyc, view, new_status)
                statuses[view.uid] = (view, new_status)
            elif _schedulable_reason(new_status) in WAITING:
                cyc.pending_memo.pop(view.uid, None)  # re-planned every cycle: it reserves its nodes
            else:
                cyc.pending_memo[view.uid] = mark
            cyc.write_status(view, new_status)


class _HeldNodes:
    """One `Cycle.avoiding` block of held nodes kept open across consecutive queued jobs that may
    not take the same holds. The queue is in priority order, so that set changes about once per
    priority band (or when a holder is planned again): opening a block per job flipped every held
    node for every queued job tried, O(queued x held) a cycle."""

    def __init__(self, cyc: Cycle) -> None:
        self.cyc = cyc
        self.stack = ExitStack()
        self.holders: frozenset[str] | None = None

    def __enter__(self) -> _HeldNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def avoid(self, uid: str, priority: int) -> None:
        """Make the nodes held from this job (`Cycle.held_from`) unusable until the next call or `close`."""
        cyc = self.cyc
        holders = frozenset(h for h, hold in cyc.held_before.items() if h != uid and hold.priority >= priority)
        if holders != self.holders:
            self.close()
            self.stack.enter_context(cyc.avoiding(cyc.held_from(uid, priority)))
            self.holders = holders

    def close(self) -> None:
        self.stack.close()
        self.holders = None


def retry_mark(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> tuple:
    """What a queued job's answer depends on besides itself: it is tried again only when this
    moves (free GPUs went up somewhere, a lower-priority preemptible gang grew, an eviction
    started) or the job changed (spec generation, phase)."""
    priority = cyc.priorities.of(view)
    victims = sum(n for p, n in cyc.victims_added.items() if p < priority)
    return (
        view.generation,
        status.get("phase", ""),
        cyc.snapshot.capacity_version,
        victims,
        cyc.evictions_started,
        cyc.priorities.version,  # a PriorityClass made or changed: its priority (or existence) moved
        cyc.quotas.version,  # a ResourceQuota made or changed
        cyc.holds_mark,  # a hold (its nodes, its quota share) came or went
    )


def _schedulable_reason(status: dict[str, Any]) -> str | None:
    cond = condition(status.get("conditions", []), "Schedulable")
    return cond.get("reason") if cond and cond.get("status") == "False" else None


def _try_admit(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]],
    defrag_budget: Budget | None = None,
) -> dict[str, Any]:
    status = {**status, "phase": status.get("phase") or "Pending"}
    status.setdefault("pendingSince", cyc.stamp)
    problem = spec_problem(view)
    if problem:
        return _pending(cyc, view, status, "InvalidSpec", problem)
    problem = cyc.priorities.problem(view)
    if problem:  # its pods would be refused by the API server: nothing is booked or created
        return _pending(cyc, view, status, UNKNOWN_PRIORITY_CLASS, problem)
    problem = job_domain_problem(cyc, view, GangShape.of(view.spec, view.spec.get("dp", 1)))
    if problem:  # decided before any planning: nothing is placed, preempted or moved for it
        return _pending(cyc, view, status, DOMAIN_PODS_SHARE_NODE, f"{problem}, or spec.computeDomain: Disabled")
    recovery, recover_on = _recovery(status)
    elastic = view.spec.get("elastic")
    dps = [view.spec.get("dp", 1)]
    if elastic:
        dps += list(range(dps[0] - 1, elastic["minDP"] - 1, -1))
    # The namespace's GPU quota, for the whole gang, before anything is booked or created: the API
    # server would refuse the pods past the quota one by one and leave the gang half-made.
    over_quota = [dp for dp in dps if cyc.quotas.problem(view, GangShape.of(view.spec, dp).world_size)]
    if len(over_quota) == len(dps):
        problem = cyc.quotas.problem(view, GangShape.of(view.spec, dps[-1]).world_size) or ""
        with cyc.tolerating(view.spec.get("template")):
            preempted = _preempt_for_quota(cyc, view, status, statuses)
        if preempted is not None:
            return preempted
        return _pending(cyc, view, status, QUOTA_EXCEEDED, problem)
    dps = [dp for dp in dps if dp not in over_quota]
    returned = _take_return_room(cyc, view, status, dps)
    if returned is not None:
        return returned
    # Nodes where its pods were last refused (an admission timeout that queued the whole gang) or
    # failed (a whole-gang restart): tried without them first, then anywhere, so they never keep
    # it from fitting.
    refused = tuple(status.get("refusedNodes") or ())
    passes = (refused, ()) if refused else ((),)
    # An elastic job starts smaller rather than wait, down to minDP. A recovery's refused nodes
    # are where a pod crashed (most crashes are software): its size comes before avoiding them.
    # After an admission timeout they are where pods never landed: avoiding them comes first.
    attempts = [(a, dp) for dp in dps for a in passes] if recovery else [(a, dp) for a in passes for dp in dps]
    misses: list[Unplaceable] = []  # of the last pass, anywhere
    for avoided, dp in attempts:
        with cyc.tolerating(view.spec.get("template")), cyc.avoiding(avoided):
            shape = GangShape.of(view.spec, dp)
            started = time.perf_counter()
            request = job_request(cyc, view, shape, recovery=recovery, prefer_supernodes=recover_on)
            plan = plan_gang(cyc.snapshot, request, cyc.demand)
            cyc.placements_ms.append((time.perf_counter() - started) * 1000)
            if isinstance(plan, PlacementPlan):
                too_large = _too_large(cyc, view, status, shape, plan)
                if too_large is not None:
                    return too_large
                return _admitted(cyc, view, status, shape, plan)
            if not avoided:
                misses.append(plan)
    if misses[-1].permanent:  # not even the smallest allowed shape fits an empty cluster
        return _pending(cyc, view, status, misses[-1].reason.value, misses[0].message)
    if over_quota:  # preemption and defragmentation plan for spec.dp, which the quota refuses
        return _pending(cyc, view, status, misses[0].reason.value, misses[0].message)
    with cyc.tolerating(view.spec.get("template")):  # it may preempt on the tainted nodes it tolerates
        return _preempt_or_wait(cyc, view, status, statuses, misses[0], defrag_budget)


def _take_return_room(cyc: Cycle, view: ResourceView, status: dict[str, Any], dps: list[int]) -> dict[str, Any] | None:
    """A job moved whole by defragmentation, in the cycle its eviction ended, is placed on the room
    it was verified to fit into (k8s/return_rooms.py), if that still is a valid placement at a
    size it may take; else (None) it is planned like any queued job, the room given up."""
    ids = room_groups(cyc, view.uid)
    if not ids:
        return None
    shape = next((s for s in (GangShape.of(view.spec, dp) for dp in dps) if s.groups == len(ids)), None)
    request = job_request(cyc, view, shape) if shape is not None else None
    with cyc.tolerating(view.spec.get("template")):  # booked where its pods may go, as any admission
        plan = take_return_room(cyc, view.uid, request)
        if plan is None or shape is None:
            return None
        too_large = _too_large(cyc, view, status, shape, plan)
        if too_large is not None:
            return too_large
        cyc.count("defrag_returns")
        cyc.event(view, "DefragmentationReturn", f"placed again on the room kept for it: {_where(plan)}")
        return _admitted(cyc, view, status, shape, plan)


def _where(plan: PlacementPlan) -> str:
    return ", ".join(sorted(plan.supernodes))


def _recovery(status: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """Whether the queued job is a recovery (which may use hot spares), and the supernodes it is
    placed on first (its broken groups', `status.recoverOn`)."""
    recovery = status["phase"] == "Restarting"
    return recovery, tuple(status.get("recoverOn") or ()) if recovery else ()


def _too_large(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], shape: GangShape, plan: PlacementPlan
) -> dict[str, Any] | None:
    """The pending status of a plan whose placement would not fit status.assignment, or None."""
    if not compact.fits(compact.encode(placement_of(plan))):
        return _pending(
            cyc,
            view,
            status,
            "PlacementTooLarge",
            f"the placement of {shape.world_size} GPUs would not fit status.assignment's bounds "
            f"({compact.ASSIGNMENT_NODES_MAX} + {compact.ASSIGNMENT_GROUPS_MAX} characters)",
        )
    return None


def _admitted(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], shape: GangShape, plan: PlacementPlan
) -> dict[str, Any]:
    apply_plan(cyc.snapshot, plan)
    cyc.snapshot.add_residents(plan.supernodes)  # for the rest of the cycle; the keeper's count after
    cyc.quotas.book(view, shape.world_size)
    placement = placement_of(plan)
    summary = summary_fields(placement, shape)
    message = (
        f"{shape.world_size} GPUs: {len(plan.groups)} group(s) of {plan.request.group_gpus} on "
        f"{summary['supernodes']} supernode(s)"
    )
    cyc.event(view, "Admitted", message)
    cyc.count("admitted")
    since = parse_time(status.get("pendingSince"))
    if since is not None:
        cyc.pending_waits.append(max((cyc.now - since).total_seconds(), 0.0))
    conditions = set_condition(status.get("conditions", []), "Admitted", True, "Placed", message, cyc.stamp)
    conditions = set_condition(conditions, "Schedulable", True, "Placed", message, cyc.stamp)
    return {
        **{k: v for k, v in status.items() if k not in ("eviction", "refusedNodes", "recoverOn")},
        **summary,
        "phase": "Admitted" if status["phase"] != "Restarting" else "Restarting",
        "reason": message,
        "admittedAt": cyc.stamp,
        "placedAt": cyc.stamp,
        "conditions": conditions,
    }


def _pending(cyc: Cycle, view: ResourceView, status: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """Written (and a Warning event sent) when the reason's kind changes, not when its numbers do:
    a thousand queued jobs must not rewrite their statuses whenever free capacity moves."""
    if _schedulable_reason(status) == reason and status.get("reason"):
        return status
    if status.get("reason") != message:
        cyc.event(view, reason, message, warning=True)
    conditions = set_condition(status.get("conditions", []), "Schedulable", False, reason, message, cyc.stamp)
    return {**status, "reason": message, "conditions": conditions}


def _preempt_or_wait(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]],
    miss: Unplaceable,
    defrag_budget: Budget | None = None,
) -> dict[str, Any]:
    shape = GangShape.of(view.spec, view.spec.get("dp", 1))
    recovery, recover_on = _recovery(status)
    request = job_request(cyc, view, shape, recovery=recovery, prefer_supernodes=recover_on)
    gangs, scratch = _preemption_inputs(cyc, statuses)
    own_victims = bool(_leaving_for(view, statuses))
    if own_victims or any(g.preemptible and g.priority < request.priority for g in gangs):
        # Skipped when nobody may be preempted and nobody is already leaving for it.
        result = plan_preemption(scratch, request, gangs)
        if isinstance(result, PreemptionPlan):
            return _preempt(cyc, view, status, statuses, result)
    moved = _defragment(cyc, view, status, statuses, request, miss, gangs, scratch, defrag_budget)
    if isinstance(moved, dict):
        return moved
    return _pending(cyc, view, status, miss.reason.value, miss.message + (moved or ""))


QUOTA_LAG = dt.timedelta(minutes=1)
"""Beyond its pods' termination, how long GPUs preempted for a job count as gone from its
namespace's quota although the quota's status.used may still count them (`Quotas.shortfall`):
the quota controller's lag, not a reason to evict another victim meanwhile."""


def _departure_window(job: ResourceView) -> dt.timedelta:
    """How long the quota may count a job's pods after tidal deleted them: a terminating pod is
    counted until its deletionTimestamp (the delete plus its grace period) plus that grace period
    again, then the quota controller's lag."""
    template = (job.spec.get("template") or {}).get("spec") or {}
    grace = template.get("terminationGracePeriodSeconds")
    seconds = grace if isinstance(grace, int) and grace >= 0 else 30  # the API server's default
    return 2 * dt.timedelta(seconds=seconds) + QUOTA_LAG


def _preempt_for_quota(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], statuses: dict[str, tuple[ResourceView, dict[str, Any]]]
) -> dict[str, Any] | None:
    """A job over its namespace's GPU quota at every size it may take evicts, checkpoint first,
    the fewest GPUs of its own namespace's lower-priority preemptible jobs that make room under
    every quota that is short (Kueue's `withinClusterQueue: LowerPriority`), if those and ordinary
    preemption then make room in the cluster too: nothing is evicted for a job that would still
    not fit. What is leaving for it, or left lately, counts as freed. Its new status (waiting for
    its victims, its nodes and quota share held), or None: it may not, and waits as QuotaExceeded."""
    if not cyc.quotas.limited(view.namespace):
        return None
    shape = GangShape.of(view.spec, view.spec.get("dp", 1))
    priority = cyc.priorities.of(view)
    leaving: Counter[str | None] = Counter()
    departed: Counter[str | None] = Counter()
    may_go = []
    for uid in _jobs_of_namespace(cyc, statuses, view.namespace):
        other, other_status = statuses[uid]
        if uid == view.uid or other.deleting:
            continue
        eviction = other_status.get("eviction")
        if holds_gpus(other_status) and eviction:
            if eviction.get("reason") == "Preempted" and evicted_for(view, eviction.get("by")):
                groups, gpus_per_pod = leaving_groups(other, other_status)
                leaving[cyc.quotas.class_of(other)] += sum(len(g["nodes"]) for g in groups) * gpus_per_pod
        elif holds_gpus(other_status) and other.spec.get("preemptible") and cyc.priorities.of(other) < priority:
            may_go.append(other)
        history = other_status.get("evictionHistory") or [{}]
        last = history[-1]
        if last.get("reason") == "Preempted" and evicted_for(view, last.get("by")):
            at = parse_time(last.get("at"))
            if at is not None and cyc.now - at < _departure_window(other):
                departed[cyc.quotas.class_of(other)] += int(last.get("gpus") or 0)
    deficit, counted = cyc.quotas.shortfall(view, shape.world_size, leaving, departed)
    wanted = {other.uid for other in may_go if counted(other)}
    if deficit > 0 and not wanted:
        return None
    if deficit <= 0 and not (leaving or departed):
        return None
    gangs, scratch = _preemption_inputs(cyc, statuses)
    victims = plan_quota_eviction([g for g in eligible_gangs(gangs, priority) if g.name in wanted], deficit)
    if victims is None:
        return None
    chosen = {e.gang: e for e in victims}
    released: Counter[str] = Counter()
    for gang in gangs:
        if gang.name in chosen:
            for replica in chosen[gang.name].replicas:
                for node, gpus in gang.replicas[replica]:
                    released[node] += gpus
    recovery, recover_on = _recovery(status)
    request = job_request(cyc, view, shape, recovery=recovery, prefer_supernodes=recover_on)
    others = [g for g in gangs if g.name not in chosen]
    result = with_released(scratch, dict(released), lambda: plan_preemption(scratch, request, others))
    if not isinstance(result, PreemptionPlan):
        return None
    plan = PreemptionPlan((*victims, *result.evictions), result.placement)
    return _preempt(cyc, view, status, statuses, plan, why=f"priority {priority}, over the quota of {view.namespace}")


def _jobs_of_namespace(
    cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]], namespace: str | None
) -> list[str]:
    """The uids of the namespace's jobs, indexed once a cycle (the cycle adds no job)."""
    index = cyc.scratch.get("jobs_by_namespace")
    if index is None:
        index = {}
        for uid, (job, _) in statuses.items():
            index.setdefault(job.namespace or "", []).append(uid)
        cyc.scratch["jobs_by_namespace"] = index
    return index.get(namespace or "", [])


def _leaving_for(view: ResourceView, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]) -> list[tuple[str, str]]:
    """(job, eviction reason) of every job being evicted to make room for `view`."""
    return sorted(
        (v.ref, s["eviction"].get("reason", ""))
        for v, s in statuses.values()
        if s.get("eviction") and evicted_for(view, s["eviction"].get("by"))
    )


def _preempt(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]],
    result: PreemptionPlan,
    why: str | None = None,
) -> dict[str, Any]:
    by_uid = {v.uid: (v, s) for v, s in statuses.values()}
    by = job_evictor(view, why or f"priority {cyc.priorities.of(view)}")
    for eviction in result.evictions:
        victim, victim_status = by_uid[eviction.gang]
        replicas = [] if eviction.whole else list(eviction.replicas)
        new_victim = start_eviction(cyc, victim, victim_status, reason="Preempted", by=by, replicas=replicas)
        statuses[victim.uid] = (victim, new_victim)
        cyc.write_status(victim, new_victim)
        cyc.count("preemptions")
    _reserve(cyc, view, result.placement)
    return _waiting(cyc, view, status, statuses)


def _waiting(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], statuses: dict[str, tuple[ResourceView, dict[str, Any]]]
) -> dict[str, Any]:
    """The pending status of a job whose planned nodes are reserved while others leave for it."""
    leaving = _leaving_for(view, statuses)
    moves = [ref for ref, reason in leaving if reason == DEFRAGMENTED]
    preempted = [ref for ref, reason in leaving if reason != DEFRAGMENTED]
    if moves and not preempted:
        message = (
            f"waiting for {len(moves)} defragmentation move(s): checkpoint-first, then re-placed elsewhere: "
            f"{', '.join(moves)}"
        )
        return _pending(cyc, view, status, "WaitingForDefragmentation", message)
    message = f"waiting for {len(preempted)} preempted job(s) to checkpoint and release GPUs: {', '.join(preempted)}"
    if moves:
        message += f"; and for {len(moves)} defragmentation move(s): {', '.join(moves)}"
    return _pending(cyc, view, status, "WaitingForPreemption", message)


def _defragment(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]],
    request: GangRequest,
    miss: Unplaceable,
    gangs: list[RunningGang],
    scratch: ClusterSnapshot,
    defrag_budget: Budget | None,
) -> dict[str, Any] | str | None:
    """Start the fewest checkpoint-first moves that let a fragmentation-blocked job fit (its new
    status); or say why none was found, for its pending message; or None when it does not apply.

    One defragmentation at a time: a second one planned while the first one's movers are still
    leaving could take the room those movers were verified to fit into again."""
    if defrag_budget is None or miss.reason is not UnplaceableReason.INSUFFICIENT_FREE_CAPACITY:
        return None
    if free_gpus(scratch, request.accelerator) < request.total_gpus:
        return None  # short of GPUs, not of their arrangement
    if any((s.get("eviction") or {}).get("reason") == DEFRAGMENTED for _, s in statuses.values()):
        return None
    movers = _movable(cyc, statuses, gangs, request, view.spec.get("template"))
    if not movers:
        return None
    budget = defrag_budget()
    started = time.perf_counter()
    plan = plan_defrag(scratch, request, movers, budget)
    cyc.placements_ms.append((time.perf_counter() - started) * 1000)
    if plan is None:
        blocked = is_fragmentation_blocked(scratch, request)
        if blocked is None:
            return None
        cap = move_cap(request, blocked.groups_fitting_now)
        within = "" if budget is None else f" within the {budget} GPUs the hourly disruption budget still allows"
        return (
            f"; defragmentation found no plan of {cap} or fewer moves of preemptible jobs of priority <= "
            f"{request.priority}{within} that makes room with every moved job fitting again"
        )
    by_uid = {v.uid: (v, s) for v, s in statuses.values()}
    groups = f"{request.groups} group(s) of {request.group_gpus} GPUs"
    for move in plan.moves:
        mover, mover_status = by_uid[move.eviction.gang]
        replicas = [] if move.eviction.whole else list(move.eviction.replicas)
        what = "the whole job" if move.eviction.whole else f"DP replicas {replicas}"
        cyc.event(
            mover,
            "DefragmentationMove",
            f"moving {what} ({move.eviction.gpus} GPUs) so that {view.ref} ({groups}) fits: checkpoint first, "
            f"then placed again on the room kept for it on {_where(move.replacement)}",
        )
        new_mover = start_eviction(
            cyc,
            mover,
            mover_status,
            reason=DEFRAGMENTED,
            by=job_evictor(view, f"defragmentation: {groups} blocked by scattered free GPUs"),
            replicas=replicas,
        )
        new_mover = {**new_mover, "eviction": {**new_mover["eviction"], "returnTo": return_to(move.replacement)}}
        keep_return_room(cyc, mover.uid, mover, new_mover)  # from now on: later jobs of this cycle too
        statuses[mover.uid] = (mover, new_mover)
        cyc.write_status(mover, new_mover)
        cyc.count("defrag_moves")
    names = ", ".join(by_uid[m.eviction.gang][0].ref for m in plan.moves)
    where = _where(plan.placement)
    cyc.event(
        view,
        "Defragmenting",
        f"{len(plan.moves)} defragmentation move(s) of {plan.moved_gpus} GPUs make room on {where}: {names}",
    )
    _reserve(cyc, view, plan.placement)
    return _waiting(cyc, view, status, statuses)


def _movable(
    cyc: Cycle,
    statuses: dict[str, tuple[ResourceView, dict[str, Any]]],
    gangs: list[RunningGang],
    request: GangRequest,
    template: dict[str, Any] | None,
) -> list[MovableGang]:
    """Running gangs that may move for `request` (preemptible, priority <= its), with their shapes;
    not one moved by defragmentation within DEFRAG_COOLDOWN. The request's pods (`template`) may
    tolerate taints a mover's do not: each mover is re-placed only where its own pods may go, or a
    move could leave it with nowhere to return to."""
    by_uid = {v.uid: (v, s) for v, s in statuses.values()}
    recent = cyc.now - DEFRAG_COOLDOWN
    mine = cyc.tolerated(template)
    differences: dict[frozenset[str], tuple[frozenset[str], frozenset[str]]] = {}
    out = []
    for gang in gangs:
        if not gang.preemptible or gang.priority > request.priority or gang.name not in by_uid:
            continue
        view, status = by_uid[gang.name]
        if view.ref == request.name:
            continue
        if any(
            r.get("reason") == DEFRAGMENTED and (parse_time(r.get("at")) or recent) > recent
            for r in status.get("evictionHistory", [])
        ):
            continue
        again = job_request(cyc, view, shape_of(view, status), name=gang.name)
        theirs = cyc.tolerated(view.spec.get("template"))
        if theirs not in differences:
            differences[theirs] = (mine - theirs, theirs - mine)
        tainted, untainted = differences[theirs]
        out.append(MovableGang(gang, again, tainted=tainted, untainted=untainted))
    return out


def _preemption_inputs(
    cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]
) -> tuple[list[RunningGang], ClusterSnapshot]:
    """Running gangs and the snapshot without evictions in flight, built once per cycle and again
    only after the snapshot or the set of evictions changed (both walk every placed pod). Each
    job plans under its own avoided and tolerated nodes: the copy's flags are brought to the
    current ones (Cycle.reflip) rather than the copy made again for every team's taints."""
    key = (
        cyc.snapshot_mutations(),
        cyc.counters.get("preemptions", 0),
        cyc.counters.get("defrag_moves", 0),
        cyc.counters.get("admitted", 0),
    )
    flips = tuple(cyc.flipped)
    cached = cyc.scratch.get("preemption")
    if cached is None or cached[0] != key:
        cached = (key, running_gangs(cyc, statuses), without_evictions_in_flight(cyc, statuses))
        cyc.scratch["preemption"] = cached
        cyc.scratch["preemption_flips"] = flips
    elif cyc.scratch["preemption_flips"] != flips:
        Cycle.reflip(cached[2], cyc.scratch["preemption_flips"], flips)
        cyc.scratch["preemption_flips"] = flips
    return cached[1], cached[2]


def _reserve(cyc: Cycle, view: ResourceView, plan: PlacementPlan) -> None:
    """Hold a waiting job's planned nodes and its share of the namespace's quota: while others
    leave for it, no other job takes those GPUs, nor (of its namespace) the quota it will need,
    which would refuse it once the evictions it caused are done. Both are kept for it in the next
    cycle too, until admission plans it again (`Cycle.held_before`)."""
    reserve_nodes(cyc.snapshot, plan)
    cyc.hold(view, plan.gpus_by_node())


def reserve_nodes(snapshot: ClusterSnapshot, plan: PlacementPlan) -> None:
    """Block the nodes a waiting preemptor will use, so nobody else is admitted onto them."""
    for node in plan.gpus_by_node():
        state = snapshot.nodes.get(node)
        if state is not None:
            snapshot.update_node(node, allocated=max(state.allocated, state.gpus))
