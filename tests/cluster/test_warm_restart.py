"""A SIGKILLed operator restarted on a bigger cluster: its first admission is correct, and how long
the warm-up (fresh process to that admission) takes is printed, with only a generous bound.

48 NVL72 racks of KWOK nodes are added for this test (56 racks, 1,008 nodes, 4,032 GPUs in all) and
removed afterwards; it runs last (file order), so the 8-rack tests never see them.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tidal.k8s.compact import from_wire
from tidal.k8s.fake_nodes import fleet_manifests
from tidal.topology.fleet import build_fleet

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import GPU, assert_gangs_sound, job, node_supernodes, pods_of, status, submit, wait_phase

EXTRA_RACKS = 48
WARM_UP_BOUND_S = 180.0
"""Generous: a restart waits for the dead replica's peering record to expire (15 s) and lists the
cluster; the figure itself is printed and goes to the README, not asserted tightly."""


def _settled(kube: Kube, count: int) -> bool:
    nodes = kube.get("nodes")["items"]
    return len(nodes) == count and all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        and not n["spec"].get("taints")
        for n in nodes
    )


@pytest.fixture
def bigger_cluster(kube: Kube, running_operator: OperatorProcess):
    """The session cluster plus EXTRA_RACKS racks (own names), all discovered by the operator."""
    fleet = build_fleet("nvl72", EXTRA_RACKS, prefix="warm")
    names = [n.name for sn in fleet for n in sn.nodes]
    before = len(kube.get("nodes")["items"])
    kube.apply(*fleet_manifests(fleet))
    try:
        eventually(lambda: _settled(kube, before + len(names)), timeout=300, interval=2, what="extra nodes Ready")
        eventually(
            lambda: (
                sum(
                    1
                    for s in kube.get("supernodes")["items"]
                    if s["metadata"]["name"].startswith("warm-") and s.get("status", {}).get("gpus", {}).get("total")
                )
                == EXTRA_RACKS
            ),
            timeout=180,
            interval=2,
            what="extra Supernodes discovered with a status",
        )
        yield fleet
    finally:
        kube.run("delete", "node", "--ignore-not-found", "--wait=false", *names)
        kube.run("delete", "supernode", "--ignore-not-found", "--wait=false", *(sn.name for sn in fleet))
        if running_operator.proc is None or running_operator.proc.poll() is not None:
            running_operator.start()  # Supernodes carry our finalizer: only a live operator lets them go
        eventually(
            lambda: not [s for s in kube.get("supernodes")["items"] if s["metadata"]["name"].startswith("warm-")],
            timeout=180,
            interval=2,
            what="extra Supernodes gone",
        )
        eventually(lambda: len(kube.get("nodes")["items"]) == before, timeout=120, interval=2, what="extra nodes gone")


def pod_uids(kube: Kube, namespace: str, *jobs: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for j in jobs for p in pods_of(kube, namespace, j)}


def booked_gpus(kube: Kube) -> Counter[str]:
    """Node -> GPUs booked by every TrainingJob's recorded placement (what a restarted operator reads)."""
    booked: Counter[str] = Counter()
    for j in kube.get("trainingjobs", "-A")["items"]:
        st = from_wire(j.get("status") or {})
        if st.get("phase") in ("Admitted", "Running", "Restarting"):
            for group in st.get("placement") or []:
                for node in group["nodes"]:
                    booked[node] += j["spec"]["gpusPerPod"]
    return booked


def test_first_admission_after_sigkill_on_1008_nodes_is_correct_and_warm_up_is_printed(
    kube: Kube, running_operator: OperatorProcess, namespace: str, bigger_cluster, capsys: pytest.CaptureFixture
):
    # Two 1,024-GPU gangs of 64-GPU groups hold 64 of 72 GPUs on 32 racks: a rack each group
    # cannot be shared, so a restarted operator that lost their bookings would place onto them.
    submit(kube, namespace, job("held-a", tp=8, ep=8, pp=4, dp=4), job("held-b", tp=8, ep=8, pp=4, dp=4))
    for name in ("held-a", "held-b"):
        wait_phase(kube, namespace, name, "Running", timeout=240)
    held = pod_uids(kube, namespace, "held-a", "held-b")
    assert len(held) == 512

    running_operator.kill()
    # Submitted while no operator runs: the first thing the new process admits.
    submit(kube, namespace, job("after", tp=8, ep=8, pp=4, dp=4))
    started = time.monotonic()
    running_operator.start()
    eventually(
        lambda: status(kube, namespace, "after").get("phase") in ("Admitted", "Running"),
        timeout=WARM_UP_BOUND_S,
        interval=0.2,
        what="the first admission after the restart",
    )
    warm_up = time.monotonic() - started
    wait_phase(kube, namespace, "after", "Running", timeout=240)
    running = time.monotonic() - started
    nodes = len(kube.get("nodes")["items"])
    with capsys.disabled():
        print(
            f"\n[warm restart] {nodes} nodes: SIGKILLed operator restarted, first admission after "
            f"{warm_up:.1f} s, its 256 pods Running after {running:.1f} s"
        )

    after = pods_of(kube, namespace, "after")
    assert sorted(p["metadata"]["name"] for p in after) == sorted(f"after-{i}" for i in range(256))
    assert sorted(int(p["metadata"]["labels"]["tidal.dev/rank"]) for p in after) == list(range(0, 1024, 4))
    untouched = pod_uids(kube, namespace, "held-a", "held-b") == held
    assert untouched, "the restarted operator re-created or deleted pods of gangs already running"
    capacity = {n["metadata"]["name"]: int(n["status"]["allocatable"][GPU]) for n in kube.get("nodes")["items"]}
    over = {n: g for n, g in booked_gpus(kube).items() if g > capacity.get(n, 0)}
    assert not over, f"recorded placements over-book nodes: {over}"
    placement = from_wire(status(kube, namespace, "after"))["placement"]
    supernode = node_supernodes(kube)
    assert len(placement) == 16 and all(len({supernode[n] for n in g["nodes"]}) == 1 for g in placement)
    assert_gangs_sound(kube)
