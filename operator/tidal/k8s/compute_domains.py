"""ComputeDomains on the API server: is the NVIDIA DRA driver's CRD installed, and which
Supernodes want domains. The per-job decisions are in training.py, the pure rules in
placement/compute_domains.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tidal.k8s import labels
from tidal.k8s.cache import Membership
from tidal.k8s.cycle import Cycle, log
from tidal.k8s.state import NodeView, ResourceView
from tidal.placement.compute_domains import ComputeDomainMode, pods_may_share_a_node, supernode_uses_domains
from tidal.topology.snapshot import ClusterSnapshot

DOMAIN_PODS_SHARE_NODE = "ComputeDomainPodsShareNode"
"""Reason of a workload two of whose claimed pods could share a node (see domain_pods_problem)."""
RECHECK_SECONDS = 10.0
"""How often the CRD's presence is asked again: cheap (one discovery read), and short enough that
installing or removing the driver is noticed before the next job is placed."""


class ComputeDomainSupport:
    """Whether ComputeDomains can be made now; asked lazily (only when a job wants one), cached
    for RECHECK_SECONDS, and a missing CRD is logged as a warning once per disappearance."""

    def __init__(self, probe: Callable[[], bool], clock: Callable[[], float] = time.monotonic):
        self._probe = probe
        self._clock = clock
        self._known: bool | None = None
        self._checked = float("-inf")

    def installed(self) -> bool:
        now = self._clock()
        if self._known is not None and now - self._checked < RECHECK_SECONDS:
            return self._known
        try:
            found = self._probe()
        except Exception as e:  # a failed discovery read: keep the last answer, ask again later
            log.warning("ComputeDomain discovery failed", error=str(e)[:300])
            found = bool(self._known)
        self._checked = now
        if found != self._known:
            if found:
                log.info("ComputeDomain CRD found: jobs on multi-node NVLink supernodes get ComputeDomains")
            else:
                log.warning(
                    "ComputeDomain CRD not installed (computedomains.resource.nvidia.com): pods are created "
                    "without IMEX channel claims, so multi-node NVLink is unavailable; install the NVIDIA DRA "
                    "driver for GPUs with compute domains enabled"
                )
        self._known = found
        return found

    def forget(self) -> None:
        """A create answered 404: the CRD went away; ask again at the next need."""
        self._known = None


def domain_supernodes(
    members: dict[str, Membership], supernodes: dict[str, ResourceView], nodes: dict[str, NodeView]
) -> frozenset[str]:
    """Supernodes whose own choice (spec.computeDomain, Auto: an NVLink clique label on a member)
    is to give jobs ComputeDomains. O(members) only for supernodes without the label."""
    out = set()
    for name, member in members.items():
        view = supernodes.get(name)
        mode = (view.spec if view is not None else {}).get("computeDomain")
        clique = any(labels.GPU_CLIQUE in nodes[n].labels for n in member.nodes if n in nodes)
        if supernode_uses_domains(mode, clique):
            out.add(name)
    return frozenset(out)


def is_missing_crd(error: Any) -> bool:
    return getattr(error, "status", None) == 404


def largest_domain_node(cyc: Cycle, accelerator: str, everywhere: bool = False) -> int | None:
    """The most GPUs of any `accelerator` node that may serve a ComputeDomain this cycle
    (`everywhere`: any such node, for a workload with computeDomain Enabled), or None when no
    domain can be made (no such supernode, or the CRD is not installed). Once per cycle."""
    key = ("largest_domain_node", accelerator, everywhere)
    if key not in cyc.scratch:
        names = cyc.snapshot.supernodes if everywhere else cyc.domain_supernodes
        cyc.scratch[key] = _largest_node(cyc.snapshot, names, accelerator) if cyc.domains_installed() else None
    return cyc.scratch[key]


def _largest_node(snapshot: ClusterSnapshot, supernodes: Iterable[str], accelerator: str) -> int | None:
    sizes = [
        snapshot.nodes[n].gpus
        for name in supernodes
        if name in snapshot.supernodes and snapshot.supernodes[name].accelerator == accelerator
        for n in snapshot.supernodes[name].nodes
        if n in snapshot.nodes
    ]
    return max(sizes) if sizes else None


def domain_pods_problem(cyc: Cycle, spec: dict[str, Any], pods: int, mode: str | None = None) -> str | None:
    """Why a workload (`pods` pods of spec.gpusPerPod GPUs that would carry a ComputeDomain claim)
    must not be placed: two of its pods could share a node, and the second would never start."""
    if mode == ComputeDomainMode.DISABLED:
        return None
    gpp = int(spec.get("gpusPerPod", 1))
    accelerator = spec.get("accelerator", "nvidia.com/gpu")
    largest = largest_domain_node(cyc, accelerator, everywhere=mode == ComputeDomainMode.ENABLED)
    if not pods_may_share_a_node(gpp, pods, largest):
        return None
    return (
        f"spec.gpusPerPod: {gpp} lets two pods share a {largest}-GPU node of a supernode that gives out "
        f"ComputeDomains, and the NVIDIA DRA driver gives a node's IMEX channel to one pod: use pods of more "
        f"than half a node (spec.gpusPerPod: {largest} for whole trays)"
    )
