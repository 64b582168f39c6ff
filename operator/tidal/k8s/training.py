"""TrainingJob lifecycle: keep placed gangs whole, recover from failures, evict checkpoint-first.

Admission (choosing who gets GPUs) lives in admission.py; this module keeps each placed job's
pods equal to its recorded placement, level-based, so a restarted operator simply carries on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tidal.clock import parse_time, rfc3339
from tidal.k8s import labels, live_resize
from tidal.k8s.compute_domains import domain_pods_problem
from tidal.k8s.cycle import Cycle, log
from tidal.k8s.manifests import compute_domain, headless_service, pod_name, training_pods
from tidal.k8s.pods_ready import gone, running, timeout_seconds, why_not_running
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.status import condition, set_condition
from tidal.model import TrainingJobSpec, describe_errors
from tidal.placement import GangRequest, GangShape, PlacementPlan, apply_plan, plan_gang
from tidal.placement.compute_domains import (
    ComputeDomainMode,
    DomainPlan,
    claims_by_group,
    exclusive_nodes,
    plan_domains,
    stale_domains,
)
from tidal.rebalance.resize_cost import ResizeKind

HOLDING = frozenset({"Admitted", "Running", "Restarting"})
DEFRAGMENTED = "Defragmented"
"""Eviction reason of a defragmentation move."""
REBALANCED = "Rebalanced"
"""Eviction reason of the rebalancer's (GPUs given to an InferencePool)."""
REFUSED_NODES_MAX = 256
"""status.refusedNodes keeps at most this many (the CRD's bound)."""
GROWTH_NOT_STARTED = "GrowthNotStarted"
"""evictionHistory reason of DP replicas given back because their growth did not start in time."""
MAX_NAME = 50  # pod names are <job>-<index> and double as DNS hostnames (63 characters)


def shape_of(view: ResourceView, status: dict[str, Any]) -> GangShape:
    return GangShape.of(view.spec, status.get("currentDP"))


def job_request(
    cyc: Cycle,
    view: ResourceView,
    shape: GangShape,
    *,
    recovery: bool = False,
    group_ids: list[int] | tuple[int, ...] | None = None,
    prefer_supernodes: tuple[str, ...] = (),
    resident_on: Iterable[str] = (),
    name: str | None = None,
) -> GangRequest:
    """The placement request of a TrainingJob's gang (or of `group_ids` only): the job's
    accelerator and priority on its shape's groups. `name` defaults to the job's namespace/name.
    The priority is the one its PriorityClass gives (`cyc.priorities`), never a tenant's integer."""
    return shape.request(
        name or view.ref,
        accelerator=view.spec.get("accelerator", "nvidia.com/gpu"),
        priority=cyc.priorities.of(view),
        recovery=recovery,
        group_ids=group_ids,
        prefer_supernodes=prefer_supernodes,
        resident_on=resident_on,
        packing=cyc.packing,
    )


def job_domain_problem(cyc: Cycle, view: ResourceView, shape: GangShape) -> str | None:
    """Why the job's pods, at `shape`, must not be placed where ComputeDomains are given out: two
    of them could share a node (k8s/compute_domains.domain_pods_problem)."""
    pods = shape.world_size // shape.gpus_per_pod
    return domain_pods_problem(cyc, view.spec, pods, view.spec.get("computeDomain"))


def holds_gpus(status: dict[str, Any]) -> bool:
    return status.get("phase") in HOLDING and bool(status.get("placement"))


def allocations(view: ResourceView, status: dict[str, Any]) -> list[tuple[str, int]]:
    if not holds_gpus(status):
        return []
    gpp = view.spec["gpusPerPod"]
    return [(node, gpp) for group in status["placement"] for node in group["nodes"]]


def spec_problem(view: ResourceView) -> str | None:
    """What the schema cannot catch (or an object written before the CRD had the rule)."""
    try:
        TrainingJobSpec.model_validate(view.spec)
    except ValidationError as e:
        return "; ".join(describe_errors(e))
    if len(view.name) > MAX_NAME:
        return f"metadata.name: must be at most {MAX_NAME} characters (pod names double as DNS hostnames)"
    return None


def groups_of_replicas(shape: GangShape, placement: list[dict[str, Any]], replicas: list[int]) -> list[dict[str, Any]]:
    """The placed groups of the given DP replicas; no replicas named means the whole job."""
    return [g for g in placement if not replicas or shape.replica_of_group(g["group"]) in replicas]


def leaving_groups(view: ResourceView, status: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """(the groups an eviction under way will free, GPUs per pod): none when the job is not being
    evicted or holds nothing."""
    eviction = status.get("eviction")
    if not eviction or not holds_gpus(status):
        return [], 0
    shape = shape_of(view, status)
    return groups_of_replicas(shape, status["placement"], eviction.get("replicas") or []), shape.gpus_per_pod


def placement_of(plan: PlacementPlan) -> list[dict[str, Any]]:
    return [{"group": g.group, "supernode": g.supernode, "nodes": list(g.nodes)} for g in plan.groups]


def summary_fields(placement: list[dict[str, Any]], shape: GangShape) -> dict[str, Any]:
    return {
        "placement": sorted(placement, key=lambda g: g["group"]),
        "supernodes": len({g["supernode"] for g in placement}),
        "worldSize": shape.world_size,
        "currentDP": shape.dp,
    }


# -- placed jobs ---------------------------------------------------------------------------------


def reconcile_placed(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> dict[str, Any]:
    """One step towards: every pod of the placement exists on its node, gates lifted together."""
    status = dict(status)
    shape = shape_of(view, status)
    pods = {p.name: p for p in cyc.state.pods_of("TrainingJob", view.namespace, view.name) if p.owner_uid == view.uid}
    placement = {g["group"]: g for g in status["placement"]}

    ppg = shape.pods_per_group
    expected = {
        pod_name(view.name, g * ppg + i): node
        for g, entry in placement.items()
        for i, node in enumerate(entry["nodes"])
    }
    broken = _broken_groups(cyc, view, status, shape, placement, pods)
    if status.get("eviction"):
        # Pods that all exited 0 during a checkpoint wait leave nothing to wait for, but are not
        # taken for a finished job: a trainer may save and exit on the request (SLURM-requeue
        # style), so the job is evicted and queued again; one that had finished re-runs from
        # its last checkpoint and exits.
        phases = _phases(cyc, pods, expected)
        exited = len(phases) == len(expected) and all(p == "Succeeded" for p in phases)
        new = _continue_eviction(cyc, view, status, pods, broken, exited)
        if view.spec.get("suspend") and view.uid in cyc.called_off:
            # Suspended meanwhile: the request already sent stands for the suspension.
            return start_eviction(cyc, view, new, reason="Suspended", by="spec.suspend", replicas=[])
        return new
    if view.spec.get("suspend"):
        return start_eviction(cyc, view, status, reason="Suspended", by="spec.suspend", replicas=[])

    domains = _sync_domains(cyc, view, status, pods, ppg)
    if broken:
        return _restart(cyc, view, status, shape, broken, pods)
    displaced = _displaced_groups(cyc, view, shape, placement, pods)
    if displaced:
        why = "; ".join(f"group {g}: {r}" for g, r in sorted(displaced.items()))
        replaced = _replace_groups(cyc, view, status, shape, sorted(displaced), pods)
        if replaced is None:  # no room elsewhere either: give the gang back and queue it again
            others = {g: Breakage(r, own=False) for g, r in displaced.items()}
            return _restart(cyc, view, status, shape, others, pods)
        cyc.event(view, "Replaced", f"re-placed {len(displaced)} group(s) whose GPUs others took: {why}", warning=True)
        return {**replaced, "reason": why}
    if pods_ready_due(cyc, status):
        return _admission_timeout(cyc, view, status, shape, placement, pods)

    def build(names: list[str]) -> list[dict[str, Any]]:
        # Manifests (a deep copy of the template each) only for the groups that miss a pod.
        groups = _groups_of(names, ppg)
        made = training_pods(
            view.name,
            view.namespace,
            view.uid,
            view.spec,
            shape,
            {g: placement[g]["nodes"] for g in sorted(groups)},
            claims_by_group(domains),
            annotations=live_resize.current(view, status, shape),
        )
        return [made[n] for n in names]

    cyc.delete_stale_pods(pods, expected)  # left over from a larger shape, or a group re-placed elsewhere
    missing = cyc.sync_gang(view.namespace, pods, expected, build)
    if missing:  # idempotent; also after an operator restart between the first pods and the Service
        cyc.ensure_service(headless_service(view.name, view.namespace, view.uid))
        # Only the domains of groups that miss a pod: a domain is immutable and named per
        # supernode, so creating it again is a no-op (409), and one is never needed sooner.
        missing_groups = _groups_of(missing, ppg)
        for domain in domains.values():
            if missing_groups.intersection(domain.groups):
                cyc.ensure_compute_domain(compute_domain(view.namespace, view.uid, view.name, domain))

    _announce_world_size(cyc, live_resize.current(view, status, shape), pods, expected)

    phases = _phases(cyc, pods, expected)
    if len(phases) == len(expected) and all(p == "Succeeded" for p in phases):
        status["phase"] = "Succeeded"
        status["reason"] = "all pods completed"
        status["conditions"] = set_condition(
            status.get("conditions", []), "Running", False, "Succeeded", "all pods completed", cyc.stamp
        )
        cyc.event(view, "Succeeded", f"all {len(expected)} pods completed")
    elif len(phases) == len(expected) and all(p == "Running" for p in phases) and status["phase"] != "Running":
        status.pop("restartingGroups", None)  # ran whole again: the next failure is a new incident
        status["phase"] = "Running"
        status["reason"] = f"{len(expected)} pods running on {status.get('supernodes', 0)} supernode(s)"
        status["conditions"] = set_condition(
            status.get("conditions", []), "Running", True, "AllPodsRunning", status["reason"], cyc.stamp
        )
        waited = condition(status["conditions"], "PodsReady")
        if waited is not None and waited.get("status") != "True":
            status["conditions"] = set_condition(
                status["conditions"], "PodsReady", True, "AllPodsRunning", status["reason"], cyc.stamp
            )
    return status


def _phases(cyc: Cycle, pods: dict[str, PodView], expected: dict[str, str]) -> list[str]:
    """Phases of the pods on their planned node and not being deleted: a job re-admitted while
    its old pods still terminate elsewhere is not Running (or Succeeded) on the strength of those."""
    return [pods[n].phase for n in expected if n in pods and pods[n].node == expected[n] and not gone(cyc, pods[n])]


def _groups_of(pod_names: list[str], pods_per_group: int) -> set[int]:
    """The groups of these pods, from their names (`<job>-<index>`)."""
    return {int(n.rsplit("-", 1)[1]) // pods_per_group for n in pod_names}


def _announce_world_size(
    cyc: Cycle, wanted: dict[str, str], pods: dict[str, PodView], expected: dict[str, str]
) -> None:
    """Bring every live pod's world annotations to `wanted` (the job's current shape, and a Live
    job's generation: `live_resize.current`): after an elastic shrink or growth the surviving
    pods keep their start-time WORLD_SIZE env, and read the current one from the files these
    annotations feed (manifests.WORLD_MOUNT)."""
    for name in expected:
        pod = pods.get(name)
        if pod is None or pod.terminating or all(pod.annotations.get(k) == v for k, v in wanted.items()):
            continue
        cyc.annotate("Pod", pod.namespace, pod.name, wanted)


# -- admission timeout (Kueue's waitForPodsReady; the rules shared with pools: pods_ready.py) -----


AWAITING = frozenset({"Admitted", "Restarting"})


def pods_ready_due(cyc: Cycle, status: dict[str, Any]) -> bool:
    """A placed gang still waiting for its pods past the admission timeout. From status alone
    (placedAt, or admittedAt as written before placedAt existed): a restarted operator agrees."""
    if cyc.admission_timeout is None or status.get("phase") not in AWAITING or not holds_gpus(status):
        return False
    since = parse_time(status.get("placedAt") or status.get("admittedAt"))
    return since is not None and cyc.now - since >= cyc.admission_timeout


def _admission_timeout(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    shape: GangShape,
    placement: dict[int, dict[str, Any]],
    pods: dict[str, PodView],
) -> dict[str, Any]:
    """Place again the groups with a pod not bound and Running on its node, by the job's restart
    scope (a group, or the whole gang queued again), and say which pods and why in condition
    PodsReady. Not a failure restart: status.restarts (the budget of maxRestarts) is left alone,
    as nothing the job ran failed; a gang that can never start is placed again each timeout, as
    Kueue requeues by default."""
    stuck: dict[int, list[str]] = {}
    helpless: list[str] = []
    gated: dict[int, list[str]] = {}
    refused: set[str] = set()
    """Nodes a stuck pod was not bound to: whatever kept it off (a taint tidal cannot see, a
    device plugin gone) may stay, so the group is not placed there again."""
    for group, entry in placement.items():
        for i, node in enumerate(entry["nodes"]):
            name = pod_name(view.name, group * shape.pods_per_group + i)
            pod = pods.get(name)
            if pod is not None and pod.node == node and not gone(cyc, pod):
                if running(pod):
                    continue
                if pod.gated:  # held for the rest of the gang (gates lift together): not a cause itself
                    gated.setdefault(group, []).append(f"pod {name} is gated")
                    continue
            why, movable = why_not_running(cyc, view, name, node, pod)
            (stuck.setdefault(group, []) if movable else helpless).append(why)
            if movable and pod is not None:
                refused.add(node)
    if not stuck and not helpless:
        if not gated:
            return status  # all bound and Running since the last look: the reconcile says Running
        stuck = gated  # nothing else holds the gates (an ungate that keeps failing?): move them
    timeout = timeout_seconds(cyc)
    reasons = [r for rs in stuck.values() for r in rs] + helpless
    message = f"not bound and Running {timeout}s after placement: {'; '.join(reasons)}"
    conditions = set_condition(status.get("conditions", []), "PodsReady", False, "AdmissionTimeout", message, cyc.stamp)
    # The clock starts again whatever is done, so the next look is one timeout later, not every cycle.
    status = {**status, "conditions": conditions, "placedAt": cyc.stamp}
    cyc.count("admission_timeouts")
    log.info("admission timeout", namespace=view.namespace, name=view.name, groups=sorted(stuck), why=message)
    if not stuck:
        cyc.event(view, "AdmissionTimeout", message, warning=True)
        return status
    shrunk = _give_back_stuck_growth(cyc, view, status, shape, set(stuck), pods)
    if shrunk is not None:
        cyc.event(view, "AdmissionTimeout", f"gave back the DP replicas that never started: {message}", warning=True)
        return {**shrunk, "reason": message}
    scope = (view.spec.get("restartPolicy") or {}).get("scope", "Group")
    if scope == "Group":
        replaced = _replace_groups(cyc, view, status, shape, sorted(stuck), pods, frozenset(refused))
        if replaced is not None:
            cyc.event(view, "AdmissionTimeout", f"re-placed {len(stuck)} group(s): {message}", warning=True)
            return {**replaced, "reason": message}
    _release(cyc, view, status, pods, grace=0)
    cyc.event(view, "AdmissionTimeout", f"queued the whole gang again: {message}", warning=True)
    queued = {
        **_cleared(status),
        "phase": "Pending",
        "reason": f"queued again after the admission timeout: {message}",
        "pendingSince": cyc.stamp,
    }
    if refused:  # admission tries the gang off these first (admission._try_admit)
        queued["refusedNodes"] = sorted(refused)[:REFUSED_NODES_MAX]
    return queued


def _give_back_stuck_growth(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], shape: GangShape, stuck: set[int], pods: dict[str, PodView]
) -> dict[str, Any] | None:
    """An elastic job whose stuck groups all lie in its top DP replicas, none of which ever ran (a
    growth that did not start), shrinks back below them, or None. Re-placing or requeueing the
    whole gang instead would kill the replicas that are training, without a checkpoint."""
    elastic = view.spec.get("elastic")
    if not elastic or shape.pods_span_replicas:  # (an elastic one stored before the schema's rule)
        return None
    keep = min(shape.replica_of_group(g) for g in stuck)
    if keep < max(int(elastic.get("minDP", 1)), 1):
        return None
    ppg = shape.pods_per_group
    top = [g for g in (e["group"] for e in status["placement"]) if shape.replica_of_group(g) >= keep]
    for g in top:
        for i in range(ppg):
            pod = pods.get(pod_name(view.name, g * ppg + i))
            if pod is not None and pod.phase in ("Running", "Succeeded", "Failed"):
                return None  # it ran: giving it back is an eviction, checkpoint first
    _release(cyc, view, status, pods, replicas=list(range(keep, shape.dp)))
    kept = [e for e in status["placement"] if shape.replica_of_group(e["group"]) < keep]
    given = (shape.dp - keep) * shape.group_gpus * shape.groups_per_replica
    # Recorded as an eviction of nothing that ran: growing again waits the rebalancer's cooldown,
    # rather than landing on the same refusing nodes next cycle.
    record = {"at": cyc.stamp, "gpus": given, "reason": GROWTH_NOT_STARTED}
    history = appended_history(status, record, cyc.now)
    return {**status, **summary_fields(kept, GangShape.of(view.spec, keep)), "evictionHistory": history}


def _sync_domains(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], pods: dict[str, PodView], ppg: int
) -> dict[str, DomainPlan]:
    """The job's ComputeDomains in use, one per supernode it uses that wants one (status updated
    in place): domains no placed group needs any more are deleted, their nodes held whole in this
    cycle.

    A domain is in use only when some pod of its groups claims it or is about to be made (and
    the domain with it): pods made before the domain was wanted (an upgrade, a clique label or
    the CRD appearing later) keep running unclaimed, as a pod spec is immutable, so no domain is
    made, reported or booked for them (condition reason PodsPredateDomain) until they are made
    again, say at a restart.

    Pods are ungated without waiting for a domain's status to say Ready: the driver makes a domain
    Ready only once IMEX daemons run on the nodes of its pods, which needs the pods scheduled first
    (waiting would deadlock), and its CRD tells workloads not to rely on that status. The driver
    itself holds each container in ContainerCreating until the IMEX daemon of its node is up.
    """
    mode = view.spec.get("computeDomain")
    recorded = list(status.get("computeDomains") or [])
    wanted = plan_domains(view.name, mode, status["placement"], cyc.domain_supernodes)
    conditions = status.get("conditions", [])
    if wanted and not cyc.domains_installed():
        before = condition(conditions, "ComputeDomain")
        # Said on the job that asked for domains, or that had some (the CRD went away since).
        if mode == ComputeDomainMode.ENABLED or before is not None:
            message = (
                "the ComputeDomain CRD (resource.nvidia.com) is not installed: pods run without IMEX channels "
                "(no multi-node NVLink); install the NVIDIA DRA driver for GPUs with compute domains enabled"
            )
            if mode == ComputeDomainMode.ENABLED and (not before or before.get("reason") != "CRDNotInstalled"):
                cyc.event(
                    view, "ComputeDomainUnavailable", f"spec.computeDomain is Enabled but {message}", warning=True
                )
            status["conditions"] = set_condition(
                conditions, "ComputeDomain", False, "CRDNotInstalled", message, cyc.stamp
            )
        wanted = {}
    placement = {g["group"]: g for g in status["placement"]}
    live = {sn: d for sn, d in wanted.items() if _domain_in_use(view.name, d, placement, pods, ppg)}
    predate = sorted(d.name for sn, d in wanted.items() if sn not in live)
    # A stale name stays recorded until a delete of it is seen to succeed: a failed delete is
    # retried next cycle, and an operator restarted in between finds it in the status.
    # A name in use again leaves the list (being made again, it waits for the old one to go);
    # one recorded but claimed by no pod (recorded by an earlier version) is deleted as unused.
    stale = set(status.pop("staleComputeDomains", None) or []) | set(stale_domains(recorded, live))
    status.update(prune_domains(cyc, view, {"staleComputeDomains": sorted(stale - {d.name for d in live.values()})}))
    names = [d.name for d in live.values()]
    if predate:
        made = f"; made: {', '.join(names)}" if names else ""
        status["conditions"] = set_condition(
            status.get("conditions", []),
            "ComputeDomain",
            False,
            "PodsPredateDomain",
            f"the pods on the supernode(s) of {', '.join(predate)} were made without an IMEX channel claim "
            f"(before a ComputeDomain was wanted there): they get one when they are made again, at their next "
            f"restart{made}",
            cyc.stamp,
        )
    elif names:
        status["conditions"] = set_condition(
            status.get("conditions", []),
            "ComputeDomain",
            True,
            "Created",
            f"{len(names)} ComputeDomain(s), one per NVLink supernode: {', '.join(names)}",
            cyc.stamp,
        )
    if names:
        status["computeDomains"] = names
    else:
        status.pop("computeDomains", None)
    hold_whole(cyc, exclusive_nodes(live, status["placement"]))
    return live


def _domain_in_use(
    job: str, domain: DomainPlan, placement: dict[int, dict[str, Any]], pods: dict[str, PodView], ppg: int
) -> bool:
    """Some pod of the domain's groups claims its channel, or is missing (made this cycle, with the
    claim, right after the domain)."""
    for g in domain.groups:
        for i in range(len(placement[g]["nodes"])):
            pod = pods.get(pod_name(job, g * ppg + i))
            if pod is None or pod.domain_claim == domain.template:
                return True
    return False


def prune_domains(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> dict[str, Any]:
    """Delete the job's status.staleComputeDomains; a name leaves the list only once the previous
    cycle's flush saw its delete succeed (or answer 404), so nothing is leaked by a failed delete
    or a restart. Needs no watch or list of ComputeDomains (the operator's RBAC has neither)."""
    left = []
    for name in status.get("staleComputeDomains") or []:
        if (view.namespace, name) in cyc.domains_deleted_before:
            continue
        left.append(name)
        cyc.delete_compute_domain(view.namespace, name)
    out = {k: v for k, v in status.items() if k != "staleComputeDomains"}
    if left:
        out["staleComputeDomains"] = left
    return out


def hold_domain_nodes(cyc: Cycle, view: ResourceView, groups: list[dict[str, Any]]) -> None:
    """Book whole, in this cycle's snapshot, the nodes of newly placed `groups` that will serve a
    ComputeDomain of the job: a gang admitted later in the same cycle must not take their rest
    (the next cycle books them whole from status.computeDomains)."""
    domains = plan_domains(view.name, view.spec.get("computeDomain"), groups, cyc.domain_supernodes)
    if domains:
        hold_whole(cyc, exclusive_nodes(domains, groups))


def hold_whole(cyc: Cycle, nodes: set[str]) -> None:
    """Book a node held by a ComputeDomain whole in this cycle's snapshot, as the next cycle's
    booking does (the driver lets a node serve one domain at a time): no other gang placed later
    in this cycle may share it. A no-op when pods take whole nodes (4 GPUs per pod on GB200)."""
    for name in nodes:
        node = cyc.snapshot.nodes.get(name)
        if node is not None and node.allocated < node.gpus:
            cyc.snapshot.update_node(name, allocated=node.gpus)


def domain_held_nodes(view: ResourceView, status: dict[str, Any]) -> set[str]:
    """Nodes the job holds whole for its recorded ComputeDomains (for the snapshot's bookings)."""
    recorded = set(status.get("computeDomains") or [])
    if not recorded or not holds_gpus(status):
        return set()
    domains = {
        sn: d
        for sn, d in plan_domains(view.name, ComputeDomainMode.ENABLED, status["placement"], frozenset()).items()
        if d.name in recorded
    }
    return exclusive_nodes(domains, status["placement"])


@dataclass(frozen=True)
class Breakage:
    """Why a group must be placed again, and whether the job itself is to blame: maxRestarts
    budgets only the job's own failures, as a Kubernetes podFailurePolicy ignores a
    DisruptionTarget (at 16k GPUs a node fails every ~3 h, so a long job would run out)."""

    reason: str
    own: bool


def _broken_groups(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    shape: GangShape,
    placement: dict[int, dict[str, Any]],
    pods: dict[str, PodView],
) -> dict[int, Breakage]:
    """Group -> why it must be re-placed: a lost node, a pod disrupted from outside (its
    DisruptionTarget condition), a pod that failed or vanished (the job's own failure: a crash
    leaves a Failed pod, which something may delete before a cycle sees it, so a pod gone with no
    disruption on record is charged). A lost node or a disruption in a group explains
    its other pods' failures: their collectives fail within seconds of it."""
    broken: dict[int, Breakage] = {}
    running = status.get("phase") == "Running"
    for group, entry in placement.items():
        found: list[Breakage] = []
        for i, node in enumerate(entry["nodes"]):
            name = pod_name(view.name, group * shape.pods_per_group + i)
            node_view, pod = cyc.state.nodes.get(node), pods.get(name)
            if node_view is None:
                found.append(Breakage(f"node {node} disappeared", own=False))
            elif not node_view.ready and cyc.not_ready_failed(node):
                found.append(Breakage(f"node {node} is NotReady", own=False))
            elif pod is not None and pod.node == node and pod.uid not in cyc.deleted_uids:
                if _disrupted(pod):
                    # Broken now, not once it is gone: peers whose collectives fail meanwhile are
                    # then the same incident.
                    found.append(Breakage(f"pod {name} was disrupted ({pod.disruption})", own=False))
                elif pod.phase == "Failed" and not pod.terminating:
                    found.append(Breakage(f"pod {name} failed", own=True))
            elif pod is None and running:
                last = _departed(cyc, view, name)
                if last is not None and _disrupted(last):
                    found.append(Breakage(f"pod {name} was disrupted ({last.disruption})", own=False))
                else:
                    found.append(Breakage(f"pod {name} vanished", own=True))
        if found:
            outside = [b for b in found if not b.own]
            broken[group] = outside[0] if outside else found[0]
    return broken


def _held_not_ready(cyc: Cycle, status: dict[str, Any]) -> bool:
    """Whether a node of the job's placement is NotReady and held, not counted failed."""
    for entry in status.get("placement") or []:
        for node in entry["nodes"]:
            node_view = cyc.state.nodes.get(node)
            if node_view is not None and not node_view.ready and not cyc.not_ready_failed(node):
                return True
    return False


def _departed(cyc: Cycle, view: ResourceView, name: str) -> PodView | None:
    """The last view of this job's deleted pod `name`, if the watch cache kept one."""
    last = cyc.state.departed.get((view.namespace, name))
    return last if last is not None and last.owner_uid == view.uid else None


def _disrupted(pod: PodView) -> bool:
    """Ended by something outside it: marked DisruptionTarget and being deleted (the Eviction API
    of a drain, the taint manager, kube-scheduler preemption; the watch's last view of a deleted
    pod is its final state), or stopped by the kubelet's graceful node shutdown. Not a node-pressure
    eviction (`state._disruption`: the kubelet evicts first the pod most over its requests, usually
    the one causing the pressure), or a condition left on a pod nobody deleted (an aborted
    preemption)."""
    if not pod.disruption:
        return False
    return pod.terminating or pod.disruption.startswith("TerminationByKubelet")


def _displaced_groups(
    cyc: Cycle,
    view: ResourceView,
    shape: GangShape,
    placement: dict[int, dict[str, Any]],
    pods: dict[str, PodView],
) -> dict[int, str]:
    """Group -> why: a pod still waiting for its planned node, where pods bound since (a foreign pod
    given nodeName, or one kube-scheduler put there while ours was gated) leave it no room. The
    scheduler would keep it Pending forever, so the group is planned again elsewhere."""
    displaced: dict[int, str] = {}
    for group, entry in placement.items():
        for i, node in enumerate(entry["nodes"]):
            name = pod_name(view.name, group * shape.pods_per_group + i)
            pod, held = pods.get(name), cyc.snapshot.nodes.get(node)
            if pod is None or pod.bound or pod.node != node or gone(cyc, pod) or held is None:
                continue
            # The snapshot books tidal's placements plus every other bound pod: beyond capacity, the
            # unbound tidal pod is the one that cannot land (what is bound stays bound).
            if held.allocated > held.gpus:
                displaced[group] = f"pod {name} no longer fits on {node} ({held.allocated} of {held.gpus} GPUs booked)"
                break
    return displaced


def _restart(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    shape: GangShape,
    broken: dict[int, Breakage],
    pods: dict[str, PodView],
) -> dict[str, Any]:
    policy = view.spec.get("restartPolicy") or {}
    scope, max_restarts = policy.get("scope", "Group"), policy.get("maxRestarts", 3)
    restarts = int(status.get("restarts") or 0)
    # Survivors whose collectives fail while their peers are re-placed are one incident, one
    # restart, unless a group of this incident fails again.
    restarting = set(status.get("restartingGroups") or []) if status.get("phase") == "Restarting" else set()
    own = {g for g, b in broken.items() if b.own}
    # A pod of the job on a NotReady node the outage rule holds (k8s/outage.py) may be dead without
    # tidal knowing: its peers' collectives fail against it, and charging them would spend the
    # job's maxRestarts on the outage.
    if own and (not restarting or own & restarting) and not _held_not_ready(cyc, status):
        restarts += 1
    cyc.count("restarts")  # the metric counts every restart, charged or not
    why = "; ".join(f"group {g}: {b.reason}" for g, b in sorted(broken.items()))
    if restarts > max_restarts:
        _release(cyc, view, status, pods, grace=0)
        cyc.event(view, "Failed", f"giving up after {max_restarts} restarts: {why}", warning=True)
        return {
            **_cleared(status),
            "phase": "Failed",
            "restarts": restarts - 1,
            "reason": f"exceeded maxRestarts={max_restarts}: {why}",
            "conditions": set_condition(
                status.get("conditions", []), "Failed", True, "MaxRestartsExceeded", why, cyc.stamp
            ),
        }
    log.info("restart", namespace=view.namespace, name=view.name, scope=scope, restarts=restarts, why=why)
    conditions = set_condition(status.get("conditions", []), "Running", False, "Restarting", why, cyc.stamp)
    # Off the nodes its pods failed on, if it fits elsewhere: a bad GPU or link on a node no
    # health checker has tainted would otherwise take the group back and fail it again. Only when
    # one group failed on its own: a crash's collective fallout fails the peers of other groups
    # too, and which node was bad cannot be told from the phases. And off the nodes of disrupted
    # pods (a node shutting down, not yet NotReady, would refuse the new pod).
    suspects = own if len(own) == 1 else set()
    failed_on = frozenset(
        pod.node
        for g in broken
        for i in range(shape.pods_per_group)
        if (pod := pods.get(pod_name(view.name, g * shape.pods_per_group + i))) is not None
        and pod.node
        and ((g in suspects and pod.phase == "Failed") or _disrupted(pod))
    )
    if scope == "Group":
        replaced = _replace_groups(cyc, view, status, shape, sorted(broken), pods, avoid=failed_on)
        if replaced is None and failed_on:
            replaced = _replace_groups(cyc, view, status, shape, sorted(broken), pods)
        if replaced is not None:
            cyc.event(view, "Restarting", f"re-placed {len(broken)} group(s) (restart {restarts}): {why}", warning=True)
            return {
                **replaced,
                "phase": "Restarting",
                "restarts": restarts,
                "restartingGroups": sorted(restarting | set(broken)),
                "reason": why,
                "conditions": conditions,
            }
    # Whole gang: give everything back and queue as a recovery (which may use hot spares): the
    # broken groups' supernodes first, so their spares go before other racks' free nodes, as a
    # group's do (not every rack it held: that would take the spares of racks that lost nothing),
    # and off the nodes its pods failed on if it fits elsewhere.
    placement = {g["group"]: g for g in status.get("placement") or []}
    _release(cyc, view, status, pods, grace=0)
    cyc.event(view, "Restarting", f"restarting the whole gang (restart {restarts}): {why}", warning=True)
    return {
        **_cleared(status),
        "phase": "Restarting",
        "restarts": restarts,
        "reason": f"waiting to re-place the whole gang: {why}",
        "pendingSince": cyc.stamp,
        "recoverOn": list(dict.fromkeys(placement[g]["supernode"] for g in sorted(broken) if g in placement)),
        **({"refusedNodes": sorted(failed_on)[:REFUSED_NODES_MAX]} if failed_on else {}),
        "conditions": conditions,
    }


def _replace_groups(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    shape: GangShape,
    groups: list[int],
    pods: dict[str, PodView],
    avoid: frozenset[str] = frozenset(),
) -> dict[str, Any] | None:
    """The groups placed again elsewhere (never on the `avoid` nodes), or None if they do not fit,
    or if two of the job's pods could share a tray under a ComputeDomain (a job admitted before a
    domain was wanted): then the whole gang goes back to admission, which says why."""
    placement = {g["group"]: g for g in status["placement"]}
    gpp = shape.gpus_per_pod
    if job_domain_problem(cyc, view, shape):
        return None
    for g in groups:
        for node in placement[g]["nodes"]:
            cyc.snapshot.release(node, gpp)
    request = job_request(
        cyc,
        view,
        shape,
        recovery=True,
        group_ids=groups,
        prefer_supernodes=tuple(dict.fromkeys(placement[g]["supernode"] for g in groups)),
        resident_on={g["supernode"] for g in placement.values() if g["group"] not in groups},
    )
    with cyc.tolerating(view.spec.get("template")), cyc.avoiding(avoid):
        plan = plan_gang(cyc.snapshot, request, cyc.demand)
        if isinstance(plan, PlacementPlan):
            apply_plan(cyc.snapshot, plan)
            cyc.snapshot.add_residents(plan.supernodes - request.resident_on)
            hold_domain_nodes(cyc, view, placement_of(plan))
    if not isinstance(plan, PlacementPlan):
        for g in groups:  # put the bookkeeping back; the caller restarts the whole gang
            for node in placement[g]["nodes"]:
                node_state = cyc.snapshot.nodes.get(node)
                if node_state is not None:
                    cyc.snapshot.update_node(node, allocated=node_state.allocated + gpp)
        return None
    for g in groups:
        for i in range(shape.pods_per_group):
            name = pod_name(view.name, g * shape.pods_per_group + i)
            if name in pods:
                cyc.delete_pod(pods[name])
    for group in plan.groups:
        placement[group.group] = {"group": group.group, "supernode": group.supernode, "nodes": list(group.nodes)}
    return {**status, **summary_fields(list(placement.values()), shape), "placedAt": cyc.stamp}


def _release(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    pods: dict[str, PodView],
    grace: int | None = None,
    replicas: list[int] | None = None,
) -> None:
    """Delete the pods (of `replicas`, or all) and free their GPUs in this cycle's snapshot."""
    shape = shape_of(view, status)
    for group in groups_of_replicas(shape, status.get("placement") or [], replicas or []):
        for node in group["nodes"]:
            cyc.snapshot.release(node, shape.gpus_per_pod)
    if not replicas:  # the whole job goes: so do its domains (a shrink's are pruned by the next reconcile)
        # Deleted here and kept in status.staleComputeDomains by _cleared until confirmed.
        for name in _all_domains(status):
            cyc.delete_compute_domain(view.namespace, name)
    for pod in pods.values():
        if replicas and (pod.group is None or shape.replica_of_group(pod.group) not in replicas):
            continue
        cyc.delete_pod(pod, grace)


def _all_domains(status: dict[str, Any]) -> list[str]:
    return sorted(set(status.get("computeDomains") or []) | set(status.get("staleComputeDomains") or []))


def _cleared(status: dict[str, Any]) -> dict[str, Any]:
    """The status of a job that holds nothing any more; its domains (deleted by _release) stay
    listed as stale until the deletes are confirmed."""
    out = {
        k: v
        for k, v in status.items()
        if k
        not in (
            "placement",
            "supernodes",
            "currentDP",
            "admittedAt",
            "placedAt",
            "eviction",
            "restartingGroups",
            "worldSize",
            "worldJoining",  # a whole restart loads the checkpoint: nobody joins (the generation stays)
            "computeDomains",
            "staleComputeDomains",
        )
    }
    stale = _all_domains(status)
    if stale:
        out["staleComputeDomains"] = stale
    return out


# -- checkpoint-first eviction ------------------------------------------------------------------


EVICTIONS_STARTED = ("checkpoint_requests:", "evictions_taken_over:", live_resize.LIVE_RESIZES)
"""Prefixes of the cycle counters of evictions started (or taken over, and so going ahead after all)."""


def start_eviction(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], *, reason: str, by: str, replicas: list[int]
) -> dict[str, Any]:
    """Record the eviction; the job and its pods are asked to checkpoint from the next cycle on.

    The intent goes to the status first (the caller writes it), the annotations follow and are
    re-checked every cycle. The grace period starts at the cycle that first sends them
    (`askedAt`), not here: an operator down for longer than the grace period between this cycle
    and the next would otherwise delete the pods in the very cycle that first asks. The deadline
    written here is a placeholder that cycle replaces; it keeps the field an older operator
    reads (a rollback) in place.
    """
    if status.get("eviction"):
        return status
    called_off = cyc.called_off.pop(view.uid, None)
    if called_off is not None:
        return _take_over(cyc, view, status, called_off, reason=reason, by=by, replicas=replicas)
    if replicas and live_resize.resize_kind(view) == ResizeKind.LIVE:  # a suspension is always checkpoint-first
        return live_resize.start(cyc, view, status, reason=reason, by=by, replicas=replicas)
    grace = _grace_seconds(view)
    requested = cyc.stamp
    what = f"replicas {replicas}" if replicas else "the whole job"
    cyc.event(
        view, "CheckpointRequested", f"{reason} by {by}: checkpoint requested before evicting {what} (grace {grace}s)"
    )
    cyc.count(f"checkpoint_requests:{reason}")
    return {
        **status,
        "eviction": {
            "reason": reason,
            "by": by,
            "requestedAt": requested,
            "deadline": _grace_deadline(cyc, view),  # a placeholder (see above)
            "replicas": replicas,
        },
        "conditions": set_condition(
            status.get("conditions", []), "CheckpointRequested", True, reason, f"{reason} by {by}", requested
        ),
    }


@dataclass(frozen=True)
class CalledOff:
    """An eviction whose preemptor no longer waits, called off in this cycle's reconcile: the job
    is a running gang again for every plan after it, but it is told (event, cancel annotation)
    only at the end of the cycle, if no plan took the eviction over (`tell_called_off`)."""

    view: ResourceView
    pods: dict[str, PodView]
    eviction: dict[str, Any]
    conditions: list[dict[str, Any]]
    """The job's conditions before the call-off (CheckpointRequested still True)."""
    message: str


def _take_over(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    called_off: CalledOff,
    *,
    reason: str,
    by: str,
    replicas: list[int],
) -> dict[str, Any]:
    """A plan evicts a job whose eviction was called off earlier in this cycle: the checkpoint
    request already sent stands (its requestedAt, askedAt and deadline), so a checkpoint the job
    made or is making for it counts, rather than a second request that would make it save again."""
    old = called_off.eviction
    what = f"replicas {replicas}" if replicas else "the whole job"
    cyc.event(
        view,
        "CheckpointRequestTakenOver",
        f"{reason} by {by}: evicting {what} on the checkpoint request already sent for {old['reason']} by "
        f"{old['by']} ({called_off.message}); no second checkpoint asked",
    )
    cyc.count(f"evictions_taken_over:{old['reason']}")  # how the called-off eviction ended
    kept = {k: old[k] for k in ("requestedAt", "askedAt", "deadline") if k in old}
    before = [c for c in called_off.conditions if c.get("type") == "CheckpointRequested"]
    conditions = [c for c in status.get("conditions", []) if c.get("type") != "CheckpointRequested"] + before
    return {
        **status,
        "eviction": {**kept, "reason": reason, "by": by, "replicas": replicas},
        "conditions": set_condition(
            conditions, "CheckpointRequested", True, reason, f"{reason} by {by}", old["requestedAt"]
        ),
    }


def tell_called_off(cyc: Cycle, statuses: dict[str, tuple[ResourceView, dict[str, Any]]]) -> None:
    """The evictions called off this cycle that no plan took over: the job and its pods learn it
    stands down (keep training at this size). Run after every plan of the cycle."""
    for uid, called_off in cyc.called_off.items():
        view, eviction = called_off.view, called_off.eviction
        if (statuses.get(uid, (view, {}))[1].get("eviction") or {}).get("requestedAt") == eviction["requestedAt"]:
            continue  # its reconcile failed after the call-off: nothing of it was written
        message = f"{eviction['reason']} by {eviction['by']} called off: {called_off.message}; nothing evicted"
        cyc.event(view, "EvictionCancelled", message)
        _annotate_job_and_pods(cyc, view, called_off.pods, labels.CHECKPOINT_CANCELLED, eviction["requestedAt"])
        cyc.count(f"evictions_cancelled:{eviction['reason']}")
    cyc.called_off.clear()


def _grace_seconds(view: ResourceView) -> int:
    return int((view.spec.get("checkpoint") or {}).get("gracePeriodSeconds", 300))


def _grace_deadline(cyc: Cycle, view: ResourceView) -> str:
    """A grace period that starts now ends then."""
    return rfc3339(cyc.now + dt.timedelta(seconds=_grace_seconds(view)))


def _annotate_job_and_pods(cyc: Cycle, view: ResourceView, pods: dict[str, PodView], key: str, value: str) -> list[str]:
    """`key=value` on the job and every pod (idempotent: sent only where not yet seen); returns the
    objects it is not yet seen on (sent now)."""
    unseen = []
    if view.annotations.get(key) != value:
        cyc.annotate("TrainingJob", view.namespace, view.name, {key: value})
        unseen.append(view.ref)
    for pod in sorted(pods.values(), key=lambda p: p.name):
        if pod.annotations.get(key) != value:
            cyc.annotate("Pod", pod.namespace, pod.name, {key: value})
            unseen.append(f"pod {pod.name}")
    return unseen


POOL_EVICTOR = "InferencePool "
"""How `status.eviction.by` names the InferencePool an eviction is for (`pool_evictor`)."""


def pool_evictor(pool: ResourceView) -> str:
    """`status.eviction.by` of an eviction for this pool; `_no_longer_wanted` reads it back."""
    return f"{POOL_EVICTOR}{pool.ref}"


def job_evictor(job: ResourceView, why: str) -> str:
    """`status.eviction.by` of a preemption or defragmentation move for this TrainingJob;
    `_no_longer_wanted` reads the job back from it."""
    return f"{job.ref} ({why})"


def _no_longer_wanted(cyc: Cycle, eviction: dict[str, Any]) -> str | None:
    """Why an eviction is no longer wanted (None: it still is). For an InferencePool: the pool is
    gone, or the replicas it last wanted are all placed (its load fell back within the grace
    period). For a TrainingJob that preempts or is defragmented for: it is gone, suspended, placed
    (elsewhere, say on GPUs a finished job freed) or finished. Taking the GPUs anyway would lose
    progress for room nobody wants."""
    by = eviction.get("by") or ""
    if eviction.get("reason") in ("Preempted", DEFRAGMENTED):
        return _job_no_longer_waiting(cyc, by)
    if not by.startswith(POOL_EVICTOR):
        return None
    namespace, _, name = by.removeprefix(POOL_EVICTOR).partition("/")
    pool = cyc.state.pools.get((namespace, name))
    # Not told apart by creationTimestamp against requestedAt: those are two clocks (the API
    # server's and the operator's). A pool made again under the name is judged by what it wants.
    if pool is None or pool.deleting:
        return f"{by} is gone"
    status = cyc.writer.effective(pool)
    desired, placed = status.get("desiredReplicas"), status.get("placedReplicas")
    if desired is not None and placed is not None and desired <= placed:
        return f"{by} wants {desired} replica(s) and has {placed}"
    return None


def evicted_for(job: ResourceView, by: object) -> bool:
    """Whether an eviction's (or its record's) `by` names this job (`job_evictor`)."""
    return str(by or "").startswith(job.ref + " ")


def _job_named_by(cyc: Cycle, by: str) -> tuple[str, ResourceView | None]:
    """(namespace/name, the TrainingJob) an eviction's `by` names (`job_evictor`)."""
    ref = by.partition(" ")[0]
    namespace, _, name = ref.partition("/")
    return ref, cyc.state.jobs.get((namespace, name))


def _job_no_longer_waiting(cyc: Cycle, by: str) -> str | None:
    ref, job = _job_named_by(cyc, by)
    if job is None or job.deleting:
        return f"{ref} is gone"
    if job.spec.get("suspend"):
        return f"{ref} is suspended"
    # Placed, whatever the phase (a recovering job placed again stays Restarting); a job back in
    # the queue after a failure (Restarting, nothing placed) may be the one waiting.
    held = cyc.writer.effective(job)
    if holds_gpus(held):
        return f"{ref} is placed"
    if held.get("phase") in ("Succeeded", "Failed"):
        return f"{ref} is {held['phase']}"
    return None


def checkpoint_done(view: ResourceView, requested_at: str) -> bool:
    done = parse_time(view.annotations.get(labels.CHECKPOINT_DONE))
    asked = parse_time(requested_at)
    return done is not None and asked is not None and done >= asked


def _continue_eviction(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    pods: dict[str, PodView],
    broken: dict[int, Breakage],
    exited: bool = False,
) -> dict[str, Any]:
    """`broken`: groups with a failed pod or a lost node. A checkpoint is collective, so with a
    rank down it cannot complete: the eviction goes ahead now rather than after the grace period
    (and a broken group kept by a shrink is restarted by the cycles after). `exited`: every pod
    exited 0; nothing is left to wait for either."""
    eviction = status["eviction"]
    if eviction.get("mode") == ResizeKind.LIVE:
        return _continue_live_shrink(cyc, view, status, pods, broken, exited)
    # A Live shrink fallen back to checkpoint-first (its generation kept) was announced: survivors
    # may have rebuilt without the leaving replicas, so it is carried out, never called off.
    unwanted = None if eviction.get("generation") else _no_longer_wanted(cyc, eviction)
    if unwanted:
        message = f"{eviction['reason']} by {eviction['by']} called off: {unwanted}; nothing evicted"
        # Told at the end of the cycle (`tell_called_off`), unless a plan of this cycle takes it over.
        cyc.called_off[view.uid] = CalledOff(view, pods, eviction, status.get("conditions", []), unwanted)
        conditions = set_condition(
            status.get("conditions", []), "CheckpointRequested", False, "Cancelled", message, cyc.stamp
        )
        return {**{k: v for k, v in status.items() if k != "eviction"}, "conditions": conditions}
    unseen = _annotate_job_and_pods(cyc, view, pods, labels.CHECKPOINT_REQUESTED, eviction["requestedAt"])
    done = checkpoint_done(view, eviction["requestedAt"])
    if not eviction.get("askedAt"):
        # The first cycle that sends the request (or finds it in place): the grace period starts
        # now, so time the operator was down since the decision is never counted as waiting.
        eviction = {**eviction, "askedAt": cyc.stamp, "deadline": _grace_deadline(cyc, view)}
        status = {**status, "eviction": eviction}
    expired = _deadline_passed(cyc, eviction)
    if not (done or expired or broken or exited):
        return status
    if done and not (expired or broken or exited):
        held_by = _way_back_held_by(cyc, view, eviction)
        if held_by:
            return _awaiting_way_back(cyc, view, status, held_by)
    # Up to checkpoint-done when it came: a wait for the way back (`_awaiting_way_back`) is no checkpoint's.
    finished = parse_time(view.annotations.get(labels.CHECKPOINT_DONE)) if done else None
    ended = min(cyc.now, finished) if finished is not None else cyc.now
    waited = max((ended - (parse_time(eviction["requestedAt"]) or ended)).total_seconds(), 0.0)
    cyc.checkpoint_waits.append(waited)
    if done:
        how = "after checkpoint-done"
    elif expired:
        how = "after the grace period without checkpoint-done"
    elif exited:
        how = "without checkpoint-done: its pods all exited during the wait"
    else:
        group = min(broken)
        how = f"without checkpoint-done: group {group} broke during the wait ({broken[group].reason})"
    if not done and expired and unseen:
        cyc.event(
            view,
            "CheckpointRequestNotDelivered",
            f"the checkpoint request never showed on {', '.join(unseen[:10])}"
            f"{' ...' if len(unseen) > 10 else ''} within the grace period (annotation refused?); evicting anyway",
            warning=True,
        )
    conditions = set_condition(status.get("conditions", []), "CheckpointRequested", False, "Evicted", how, cyc.stamp)
    return _evict(cyc, view, status, pods, how, conditions)


def _continue_live_shrink(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    pods: dict[str, PodView],
    broken: dict[int, Breakage],
    exited: bool,
) -> dict[str, Any]:
    """A Live shrink (k8s/live_resize.py): announced every cycle until each survivor acknowledges
    its generation, then the leaving pods go; past the timeout it falls back to checkpoint-first.
    Not called off once announced (the survivors may already have rebuilt without the leavers).
    A broken group or pods that all exited end the wait, as for a checkpoint."""
    status, waiting = live_resize.announce(cyc, view, status, pods, shape_of(view, status))
    eviction = status["eviction"]
    if waiting and not (broken or exited):
        if live_resize.timed_out(cyc, eviction):
            return live_resize.fall_back(cyc, view, status, waiting, _grace_deadline(cyc, view))
        return status
    if not (waiting or broken or exited or live_resize.timed_out(cyc, eviction)):
        room_held_by = _way_back_held_by(cyc, view, eviction)
        if room_held_by:  # a defragmentation mover, as after checkpoint-done: its room is not free yet
            return _awaiting_way_back(cyc, view, status, room_held_by)
    if not waiting:
        how = f"live: every surviving pod acknowledged generation {eviction['generation']}"
    elif exited:
        how = "live: its pods all exited during the wait"
    else:
        group = min(broken)
        how = f"live: group {group} broke during the wait ({broken[group].reason})"
    conditions = set_condition(status.get("conditions", []), live_resize.LIVE_CONDITION, False, "Done", how, cyc.stamp)
    return _evict(cyc, view, status, pods, how, conditions)


def _evict(
    cyc: Cycle,
    view: ResourceView,
    status: dict[str, Any],
    pods: dict[str, PodView],
    how: str,
    conditions: list[dict[str, Any]],
) -> dict[str, Any]:
    """Carry out the eviction in `status`: delete the given-back replicas' pods (a shrink) or all
    of them, and record it in the history the disruption budget reads."""
    eviction = status["eviction"]
    replicas = eviction.get("replicas") or []
    shape = shape_of(view, status)
    evicted = groups_of_replicas(shape, status["placement"], replicas)
    record = {
        "at": cyc.stamp,
        "gpus": sum(len(g["nodes"]) for g in evicted) * shape.gpus_per_pod,
        "reason": eviction["reason"],
        "by": eviction.get("by") or "",
    }
    history = appended_history(status, record, cyc.now)
    if replicas:
        _release(cyc, view, status, pods, replicas=replicas)
        kept = [g for g in status["placement"] if shape.replica_of_group(g["group"]) not in replicas]
        new_shape = GangShape.of(view.spec, shape.dp - len(replicas))
        cyc.event(view, "Shrunk", f"gave back DP replicas {replicas} {how}: dp {shape.dp} -> {new_shape.dp}")
        cyc.count(f"evictions:{eviction['reason']}:shrink")
        out = {k: v for k, v in status.items() if k != "eviction"}
        if eviction.get("generation"):
            # The generation the survivors took on is the job's from now on, whatever the status
            # held (a status restored from an older write): a grow-back's generation must exceed
            # every one a pod has shown, or trainers that acknowledged it would ignore the next.
            out["worldGeneration"] = max(int(out.get("worldGeneration") or 0), int(eviction["generation"]))
        return {**out, **summary_fields(kept, new_shape), "conditions": conditions, "evictionHistory": history}
    _release(cyc, view, status, pods)
    cyc.count(f"evictions:{eviction['reason']}:whole")
    suspended = eviction["reason"] == "Suspended"
    phase = "Suspended" if suspended else "Pending"
    message = f"{eviction['reason']} by {eviction['by']}; pods deleted {how}"
    conditions = set_condition(conditions, "Preempted", not suspended, eviction["reason"], message, cyc.stamp)
    cyc.event(view, eviction["reason"], message, warning=not suspended)
    return {
        **_cleared(status),
        "phase": phase,
        "reason": message,
        "pendingSince": cyc.stamp,
        "evictionHistory": history,
        "conditions": set_condition(conditions, "Running", False, eviction["reason"], message, cyc.stamp),
    }


def _way_back_held_by(cyc: Cycle, view: ResourceView, eviction: dict[str, Any]) -> list[str]:
    """Other jobs being evicted that this defragmentation mover waits for: they still hold GPUs of
    its room (its way back, k8s/return_rooms.py: the part not yet booked, as its GPUs are not yet
    free), and the gang it moves for waits for them too (they leave GPUs of the gang's held nodes),
    so waiting costs the gang nothing. Empty when the job has no room, all of it is booked, a node
    of it failed or is gone (planned afresh anyway), or the gang holds nothing (after an operator
    restart, until it is planned again)."""
    room = cyc.return_rooms.get(view.uid)
    if room is None:
        return []
    short = {node for node, gpus in room.wanted.items() if room.booked[node] < gpus}
    nodes = cyc.snapshot.nodes
    if not short or any(nodes.get(n) is None or not nodes[n].ready for n in room.wanted):
        return []
    _, gang = _job_named_by(cyc, eviction.get("by") or "")
    hold = cyc.held_before.get(gang.uid) if gang is not None else None
    if hold is None:
        return []
    return sorted(
        ref
        for ref, leaving in _leaving_nodes(cyc).items()
        if ref != view.ref and not leaving.isdisjoint(short) and not leaving.isdisjoint(hold.nodes)
    )


def _leaving_nodes(cyc: Cycle) -> dict[str, frozenset[str]]:
    """Job -> the nodes its eviction under way leaves, for evictions that do not end in this cycle
    as the cycle began (built once a cycle, when a mover first asks). A holder whose checkpoint is
    done, or whose grace period is over, leaves in this cycle's reconciles, before the room is
    taken in admission: not waited for, so two movers on each other's way back both go."""
    cached = cyc.scratch.get("leaving_nodes")
    if cached is not None:
        return cached
    out = {}
    for job in cyc.state.jobs.values():
        status = cyc.writer.effective(job)
        groups, _ = leaving_groups(job, status)
        if not groups:
            continue
        eviction = status["eviction"]
        if checkpoint_done(job, eviction.get("requestedAt") or "") or _deadline_passed(cyc, eviction):
            continue
        out[job.ref] = frozenset(node for group in groups for node in group["nodes"])
    cyc.scratch["leaving_nodes"] = out
    return out


def _deadline_passed(cyc: Cycle, eviction: dict[str, Any]) -> bool:
    """The eviction's grace period is over (one without a deadline counts as over)."""
    return cyc.now >= (parse_time(eviction.get("deadline")) or cyc.now)


def _awaiting_way_back(cyc: Cycle, view: ResourceView, status: dict[str, Any], held_by: list[str]) -> dict[str, Any]:
    """A mover whose checkpoint is done while its room still lies under other leaving work (pods
    smaller than a node, several movers: the way back of the first to finish may be on a node the
    last one still uses) keeps running until that work has gone, at most until its grace period
    ends. Evicted now, it would find its room not yet free and be planned like any queued job,
    its room lost; it keeps its GPUs meanwhile, which only the gang it moves for wants, and that
    gang waits for the other movers anyway."""
    eviction = status["eviction"]
    message = (
        f"checkpoint done; evicted once its way back, on GPUs {', '.join(held_by)} still use(s) while "
        f"leaving too, is free (at the latest at {eviction.get('deadline')})"
    )
    requested = condition(status.get("conditions", []), "CheckpointRequested")
    if requested is not None and requested.get("message") == message:
        return status
    cyc.event(view, "AwaitingWayBack", message)
    conditions = set_condition(
        status.get("conditions", []), "CheckpointRequested", True, eviction["reason"], message, cyc.stamp
    )
    return {**status, "conditions": conditions}


HISTORY_WINDOW = dt.timedelta(hours=1)
"""The disruption budget's window (k8s/rebalancing.py `budget_used`): every eviction record this
recent is kept, since the budget and the cooldowns are counted from them; dropping one by count
would let the budget stop binding."""
HISTORY_KEPT = 10
"""Older records: this many of the newest, for people reading the status."""
HISTORY_MAX = 500
"""A bound on the status size only: an eviction is checkpoint-first, so a job sees a few an hour."""


def appended_history(status: dict[str, Any], record: dict[str, Any], now: dt.datetime) -> list[dict[str, Any]]:
    history = [*status.get("evictionHistory", []), record]
    since = now - HISTORY_WINDOW
    recent = sum(1 for r in history if (parse_time(r.get("at")) or since) > since)
    return history[-min(max(recent, HISTORY_KEPT), HISTORY_MAX) :]


def was_preempted(status: dict[str, Any]) -> bool:
    c = condition(status.get("conditions", []), "Preempted")
    return bool(c and c.get("status") == "True")
