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


RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Discovery's waits after a failed LIST or create, growing while failures repeat."""


class Discovery:
    """Supernodes made from a node label (`tidal run --discover-supernodes LABEL`).

    The node informer (k8s/informer.py) calls `node` for every node it lists or watches, in its
    thread: `node` only notes a label value whose Supernode is not known (one entry per name, so a
    listing of 5,000 nodes notes each rack once) and wakes this class's own thread, which makes the
    API calls (`work`): a slow or failing API server stalls discovery, never the node watch.

    `known` holds the names of the Supernodes that exist, as last heard: seeded by one LIST of
    their names (again after a failure, backed off, never once per node), kept by kopf's Supernode
    events (`seen`) and by what this creates (or finds already made: a 409). The index audit's LIST
    takes out what it lacks (`prune`: a Supernode deleted while kopf's watch was down gets no
    event); it adds nothing, so a deletion heard while that LIST was served is not undone. A node
    whose label names a Supernode not known creates it, so one deleted while a node still bears its
    label comes back at that node's next event.

    Not paused by kopf peering (the informer runs in a replica standing by too, to keep its tables
    warm): creating a missing Supernode is idempotent and made from the node's labels alone, so
    replicas with the same flags make the same object (the second gets a 409), and a standby,
    seeded by the LIST and never told of deletions, re-makes none the active replica made."""

    def __init__(
        self,
        api: Api,
        label: str,
        accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS,
        wait: Any = None,
    ):
        self.api, self.label, self.accelerators = api, label, accelerators
        self.known: set[str] = set()
        self.seeded = False
        self.pending: dict[str, tuple[str, NodeView]] = {}
        """Supernode name -> (uid, view) of the first node that named it, not yet looked at."""
        self._deleted: set[str] = set()
        """Names kopf said were deleted while the seeding LIST was out (it may still list them)."""
        self.lock = threading.Lock()
        """`known` and `pending` change from the informer's thread, this one and the event loop."""
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._wait = wait or self.stopping.wait
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="tidal-supernode-discovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def node(self, uid: str, node: NodeView) -> None:
        """The node informer's hook: note the node's Supernode if it is not known; no API call."""
        value = node.labels.get(self.label)
        if not value:
            return
        name = supernode_name(value)
        with self.lock:
            if name in self.known or name in self.pending:
                return
            self.pending[name] = (uid, node)
        self.wake.set()

    def seen(self, name: str, gone: bool) -> None:
        """kopf's event of a Supernode (on the event loop)."""
        with self.lock:
            if gone:
                self.known.discard(name)
                self._deleted.add(name)
            else:
                self.known.add(name)
                self._deleted.discard(name)

    def prune(self, names: set[str]) -> None:
        """Every Supernode name the API server held when the index audit's LIST was served: what
        it lacks is not known any more."""
        with self.lock:
            self.known &= names

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            self.wake.wait()
            self.wake.clear()
            if self.stopping.is_set():
                return
            try:
                self.work()
                failures = 0
            except Exception as e:  # the API server refused or is away: what is pending stays
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("supernode discovery failed; retrying", error=f"{type(e).__name__}: {str(e)[:200]}")
                if self._wait(delay):
                    return
                self.wake.set()

    def work(self) -> list[str]:
        """Seed `known` if it is not, then create the Supernode of every pending name still not
        known; returns the names created. Raises on an API failure, leaving the rest pending."""
        if not self.seeded:
            with self.lock:
                self._deleted.clear()
            listed = self.api.list_keys("supernode")
            with self.lock:
                self.known |= listed - self._deleted
                self.seeded = True
        created: list[str] = []
        while True:
            with self.lock:
                if not self.pending:
                    return created
                name, (uid, node) = next(iter(self.pending.items()))
                exists = name in self.known  # since it was noted: the seeding LIST, kopf's event
            made = None if exists else discover(self.api, self.label, node, set(), self.accelerators)
            with self.lock:
                self.known.add(name)  # created, known already, or made meanwhile by someone else (409)
                self.pending.pop(name, None)
            if made:
                created.append(made)
                log.info("supernode discovered", supernode=made, node=node.name, label=self.label)
                message = f"created Supernode {made} from {self.label}"
                self.api.event("Node", None, node.name, uid, "SupernodeDiscovered", message, api_version="v1")
