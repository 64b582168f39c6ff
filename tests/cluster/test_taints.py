"""Taints on the real cluster: a gang is never placed on nodes tainted against its pods."""

from __future__ import annotations

from tidal.k8s.compact import from_wire

from .kube import Kube
from .operator_process import OperatorProcess
from .test_operator import job, node_supernodes, pods_of, submit, wait_phase

TAINT_KEY = "tidal.dev/test-reserved"


def test_a_new_gang_is_placed_only_on_nodes_whose_taints_it_tolerates(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    racks = sorted(set(node_supernodes(kube).values()))
    open_rack, closed = racks[-1], racks[:-1]
    try:
        for rack in closed:
            selector = f"tidal.dev/supernode={rack}"
            kube.run("taint", "nodes", "-l", selector, f"{TAINT_KEY}=yes:NoSchedule", "--overwrite")
        submit(kube, namespace, job("tainted", dp=1))  # 32 GPUs: fits any one rack
        status = from_wire(wait_phase(kube, namespace, "tainted", "Running", timeout=120))
        supernodes = node_supernodes(kube)
        placed = {supernodes[n] for g in status["placement"] for n in g["nodes"]}
        assert placed == {open_rack}, f"placed on tainted racks: {placed - {open_rack}}"
        assert {supernodes[p["spec"]["nodeName"]] for p in pods_of(kube, namespace, "tainted")} == {open_rack}
    finally:
        for rack in closed:
            kube.run("taint", "nodes", "-l", f"tidal.dev/supernode={rack}", f"{TAINT_KEY}-", check=False)


def test_a_new_gang_is_never_placed_on_cordoned_nodes(kube: Kube, running_operator: OperatorProcess, namespace: str):
    """A cordon is seen twice (spec.unschedulable, and the node.kubernetes.io/unschedulable taint
    Kubernetes adds): with both ignored the gang lands on cordoned nodes and never binds (tried)."""
    racks = sorted(set(node_supernodes(kube).values()))
    open_rack = racks[len(racks) // 2]  # neither end: no packing order picks it by chance
    closed = [r for r in racks if r != open_rack]
    try:
        for rack in closed:
            kube.run("cordon", "-l", f"tidal.dev/supernode={rack}")
        submit(kube, namespace, job("cordoned", dp=1))  # 32 GPUs: fits any one rack
        status = from_wire(wait_phase(kube, namespace, "cordoned", "Running", timeout=120))
        supernodes = node_supernodes(kube)
        placed = {supernodes[n] for g in status["placement"] for n in g["nodes"]}
        assert placed == {open_rack}, f"placed on cordoned racks: {placed - {open_rack}}"
    finally:
        for rack in closed:
            kube.run("uncordon", "-l", f"tidal.dev/supernode={rack}", check=False)
