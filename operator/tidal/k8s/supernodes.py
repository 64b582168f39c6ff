"""Supernode status from the snapshot, and discovery of Supernodes from a node label."""

from __future__ import annotations

import re
from typing import Any

from tidal.k8s import labels
from tidal.k8s.api import Api
from tidal.k8s.cache import Membership
from tidal.k8s.cycle import Cycle
from tidal.k8s.state import NodeView, ResourceView
from tidal.k8s.status import set_condition

_NAME = re.compile(r"[^a-z0-9.-]+")


def supernode_status(cyc: Cycle, view: ResourceView, member: Membership | None) -> dict[str, Any]:
    """The status to write; set_condition keeps lastTransitionTime for an unchanged condition, so a
    steady supernode's compares equal and is not rewritten."""
    nodes = list(member.nodes) if member else []
    snapshot = cyc.snapshot
    totals = snapshot.supernode_totals(view.name) if member else None
    failed = [n for n in nodes if not snapshot.nodes[n].ready]
    ready = [n for n in nodes if snapshot.nodes[n].usable]
    status: dict[str, Any] = {
        "nodes": nodes,
        "readyNodes": len(ready),
        "failedNodes": failed,
        "spareNodes": sorted(member.spares) if member else [],
        "gpus": {
            "total": totals.total if totals else 0,
            "allocated": totals.allocated if totals else 0,
            "free": totals.free if totals else 0,
            "failed": totals.failed if totals else 0,
            "spare": totals.spare if totals else 0,
        },
        "largestFreeSlice": snapshot.largest_free_slice(view.name) if member else 0,
    }
    conditions = cyc.writer.effective(view).get("conditions", [])
    if not nodes:
        healthy, reason, message = False, "NoMembers", "no Node matches the node selector"
    elif failed:
        healthy, reason, message = False, "Degraded", f"{len(failed)} of {len(nodes)} node(s) NotReady"
    else:
        healthy, reason, message = True, "AllNodesReady", f"{len(nodes)} node(s) Ready"
    status["conditions"] = set_condition(conditions, "Healthy", healthy, reason, message, cyc.stamp)
    return status


def supernode_name(label_value: str) -> str:
    name = _NAME.sub("-", label_value.lower()).strip("-.")
    return name[:253] or "supernode"


DEFAULT_ACCELERATORS = ("nvidia.com/gpu", "huawei.com/Ascend910", "amd.com/gpu")


def accelerator_of(node: NodeView, accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS) -> str:
    """The first of the known accelerator resources the node offers."""
    return next((r for r in accelerators if node.capacity.get(r)), accelerators[0])


def discover(
    api: Api, label: str, node: NodeView, known: set[str], accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS
) -> str | None:
    """Create the Supernode for a node's `label` value if none exists; returns its name if created."""
    value = node.labels.get(label)
    if not value:
        return None
    name = supernode_name(value)
    if name in known:
        return None
    spec: dict[str, Any] = {"nodeSelector": {label: value}, "accelerator": accelerator_of(node, accelerators)}
    if node.labels.get(labels.BLOCK):
        spec["topology"] = {"block": node.labels[labels.BLOCK]}
    return name if api.create_supernode(name, spec) else None
