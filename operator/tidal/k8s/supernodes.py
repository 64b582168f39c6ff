"""Supernode status from the snapshot, and discovery of Supernodes from a node label."""

from __future__ import annotations

import re
import threading
from typing import Any

import structlog

from tidal.k8s import labels
from tidal.k8s.api import Api
from tidal.k8s.cache import Membership
from tidal.k8s.cycle import Cycle
from tidal.k8s.state import NodeView, ResourceView
from tidal.k8s.status import set_condition

log = structlog.get_logger("tidal")

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


class Discovery:
    """Supernodes made from a node label (`tidal run --discover-supernodes LABEL`): the node
    informer (k8s/informer.py) calls `node` for every node it lists or watches, in its thread.

    `known` holds the names of the Supernodes that exist, as last heard: seeded by one LIST of their
    names at the first labelled node, kept by kopf's Supernode events (`seen`) and by what this
    creates (or finds already made: a 409), and replaced by the index audit's LIST (`reset`: a
    Supernode deleted while kopf's watch was down gets no event). A node whose label names a
    Supernode not known creates it, so one deleted while a node still bears its label comes back
    at that node's next event.

    Not paused by kopf peering (the informer runs in a replica standing by too, to keep its tables
    warm): creating a missing Supernode is idempotent and made from the node's labels alone, so
    replicas with the same flags make the same object, and a standby, seeded by the LIST and
    never told of deletions, makes none the active replica made or re-made."""

    def __init__(self, api: Api, label: str, accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS):
        self.api, self.label, self.accelerators = api, label, accelerators
        self.known: set[str] = set()
        self.seeded = False
        self.lock = threading.Lock()
        """`known` is changed from the informer's thread and the event loop."""

    def seen(self, name: str, gone: bool) -> None:
        """kopf's event of a Supernode (on the event loop)."""
        with self.lock:
            if gone:
                self.known.discard(name)
            else:
                self.known.add(name)

    def reset(self, names: set[str]) -> None:
        """Every Supernode name the API server holds now (the index audit's LIST)."""
        with self.lock:
            self.known = set(names)
            self.seeded = True

    def node(self, body: dict[str, Any], node: NodeView) -> str | None:
        """Create the Supernode `node`'s label names if it is not known; returns its name if created."""
        value = node.labels.get(self.label)
        if not value:
            return None
        name = supernode_name(value)
        if not self.seeded:
            listed = self.api.list_keys("supernode")
            with self.lock:
                self.known |= listed
                self.seeded = True
        with self.lock:
            known = set(self.known)
        if name in known:
            return None
        created = discover(self.api, self.label, node, known, self.accelerators)
        with self.lock:
            self.known.add(name)  # created, or made meanwhile by someone else (409)
        if created:
            log.info("supernode discovered", supernode=created, node=node.name, label=self.label)
            uid = (body.get("metadata") or {}).get("uid") or ""
            message = f"created Supernode {created} from {self.label}"
            self.api.event("Node", None, node.name, uid, "SupernodeDiscovered", message, api_version="v1")
        return created
