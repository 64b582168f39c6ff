"""Pods and Services for a placed gang: deterministic names, pinned nodes, rank environment.

Ranks follow Megatron's convention with TP fastest: rank = tp + TP*(ep + EP*(pp + PP*dp)). Every
tp*ep group is therefore a run of adjacent ranks (one HBD group, one supernode), and giving back
the highest DP replicas leaves every surviving rank's number unchanged.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tidal import API_GROUP, API_VERSION
from tidal.k8s import labels

MASTER_PORT = 29500


@dataclass(frozen=True)
class GangShape:
    tp: int
    ep: int
    pp: int
    dp: int
    gpus_per_pod: int

    @classmethod
    def of(cls, spec: dict[str, Any], dp: int | None = None) -> GangShape:
        return cls(spec.get("tp", 1), spec.get("ep", 1), spec.get("pp", 1), dp or spec.get("dp", 1), spec["gpusPerPod"])

    @property
    def world_size(self) -> int:
        return self.tp * self.ep * self.pp * self.dp

    @property
    def group_gpus(self) -> int:
        return max(self.tp * self.ep, self.gpus_per_pod)

    @property
    def pods_per_group(self) -> int:
        return self.group_gpus // self.gpus_per_pod

    @property
    def groups(self) -> int:
        return self.world_size // self.group_gpus

    @property
    def groups_per_replica(self) -> int:
        return self.groups // self.dp

    def replica_of_group(self, group: int) -> int:
        return group // self.groups_per_replica

    def rank_of(self, group: int, pod_in_group: int) -> int:
        return group * self.group_gpus + pod_in_group * self.gpus_per_pod

    def parallel_ranks(self, rank: int) -> dict[str, int]:
        return {
            "TP": rank % self.tp,
            "EP": (rank // self.tp) % self.ep,
            "PP": (rank // (self.tp * self.ep)) % self.pp,
            "DP": rank // (self.tp * self.ep * self.pp),
        }


def pod_name(owner: str, index: int) -> str:
    return f"{owner}-{index}"


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pinned_pod(
    template: dict[str, Any],
    *,
    name: str,
    namespace: str,
    node: str,
    accelerator: str,
    gpus: int,
    pod_labels: dict[str, str],
    owner: dict[str, Any],
    env: dict[str, str],
    subdomain: str | None = None,
    priority_class_name: str | None = None,
) -> dict[str, Any]:
    """A pod from the user's template, gated and pinned to `node`, with the tidal env and labels."""
    template = copy.deepcopy(template or {})
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    spec.setdefault("containers", [{"name": "main", "image": "registry.k8s.io/pause:3.10"}])
    spec.setdefault("restartPolicy", "Never")
    spec["schedulingGates"] = [*spec.get("schedulingGates", []), {"name": labels.GANG_GATE}]
    affinity = spec.setdefault("affinity", {})
    affinity["nodeAffinity"] = {
        **affinity.get("nodeAffinity", {}),
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
    }
    if priority_class_name:  # the workload's class (validated to exist before any pod is made)
        spec["priorityClassName"] = priority_class_name
    if subdomain:
        spec["hostname"] = name
        spec["subdomain"] = subdomain
    first = spec["containers"][0]
    resources = first.setdefault("resources", {})
    for kind in ("requests", "limits"):
        resources.setdefault(kind, {})[accelerator] = str(gpus)
    for container in spec["containers"]:
        existing = [e for e in container.get("env", []) if e.get("name") not in env]
        container["env"] = existing + [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(meta.get("labels") or {}), **pod_labels, labels.MANAGED_BY: "tidal"},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def pinned_node(pod: dict[str, Any]) -> str:
    """The node a manifest made by pinned_pod is pinned to."""
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]


def training_pods(
    job: str, namespace: str, uid: str, spec: dict[str, Any], shape: GangShape, group_nodes: dict[int, list[str]]
) -> dict[str, dict[str, Any]]:
    """Pod name -> manifest for every pod of the placed groups (group index -> node per pod)."""
    owner = owner_reference("TrainingJob", job, uid)
    master = f"{pod_name(job, 0)}.{job}.{namespace}.svc"
    pods = {}
    for group, nodes in group_nodes.items():
        for i, node in enumerate(nodes):
            index = group * shape.pods_per_group + i
            rank = shape.rank_of(group, i)
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(shape.world_size),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": str(shape.gpus_per_pod),
                "NODE_RANK": str(index),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(MASTER_PORT),
                "TIDAL_JOB": job,
                "TIDAL_HBD_GROUP": str(group),
                **{f"TIDAL_{axis}_RANK": str(v) for axis, v in shape.parallel_ranks(rank).items()},
                **{f"TIDAL_{axis}": str(getattr(shape, axis.lower())) for axis in ("TP", "EP", "PP", "DP")},
            }
            name = pod_name(job, index)
            pods[name] = pinned_pod(
                spec.get("template") or {},
                name=name,
                namespace=namespace,
                node=node,
                accelerator=spec.get("accelerator", "nvidia.com/gpu"),
                gpus=shape.gpus_per_pod,
                pod_labels={labels.JOB: job, labels.HBD_GROUP: str(group), labels.RANK: str(rank)},
                owner=owner,
                env=env,
                subdomain=job,
                priority_class_name=spec.get("priorityClassName"),
            )
    return pods


def headless_service(job: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job,
            "namespace": namespace,
            "labels": {labels.JOB: job, labels.MANAGED_BY: "tidal"},
            "ownerReferences": [owner_reference("TrainingJob", job, uid)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {labels.JOB: job},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT}],
        },
    }
