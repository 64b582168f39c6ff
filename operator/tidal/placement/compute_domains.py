"""ComputeDomains for multi-node NVLink (GB200 NVL72): which supernodes of a job get one, their
names, and the claim every pod of those supernodes carries. Pure: no Kubernetes client here.

On an NVL72 rack a pod reaches the GPUs of other trays over NVLink only through an IMEX channel,
which the NVIDIA DRA driver hands out per `ComputeDomain` (resource.nvidia.com). The driver does
not keep a domain's pods inside one NVLink clique and lets a node serve one domain at a time, so
tidal makes one domain per (job, supernode): a job's groups on one rack share it, and its groups on
another rack get their own (NVLink does not cross racks anyway).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

CLAIM_NAME = "compute-domain"
"""The name of the claim in the pod (spec.resourceClaims[].name and the container's resources.claims)."""
TEMPLATE_SUFFIX = "-channel"
NAME_MAX = 63 - len(TEMPLATE_SUFFIX)
"""ComputeDomain names stay DNS labels with room for the template suffix: the driver names
objects (and labels nodes) after them."""


class ComputeDomainMode(StrEnum):
    AUTO = "Auto"
    ENABLED = "Enabled"
    DISABLED = "Disabled"


@dataclass(frozen=True)
class DomainPlan:
    """One ComputeDomain of a job: on one supernode, for the groups placed there."""

    name: str
    supernode: str
    template: str
    """The ResourceClaimTemplate the driver makes for it (spec.channel.resourceClaimTemplate.name)."""
    groups: tuple[int, ...]


def domain_name(job: str, supernode: str) -> str:
    """`<job>-<supernode>`, or `<job>-<hash>` when that would be too long; always deterministic, so
    a restarted operator finds the domains it made, and distinct per (job, supernode)."""
    name = f"{job}-{supernode}".lower()
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(f"{job}/{supernode}".encode()).hexdigest()[:10]
    return f"{job[: NAME_MAX - len(digest) - 1].rstrip('-')}-{digest}".lower()


def template_name(domain: str) -> str:
    return domain + TEMPLATE_SUFFIX


def supernode_uses_domains(mode: str | None, nodes_have_clique: bool) -> bool:
    """A Supernode's own choice: Enabled/Disabled as set, Auto when its nodes carry an NVLink
    clique label (NVIDIA GPU feature discovery sets nvidia.com/gpu.clique on multi-node NVLink)."""
    if mode == ComputeDomainMode.ENABLED:
        return True
    if mode == ComputeDomainMode.DISABLED:
        return False
    return nodes_have_clique


def job_uses_domain(job_mode: str | None, supernode_on: bool) -> bool:
    """The job's field wins when set; Auto follows the supernode."""
    if job_mode == ComputeDomainMode.ENABLED:
        return True
    if job_mode == ComputeDomainMode.DISABLED:
        return False
    return supernode_on


def plan_domains(
    job: str, job_mode: str | None, placement: Iterable[Mapping[str, Any]], domain_supernodes: frozenset[str] | set[str]
) -> dict[str, DomainPlan]:
    """Supernode -> the job's ComputeDomain there, for every supernode its placed groups use that
    wants one (`domain_supernodes`: supernodes whose own choice is on)."""
    groups: dict[str, list[int]] = {}
    nodes: dict[str, list[str]] = {}
    for entry in placement:
        groups.setdefault(entry["supernode"], []).append(int(entry["group"]))
        nodes.setdefault(entry["supernode"], []).extend(entry["nodes"])
    out = {}
    for supernode, ids in sorted(groups.items()):
        if _packed(nodes[supernode]):
            continue  # placed before a domain was wanted: its pods stay unclaimed (see _packed)
        if job_uses_domain(job_mode, supernode in domain_supernodes):
            name = domain_name(job, supernode)
            out[supernode] = DomainPlan(name, supernode, template_name(name), tuple(sorted(ids)))
    return out


def replica_domain(pool: str, replica: int, supernode: str, nodes: Iterable[str], on: bool) -> DomainPlan | None:
    """An InferencePool replica's own ComputeDomain, when it spans more than one node (tray) of a
    supernode that wants domains (`on`): within one tray NVLink needs no IMEX channel.

    One per replica rather than one per pool per supernode: replicas come and go one by one
    (scaling, failures), and a per-replica domain is made and deleted with exactly its replica,
    never tying unrelated replicas' IMEX daemons together or outliving the replica's nodes.
    `groups` holds the replica id."""
    nodes = list(nodes)
    if not on or len(set(nodes)) < 2 or _packed(nodes):
        return None
    name = domain_name(pool, f"replica-{replica}")
    return DomainPlan(name, supernode, template_name(name), (replica,))


def _packed(nodes: list[str]) -> bool:
    """Two pods on one node: a placement made before a domain was wanted there (the admission
    rule, pods_may_share_a_node, keeps any later one from packing). A domain for it would give
    each remade pod its own claim on a node with one IMEX channel, and the second would never
    start; so no domain is wanted, whichever path makes its pods."""
    return len(set(nodes)) < len(nodes)


def claims_by_group(domains: Mapping[str, DomainPlan]) -> dict[int, str]:
    """Group -> the ResourceClaimTemplate its pods claim."""
    return {g: d.template for d in domains.values() for g in d.groups}


def stale_domains(recorded: Iterable[str], wanted: Mapping[str, DomainPlan]) -> list[str]:
    """Domains made earlier that no placed group needs any more (a rack given back by a shrink,
    a group moved elsewhere by a restart): they are deleted."""
    keep = {d.name for d in wanted.values()}
    return sorted(set(recorded) - keep)


def add_channel_claim(pod_spec: dict[str, Any], template: str, container: int = 0) -> None:
    """Put the domain's claim on a pod spec (in place): listed under spec.resourceClaims and
    consumed by the GPU container (`container`), idempotently."""
    claims = [c for c in pod_spec.get("resourceClaims") or [] if c.get("name") != CLAIM_NAME]
    pod_spec["resourceClaims"] = [*claims, {"name": CLAIM_NAME, "resourceClaimTemplateName": template}]
    resources = pod_spec["containers"][container].setdefault("resources", {})
    used = [c for c in resources.get("claims") or [] if c.get("name") != CLAIM_NAME]
    resources["claims"] = [*used, {"name": CLAIM_NAME}]


def pods_may_share_a_node(gpus_per_pod: int, pods: int, node_gpus: int | None) -> bool:
    """Whether two of a workload's claimed pods could land on one node (of at most `node_gpus`):
    the driver publishes one default IMEX channel per node and a DRA device serves one claim,
    while every pod gets its own claim from the domain's template, so the second pod would never
    start (kubernetes-sigs/dra-driver-nvidia-gpu#309). The planner fills a node with as many pods
    as fit, so this is decided on the shape, before any planning, preemption or growth."""
    return node_gpus is not None and pods > 1 and 2 * gpus_per_pod <= node_gpus


def exclusive_nodes(domains: Mapping[str, DomainPlan], placement: Iterable[Mapping[str, Any]]) -> set[str]:
    """Nodes a job holds whole because a ComputeDomain of its own runs there: the driver lets a
    node serve one domain at a time, so no other gang may share them."""
    on = set(domains)
    return {node for entry in placement if entry["supernode"] in on for node in entry["nodes"]}
