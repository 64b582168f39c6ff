"""Node manifests for a simulated (KWOK) GPU fleet, built from the same shapes as the simulator."""

from __future__ import annotations

from typing import Any

from tidal.k8s import labels
from tidal.topology.fleet import FleetSupernode

KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def node_manifest(node_name: str, supernode: FleetSupernode, gpus: int, accelerator: str) -> dict[str, Any]:
    node_labels = {
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        labels.SUPERNODE: supernode.name,
        labels.BLOCK: supernode.block,
    }
    if supernode.shape.kind == "nvl72":
        # NVIDIA GPU feature discovery labels the members of one multi-node NVLink domain alike.
        node_labels[labels.GPU_CLIQUE] = supernode.name
    resources = {"cpu": "144", "memory": "1536Gi", "pods": "110", accelerator: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node_name,
            "labels": node_labels,
            "annotations": {KWOK_ANNOTATION: "fake"},
        },
        "spec": {},
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "containerRuntimeVersion": "kwok",
                "osImage": "kwok",
                "kernelVersion": "kwok",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
            "phase": "Running",
        },
    }


def fleet_manifests(fleet: list[FleetSupernode]) -> list[dict[str, Any]]:
    return [node_manifest(n.name, sn, n.gpus, n.accelerator) for sn in fleet for n in sn.nodes]
