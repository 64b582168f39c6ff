"""Why a placed workload's pods are not bound and Running, for the admission timeout (Kueue's
waitForPodsReady) of TrainingJobs (`training.py`) and InferencePool replicas (`pools.py`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from tidal.clock import parse_time
from tidal.k8s.cycle import Cycle
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.taints import OUT_OF_SERVICE, closed, tolerations_of, untolerated


def gone(cyc: Cycle, pod: PodView) -> bool:
    return pod.terminating or pod.uid in cyc.deleted_uids


def running(pod: PodView | None) -> bool:
    return pod is not None and pod.bound and pod.phase == "Running"


def why_not_running(cyc: Cycle, view: ResourceView, name: str, node: str, pod: PodView | None) -> tuple[str, bool]:
    """(why the pod is not bound and Running on its planned node, whether placing its group
    again can help). An old pod of the same name still terminating cannot be helped: the new one
    is made only once it is gone, wherever the group goes."""
    node_view = cyc.state.nodes.get(node)
    if pod is not None and (pod.node != node or gone(cyc, pod)):
        old = cyc.state.nodes.get(pod.node or "")
        where = f"node {pod.node}"
        if old is not None and not old.ready:
            where += (
                " (NotReady: once it is known to be down, fence it with the taint "
                f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute, or delete the node)"
            )
        return f"pod {name}: the previous pod of that name is still terminating on {where}", False
    facts: list[str] = []
    if node_view is not None:
        if node_view.unschedulable:
            facts.append(f"node {node} is cordoned")
        refused = untolerated(closed(node_view.taints, node_view.capacity), tolerations_of(view.spec.get("template")))
        if refused:
            facts.append(f"node {node} has taint(s) {', '.join(map(str, refused))} the pod does not tolerate")
    else:
        facts.append(f"node {node} is gone")
    if pod is None:
        return f"pod {name} does not exist yet" + "".join(f"; {f}" for f in facts), True
    if not pod.bound:
        said = [pod.not_scheduled] if pod.not_scheduled else ["not scheduled yet"]
        return f"pod {name}: " + "; ".join(said + facts), True
    # Bound and still starting (a large image pull, containers being created): moving it would
    # start that over elsewhere, every timeout; it is reported, and moved only if it fails.
    return f"pod {name} is {pod.phase or 'starting'} on node {node}" + "".join(f"; {f}" for f in facts), False


def stuck_replica(
    cyc: Cycle, view: ResourceView, replica: dict[str, Any], pods: dict[str, PodView], names: list[str], stamp: Any
) -> tuple[list[str], bool]:
    """(why each pod of a pool replica is not Running, whether placing it again can help), once the
    replica has waited past the admission timeout since `stamp` (its placedAt); ([], False) before."""
    since = parse_time(stamp) if isinstance(stamp, str) else None
    if cyc.admission_timeout is None or since is None or cyc.now - since < cyc.admission_timeout:
        return [], False
    reasons: list[str] = []
    movable = False
    for name, node in zip(names, replica["nodes"], strict=True):
        pod = pods.get(name)
        if pod is not None and pod.node == node and not gone(cyc, pod):
            if running(pod):
                continue
            if pod.gated:  # held for the rest of the replica: not a cause itself
                continue
        why, can_move = why_not_running(cyc, view, name, node, pod)
        reasons.append(why)
        movable = movable or can_move
    return reasons, movable


def timeout_seconds(cyc: Cycle) -> int:
    return int(cyc.admission_timeout.total_seconds()) if isinstance(cyc.admission_timeout, dt.timedelta) else 0
