"""Defragmentation on the KWOK cluster (8 NVL72 racks of 18 nodes x 4 GPUs): small preemptible
work scattered over every rack, a gang that needs a whole rack becomes Running after
checkpoint-first moves; moved jobs run again elsewhere; no split group, no GPU over-booked."""

from __future__ import annotations

from collections import Counter

from tidal.k8s import compact

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import (
    GPU,
    assert_gangs_sound,
    job,
    node_supernodes,
    pods_of,
    status,
    submit,
    wait_phase,
)

RACKS = 8


def live_pods(kube: Kube, namespace: str) -> list[dict]:
    return [
        p
        for p in kube.get("pods", "-n", namespace, "-l", "app.kubernetes.io/managed-by=tidal")["items"]
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


def racks_of(kube: Kube, namespace: str, name: str, where: dict[str, str]) -> set[str]:
    return {where[p["spec"]["nodeName"]] for p in pods_of(kube, namespace, name) if p["spec"].get("nodeName")}


def assert_independently_sound(kube: Kube, namespace: str, where: dict[str, str]) -> None:
    """From pods alone: every HBD group on one rack, no node given more GPUs than it has."""
    capacity = {n["metadata"]["name"]: int(n["status"]["allocatable"][GPU]) for n in kube.get("nodes")["items"]}
    used: Counter[str] = Counter()
    groups: dict[tuple[str, str], set[str]] = {}
    for p in live_pods(kube, namespace):
        node = p["spec"].get("nodeName")
        if not node:
            continue
        used[node] += int(p["spec"]["containers"][0]["resources"]["requests"][GPU])
        key = (p["metadata"]["labels"]["tidal.dev/job"], p["metadata"]["labels"]["tidal.dev/hbd-group"])
        groups.setdefault(key, set()).add(where[node])
    assert not {n: g for n, g in used.items() if g > capacity[n]}, f"over-booked: {used}"
    assert all(len(r) == 1 for r in groups.values()), f"a group spans racks: {groups}"


def test_whole_rack_gang_runs_after_checkpoint_first_moves(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    where = node_supernodes(kube)
    # Scaffold: one 56-GPU group on every rack, so each small job below can only land on its own rack.
    submit(kube, namespace, job("scaffold", tp=4, ep=14, pp=1, dp=RACKS))
    wait_phase(kube, namespace, "scaffold", "Running")
    smalls = [f"small-{i}" for i in range(RACKS)]
    submit(
        kube,
        namespace,
        *(
            job(
                name,
                tp=4,
                ep=4,
                pp=1,
                dp=1,
                priorityClassName="tidal-batch",
                preemptible=True,
                checkpoint={"gracePeriodSeconds": 600},
            )
            for name in smalls
        ),
    )
    for name in smalls:
        wait_phase(kube, namespace, name, "Running")
    kube.run("delete", "trainingjob", "scaffold", "-n", namespace, "--wait=true", "--timeout=60s")
    eventually(lambda: not pods_of(kube, namespace, "scaffold"), timeout=90, what="scaffold pods gone")
    before = {name: racks_of(kube, namespace, name, where) for name in smalls}
    assert sorted(r for rs in before.values() for r in rs) == sorted(set(where.values())), "one per rack"
    # 8 x 56 = 448 GPUs free, no rack with 72: blocked only by fragmentation.

    # Equal priority: preemption may not touch the small jobs, a move (re-placed elsewhere) may.
    submit(kube, namespace, job("whole-rack", tp=4, ep=18, pp=1, dp=1, priorityClassName="tidal-batch"))

    def moving() -> list[str]:
        return [n for n in smalls if (status(kube, namespace, n).get("eviction") or {}).get("reason") == "Defragmented"]

    movers = eventually(moving, timeout=60, what="a defragmentation move")
    assert len(movers) == 1, movers
    mover = movers[0]
    requested = eventually(
        lambda: (
            kube.get("trainingjob", mover, "-n", namespace)["metadata"]
            .get("annotations", {})
            .get("tidal.dev/checkpoint-requested")
        ),
        timeout=30,
        what="checkpoint request on the mover",
    )
    eventually(
        lambda: all(
            p["metadata"].get("annotations", {}).get("tidal.dev/checkpoint-requested") == requested
            for p in pods_of(kube, namespace, mover)
        ),
        timeout=30,
        what="checkpoint request on the mover's pods",
    )
    waiting = eventually(
        lambda: (s := status(kube, namespace, "whole-rack")).get("reason", "").startswith("waiting for 1 defrag") and s,
        timeout=30,
        what="gang waiting for the move",
    )
    cond = {c["type"]: c for c in waiting["conditions"]}["Schedulable"]
    assert cond["reason"] == "WaitingForDefragmentation" and mover in cond["message"]
    assert len(pods_of(kube, namespace, mover)) == 4, "no pod of the mover deleted before its checkpoint"
    events = kube.get("events", "-n", namespace, "--field-selector", f"involvedObject.name={mover}")["items"]
    assert any(e["reason"] == "DefragmentationMove" and "whole-rack" in e["message"] for e in events)
    # Its way back, as the API server stored it (the CRD schema keeps the field): kept for it.
    room = compact.decode(status(kube, namespace, mover)["eviction"]["returnTo"])
    room_nodes = sorted(n for g in room for n in g["nodes"])
    assert {where[n] for n in room_nodes}.isdisjoint(before[mover]), room

    # The test plays the trainer: confirm the checkpoint.
    kube.run("annotate", "-n", namespace, "trainingjob", mover, f"tidal.dev/checkpoint-done={requested}")
    st = wait_phase(kube, namespace, "whole-rack", "Running", timeout=120)
    assert st["supernodes"] == 1 and st["worldSize"] == 72
    rack = racks_of(kube, namespace, "whole-rack", where)
    assert rack == before[mover], "the gang took the rack the move freed"
    moved = wait_phase(kube, namespace, mover, "Running", timeout=120)
    assert racks_of(kube, namespace, mover, where).isdisjoint(rack), "moved elsewhere"
    assert compact.decode(moved["assignment"]) == room, "placed again exactly on its room"
    assert sorted(p["spec"]["nodeName"] for p in pods_of(kube, namespace, mover)) == room_nodes
    preempted = {c["type"]: c for c in moved["conditions"]}["Preempted"]
    assert preempted["reason"] == "Defragmented" and "after checkpoint-done" in preempted["message"]
    assert moved["evictionHistory"][-1]["reason"] == "Defragmented"
    for name in smalls:
        if name != mover:
            st = status(kube, namespace, name)
            assert st["phase"] == "Running" and not st.get("evictionHistory"), f"{name} was not touched"
            assert racks_of(kube, namespace, name, where) == before[name]
    assert_independently_sound(kube, namespace, where)
    assert_gangs_sound(kube)
