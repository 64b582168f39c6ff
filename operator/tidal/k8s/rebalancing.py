"""The tide: pools get the replicas their schedule and load ask for, taking GPUs from training
(free first, then elastic shrink, then suspension, checkpoint-first, within the disruption
budget); when pools shrink, suspended training is re-admitted and elastic jobs grow back."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidal.clock import parse_time
from tidal.k8s import live_resize
from tidal.k8s.admission import reserve_nodes, running_gangs, without_evictions_in_flight
from tidal.k8s.compute_domains import DOMAIN_PODS_SHARE_NODE, domain_pods_problem
from tidal.k8s.cycle import Cycle, log
from tidal.k8s.disruption_ledger import disruption_records, leaving_disruption_gpus
from tidal.k8s.live_resize import resize_kind
from tidal.k8s.manifests import leader_selector, pool_service, selector_string
from tidal.k8s.pools import LoadPoller, add_replicas, pool_conditions, pool_load, reconcile_pool, spec_problem
from tidal.k8s.priority import UNKNOWN_PRIORITY_CLASS
from tidal.k8s.quota import QUOTA_EXCEEDED
from tidal.k8s.return_rooms import room_groups, take_return_room
from tidal.k8s.state import ResourceView
from tidal.k8s.status import set_condition
from tidal.k8s.training import (
    GROWTH_NOT_STARTED,
    HISTORY_WINDOW,
    REBALANCED,
    hold_domain_nodes,
    holds_gpus,
    job_domain_problem,
    job_request,
    placement_of,
    pool_evictor,
    shape_of,
    start_eviction,
    summary_fields,
)
from tidal.model.training_job import DEFAULT_ACCELERATOR
from tidal.placement import GangRequest, GangShape, PlacementPlan, apply_plan, plan_gang
from tidal.rebalance import (
    DemandTracker,
    ScheduledPool,
    desired_replicas,
    plan_capacity,
    schedule_floor,
    scheduled_rise_s,
)
from tidal.rebalance.resize_cost import ResizeCosts

Statuses = dict[str, tuple[ResourceView, dict[str, Any]]]

RESIZE_COSTS = ResizeCosts()
"""Checkpoint and restart costs by default (a job's own are not known to the operator)."""
GROW_HORIZON = dt.timedelta(hours=12)
"""How far ahead a grow-back looks for the pools' schedules wanting its GPUs back (as the simulator)."""


@dataclass
class RebalanceSettings:
    disruption_budget_gpus_per_hour: int | None = None
    """Most training GPUs the rebalancer may evict in any hour; None means no limit."""
    expand_cooldown: dt.timedelta = dt.timedelta(minutes=10)
    """An elastic job shrunk by the rebalancer is not grown back sooner than this
    (`--grow-back-cooldown`)."""
    stabilization_window: dt.timedelta = dt.timedelta(minutes=5)
    """A pool scales down only once its demand stayed lower this long (`--scale-down-stabilization`)."""
    load_sources: Mapping[str, str] = field(default_factory=dict)
    """Prometheus load source name -> base URL (operator flag --load-source): pools name one."""


def budget_used(cyc: Cycle, jobs: Statuses) -> int:
    """Training GPUs evicted (or being evicted) by the rebalancer or defragmentation in the last
    hour, from jobs deleted since included (`cyc.deleted_disruption_gpus`)."""
    hour_ago = cyc.now - HISTORY_WINDOW
    used = cyc.deleted_disruption_gpus
    for view, status in jobs.values():
        used += sum(gpus for _, gpus in disruption_records(status, hour_ago))
        used += leaving_disruption_gpus(view, status)
    return used


def budget_left(cyc: Cycle, jobs: Statuses, settings: RebalanceSettings) -> int | None:
    """GPUs the hourly disruption budget still allows (None: no budget set)."""
    budget = settings.disruption_budget_gpus_per_hour
    return None if budget is None else max(budget - budget_used(cyc, jobs), 0)


def rebalance_pools(
    cyc: Cycle,
    pools: Statuses,
    jobs: Statuses,
    tracker: DemandTracker,
    settings: RebalanceSettings,
    loads: LoadPoller | None = None,
) -> set[str]:
    """Reconcile every pool and grow those below desired. Returns the accelerators on which some
    pool waits for GPUs that evictions under way or planned now will give it (expand_elastic
    must not grow training into them). `loads`: the pools' Prometheus load samples (without
    it, such a pool's load is unknown)."""
    waiting: set[str] = set()
    tracker.forget({view.uid for view, _ in pools.values()})
    order = sorted(pools.values(), key=lambda item: (-cyc.priorities.of(item[0]), item[0].created))
    for view, status in order:
        cyc.release_hold(view.uid)  # planned again now: it re-holds below if it still waits
        if view.deleting:
            continue
        try:
            if _rebalance_pool(cyc, view, status, pools, jobs, tracker, settings, loads):
                waiting.add(view.spec.get("accelerator", "nvidia.com/gpu"))
        except Exception:  # one pool's bad input must not stop the cycle for every workload
            log.exception("pool reconcile failed", namespace=view.namespace, name=view.name)
    return waiting


def _rebalance_pool(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    pools: Statuses,
    jobs: Statuses,
    tracker: DemandTracker,
    settings: RebalanceSettings,
    loads: LoadPoller | None,
) -> bool:
    """One pool: its status written, its replicas grown; True if it waits for GPUs being freed."""
    waiting = False
    problem = spec_problem(view) or cyc.priorities.problem(view)
    if problem:
        # An unknown PriorityClass: its pods would be refused by the API server, so none are made.
        reason = UNKNOWN_PRIORITY_CLASS if problem.startswith("spec.priorityClassName") else "InvalidSpec"
        conditions = set_condition(status.get("conditions", []), "Schedulable", False, reason, problem, cyc.stamp)
        new = {**status, "reason": problem, "conditions": conditions}
        pools[view.uid] = (view, new)
        cyc.write_status(view, new)
        return False
    rate, error = pool_load(view, settings.load_sources, loads)
    raw, why = desired_replicas(view.spec, cyc.now, rate)
    # After a restart the window starts from the replicas the pool had placed and still wanted
    # (warm ones are not dropped early; demand it never got is not asked for again).
    held = [status.get("desiredReplicas"), status.get("placedReplicas")]
    seed = min(held) if None not in held else None
    # Within maxReplicas: a window or a seed from before the pool's maximum was lowered holds no more.
    desired = min(tracker.stabilized(view.uid, cyc.now, raw, seed), view.spec["maxReplicas"])
    if desired > raw:
        why = f"holding {desired} for the scale-down stabilization window (now {raw}: {why})"
    floor, _ = schedule_floor(view.spec.get("schedule"), view.spec.get("minReplicas", 0), cyc.now)
    new = reconcile_pool(cyc, view, status, desired)
    new.update(desiredReplicas=desired, floor=floor, reason=why)
    if view.spec.get("load"):
        new["load"] = {
            k: v for k, v in {"currentRate": rate, "observedAt": cyc.stamp, "error": error}.items() if v is not None
        }
    need = desired - new["placedReplicas"]
    replica_gpus = view.spec.get("tp", 1) * view.spec.get("ep", 1)
    room = cyc.quotas.room(view)
    quota_problem = None
    if need > 0 and room is not None and need * replica_gpus > room:
        # Only whole replicas within the namespace's quota (no replica half-created).
        quota_problem = cyc.quotas.problem(view, need * replica_gpus)
        need = room // replica_gpus
        new["reason"] = f"{new['reason']}; {quota_problem}"
    domain_problem = None
    if need > 0:
        # Decided before any placement or eviction: a replica spanning trays gets a ComputeDomain,
        # and its pods must never share one. Replicas already placed are still reconciled.
        pods = replica_gpus // max(int(view.spec.get("gpusPerPod", 1)), 1)
        domain_problem = domain_pods_problem(cyc, view.spec, pods)
        if domain_problem:
            need = 0
    if need > 0:
        placed = new["placedReplicas"]
        # Nodes last reserved for workloads waiting for their victims stay theirs, unless this
        # pool outranks them.
        with cyc.avoiding(cyc.held_from(view.uid, cyc.priorities.of(view))):
            new, still_waiting = _grow(cyc, view, new, need, jobs, settings)
        cyc.quotas.book(view, (new["placedReplicas"] - placed) * replica_gpus)
        waiting |= still_waiting
    conditions = [  # the problem that held it back is gone
        c
        for c in pool_conditions(new, cyc.stamp)
        if not (
            c["type"] == "Schedulable"
            and c.get("reason") in (UNKNOWN_PRIORITY_CLASS, "InvalidSpec", QUOTA_EXCEEDED, DOMAIN_PODS_SHARE_NODE)
        )
    ]
    if quota_problem:
        conditions = set_condition(conditions, "Schedulable", False, QUOTA_EXCEEDED, quota_problem, cyc.stamp)
    if domain_problem:
        conditions = set_condition(conditions, "Schedulable", False, DOMAIN_PODS_SHARE_NODE, domain_problem, cyc.stamp)
    new["conditions"] = conditions
    # The scale subresource: what HPA/KEDA read back (status.replicas, status.selector).
    new["replicas"] = new["placedReplicas"]
    new["selector"] = selector_string(leader_selector(view.name))
    service = pool_service(view.name, view.namespace or "default", view.uid, view.spec.get("template") or {})
    if service is not None:
        cyc.ensure_pool_service(service)
    pools[view.uid] = (view, new)
    cyc.write_status(view, new)
    return waiting


def _request(cyc: Cycle, view: ResourceView, replicas: int) -> GangRequest:
    """`replicas` replicas of the pool as one request: a replica is one HBD group (pp=1), so the
    pool is a gang of dp=replicas built by the same GangShape arithmetic as a TrainingJob's."""
    spec = view.spec
    shape = GangShape(spec.get("tp", 1), spec.get("ep", 1), 1, replicas, spec["gpusPerPod"])
    return shape.request(
        view.ref,
        accelerator=spec.get("accelerator", "nvidia.com/gpu"),
        priority=cyc.priorities.of(view),
        packing=cyc.packing,
    )


def _grow(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], need: int, jobs: Statuses, settings: RebalanceSettings
) -> tuple[dict[str, Any], bool]:
    started = time.perf_counter()
    groups: list[Any] = []
    # Off the nodes a replica's pods waited on in vain (admission timeout) first, then anywhere free.
    refused = tuple(status.get("refusedNodes") or ())
    for avoided in (refused, ()) if refused else ((),):
        if len(groups) >= need:
            break
        with cyc.tolerating(view.spec.get("template")), cyc.avoiding(avoided):
            free = plan_capacity(cyc.snapshot, _request(cyc, view, need - len(groups)), [], None)
            if free.placement is not None:
                apply_plan(cyc.snapshot, free.placement)
                groups += free.placement.groups
    cyc.placements_ms.append((time.perf_counter() - started) * 1000)
    if groups:
        status = add_replicas(cyc, view, status, groups)
        cyc.count("moves:to-inference:free", len(groups))
        cyc.event(view, "ScaledUp", f"placed {len(groups)} replica(s) on free GPUs: {status['reason']}")
    remaining = need - len(groups)
    if remaining <= 0:
        return status, False
    left = budget_left(cyc, jobs, settings)
    with cyc.tolerating(view.spec.get("template")):  # it may evict on the tainted nodes it tolerates
        scratch = without_evictions_in_flight(cyc, jobs)
    # The cost model the simulator charges (tidal.rebalance.resize_cost): the ways to make room are
    # weighed by the GPU-seconds of no progress they cause, as the simulator's tidal policy does.
    plan = plan_capacity(scratch, _request(cyc, view, remaining), running_gangs(cyc, jobs), left, RESIZE_COSTS)
    by_uid = {v.uid: (v, s) for v, s in jobs.values()}
    evictor = pool_evictor(view)
    for eviction in plan.evictions:
        victim, victim_status = by_uid[eviction.gang]
        replicas = [] if eviction.whole else list(eviction.replicas)
        new = start_eviction(cyc, victim, victim_status, reason=REBALANCED, by=evictor, replicas=replicas)
        jobs[victim.uid] = (victim, new)
        cyc.write_status(victim, new)
        cyc.count(f"moves:from-training:{'suspend' if eviction.whole else 'shrink'}")
    if plan.placement is not None:
        reserve_nodes(cyc.snapshot, plan.placement)
        # Its quota share too: a job of its namespace admitted meanwhile would leave the evictions
        # it caused for nothing (the replicas would then be refused by the quota).
        cyc.hold(view, plan.placement.gpus_by_node())
    in_flight = [v.ref for v, s in jobs.values() if s.get("eviction") and s["eviction"].get("by") == evictor]
    if in_flight:
        status["reason"] += (
            f"; {remaining} replica(s) waiting for {len(in_flight)} training job(s) to checkpoint: "
            f"{', '.join(sorted(in_flight))}"
        )
    else:
        status["reason"] += f"; {remaining} replica(s) do not fit: {plan.reason}"
    # A pool nothing is being freed for (no room even with evictions, budget spent, an
    # accelerator the cluster lacks) holds no training back from growing.
    return status, bool(in_flight) or plan.placement is not None


def expand_elastic(
    cyc: Cycle,
    jobs: Statuses,
    settings: RebalanceSettings,
    pools_waiting: Collection[str] = (),
    pools: Statuses | None = None,
) -> None:
    """Grow shrunk elastic jobs back towards spec.dp when their replicas fit in free GPUs, except on
    an accelerator where a pool waits for GPUs being freed (`rebalance_pools`), and only by as many
    replicas as pay for the grow-back (`_grow_pays`: the work they do before the `pools`'
    schedules want the GPUs back outweighs the restart, and the shrink that gives them back).
    Replicas given back for a defragmentation move grow back first, onto the room kept for them
    (`_regrow_into_room`)."""
    for view, status in sorted(jobs.values(), key=lambda i: (-cyc.priorities.of(i[0]), i[0].created)):
        if view.deleting or status.get("eviction") or view.spec.get("suspend"):
            continue
        if room_groups(cyc, view.uid) and holds_gpus(status) and _regrow_into_room(cyc, jobs, view, status):
            continue
        if status.get("phase") != "Running" or view.spec.get("accelerator", "nvidia.com/gpu") in pools_waiting:
            continue
        shape = shape_of(view, status)
        target = view.spec.get("dp", 1)
        if shape.dp >= target:
            continue
        last = max(
            (
                parse_time(r.get("at"))
                for r in status.get("evictionHistory", [])
                if r.get("reason") in (REBALANCED, GROWTH_NOT_STARTED)
            ),
            default=None,
            key=lambda t: t or dt.datetime.min,
        )
        if last is not None and cyc.now - last < settings.expand_cooldown:
            continue
        if job_domain_problem(cyc, view, GangShape.of(view.spec, target)):
            continue  # new pods could share a tray under a ComputeDomain (admitted before one was wanted)
        for dp in range(target, shape.dp, -1):
            bigger = GangShape.of(view.spec, dp)
            if cyc.quotas.problem(view, bigger.world_size - shape.world_size):
                continue  # grown only within the namespace's GPU quota
            if not _grow_pays(cyc, view, shape, bigger, pools or {}):
                continue  # a smaller grow-back stalls the job as long and may still pay
            request = _growth_request(cyc, view, status, shape, bigger)
            with cyc.tolerating(view.spec.get("template")):
                plan = plan_gang(cyc.snapshot, request, cyc.demand)
                if isinstance(plan, PlacementPlan):
                    apply_plan(cyc.snapshot, plan)
                    cyc.snapshot.add_residents(plan.supernodes - request.resident_on)
            if isinstance(plan, PlacementPlan):
                _grown(cyc, jobs, view, status, shape, bigger, plan, "free GPUs")
                break


def _grow_pays(cyc: Cycle, view: ResourceView, shape: GangShape, bigger: GangShape, pools: Statuses) -> bool:
    """The pure core's rule (ResizeCosts.grow_pays), as the simulator applies it: the added GPUs'
    work until the accelerator's pool schedules ask for more than the free GPUs left after the
    grow-back (`scheduled_rise_s`, the operator's forecast; the job's own end is not known) must
    outweigh the grow-back's stall, plus the shrink that gives them back if they ask before the
    horizon. A Live job's grow-back costs a peer transfer and a rebuild, a Restart job's a restart."""
    accelerator = view.spec.get("accelerator", DEFAULT_ACCELERATOR)
    added = bigger.world_size - shape.world_size
    scheduled = [
        ScheduledPool(pool.spec, status.get("placedReplicas", 0))
        for pool, status in pools.values()
        if pool.spec.get("accelerator", DEFAULT_ACCELERATOR) == accelerator and not pool.deleting
    ]
    horizon = GROW_HORIZON.total_seconds()
    calm = scheduled_rise_s(scheduled, cyc.now, cyc.snapshot.free_gpus_of(accelerator) - added, horizon)
    return RESIZE_COSTS.grow_pays(
        resize_kind(view), shape.world_size, added, shape.replica_gpus, calm, shrunk_again=calm < horizon
    )


def _growth_request(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], shape: GangShape, bigger: GangShape
) -> GangRequest:
    groups = tuple(range(shape.groups, bigger.groups))
    return job_request(cyc, view, shape, group_ids=groups, resident_on={g["supernode"] for g in status["placement"]})


def _regrow_into_room(cyc: Cycle, jobs: Statuses, view: ResourceView, status: dict[str, Any]) -> bool:
    """In the cycle its defragmentation shrink ended, a job grows back onto the room its given-back
    replicas were verified to fit into, if that still is a valid placement within its quota. Not
    held back by what holds ordinary growth back (a pool waiting on the accelerator, the grow-back
    cooldown, a phase other than Running): the replicas ran a moment ago, and the room was kept for
    them, not for the pool. Whatever the answer, the room is given up (`take_return_room`)."""
    shape = shape_of(view, status)
    room = room_groups(cyc, view.uid)
    dp = (shape.groups + len(room)) // shape.groups_per_replica
    bigger = GangShape.of(view.spec, dp)
    fits = (
        room == tuple(range(shape.groups, bigger.groups))
        and shape.dp < dp <= view.spec.get("dp", 1)
        and not cyc.quotas.problem(view, bigger.world_size - shape.world_size)
        and not job_domain_problem(cyc, view, bigger)
    )
    request = _growth_request(cyc, view, status, shape, bigger) if fits else None
    with cyc.tolerating(view.spec.get("template")):
        plan = take_return_room(cyc, view.uid, request)
        if plan is None or request is None:
            return False
        apply_plan(cyc.snapshot, plan)
        cyc.snapshot.add_residents(plan.supernodes - request.resident_on)
    cyc.count("defrag_returns")
    _grown(cyc, jobs, view, status, shape, bigger, plan, "the room kept for them since their defragmentation move")
    return True


def _grown(
    cyc: Cycle,
    jobs: Statuses,
    view: ResourceView,
    status: dict[str, Any],
    shape: GangShape,
    bigger: GangShape,
    plan: PlacementPlan,
    where: str,
) -> None:
    """Record the growth from `shape` to `bigger` onto `plan` (already booked in the snapshot)."""
    cyc.quotas.book(view, bigger.world_size - shape.world_size)
    grown = placement_of(plan)
    hold_domain_nodes(cyc, view, grown)
    placement = [*status["placement"], *grown]
    new = {
        **live_resize.grown(cyc, view, status, shape, bigger),
        **summary_fields(placement, bigger),
        "phase": "Admitted",
        "reason": f"expanding dp {shape.dp} -> {bigger.dp}",
        "placedAt": cyc.stamp,
    }
    cyc.event(view, "Expanded", f"grew from dp {shape.dp} to {bigger.dp} on {where}")
    cyc.count("moves:to-training:expand", bigger.dp - shape.dp)
    jobs[view.uid] = (view, new)
    cyc.write_status(view, new)
