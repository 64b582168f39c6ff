"""The operator's defragmentation: moves are checkpoint-first, the gang waits with its nodes
reserved, moved jobs are re-admitted elsewhere, moves count against the disruption budget."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from tidal.clock import FixedClock
from tidal.k8s import compact, training
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.cycle import Hold
from tidal.k8s.quota import quota_view
from tidal.k8s.rebalancing import RebalanceSettings
from tidal.k8s.return_rooms import ReturnRoom
from tidal.k8s.taints import Taint
from tidal.metrics import Metrics
from tidal.placement import GroupAssignment

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, check_sound, run

RACKS = 4


def spec(tp: int, ep: int, dp: int = 1, priority: int | None = None, **extra) -> dict:
    """`priority`: the value of the PriorityClass named (scattered() makes prio-0 and prio-1)."""
    if priority is not None:
        extra["priorityClassName"] = f"prio-{priority}"
    return {"tp": tp, "ep": ep, "pp": 1, "dp": dp, "gpusPerPod": 4, "template": TEMPLATE, **extra}


def scattered(
    settings: ControllerSettings | None = None, templates: Sequence[dict] | None = None
) -> tuple[FakeCluster, Controller, FixedClock]:
    """One preemptible 16-GPU job on every rack (56 free each): 224 free GPUs, no rack whole.
    `templates`: small-i's pod template (default TEMPLATE)."""
    cluster = FakeCluster("nvl72", RACKS)
    for value in (0, 1):
        cluster.add_priority_class(f"prio-{value}", value)
    clock = FixedClock(dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC))
    controller = Controller(cluster, clock, settings or ControllerSettings())
    cluster.add("TrainingJob", "ml", "filler", spec(4, 14, dp=RACKS))  # 56 GPUs on every rack
    run(cluster, controller)
    for i in range(RACKS):
        template = templates[i] if templates else TEMPLATE
        cluster.add("TrainingJob", "ml", f"small-{i}", spec(4, 4, priority=1, preemptible=True, template=template))
    run(cluster, controller)
    del cluster.objects[("TrainingJob", "ml", "filler")]
    for key in [k for k, p in cluster.pods.items() if p["metadata"]["labels"].get("tidal.dev/job") == "filler"]:
        del cluster.pods[key]
    run(cluster, controller)
    racks = {_racks_of(cluster, f"small-{i}").pop() for i in range(RACKS)}
    assert len(racks) == RACKS, "one small job per rack"
    return cluster, controller, clock


def _racks_of(cluster: FakeCluster, job: str) -> set[str]:
    return {g["supernode"] for g in cluster.status("TrainingJob", "ml", job).get("placement", [])}


def _reason(cluster: FakeCluster, job: str) -> tuple[str, str]:
    st = cluster.status("TrainingJob", "ml", job)
    cond = next(c for c in st["conditions"] if c["type"] == "Schedulable")
    return cond["reason"], cond["message"]


def test_blocked_gang_moves_one_small_job_checkpoint_first_then_runs():
    cluster, controller, _ = scattered()
    metrics = Metrics()
    metrics.attach(controller)
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))  # one 72-GPU group
    cluster.calls.clear()
    run(cluster, controller, cycles=2)
    reason, message = _reason(cluster, "whole-rack")
    assert reason == "WaitingForDefragmentation" and "waiting for 1 defragmentation move(s)" in message
    moving = [f"small-{i}" for i in range(RACKS) if cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction")]
    assert len(moving) == 1
    mover = moving[0]
    eviction = cluster.status("TrainingJob", "ml", mover)["eviction"]
    assert eviction["reason"] == "Defragmented" and eviction["by"].startswith("ml/whole-rack ")
    events = [d for v, d in cluster.calls if v == "event"]
    assert any(name == mover and r == "DefragmentationMove" for name, r, _ in events)
    assert any(name == "whole-rack" and r == "Defragmenting" for name, r, _ in events)
    assert len(cluster.pods_of("tidal.dev/job", mover)) == 4, "no pod deleted before the checkpoint"
    assert all(
        "tidal.dev/checkpoint-requested" in (p["metadata"].get("annotations") or {})
        for p in cluster.pods_of("tidal.dev/job", mover)
    )
    scraped = generate_latest(metrics.registry).decode()
    assert 'tidal_pending_jobs{reason="WaitingForDefragmentation"} 1.0' in scraped
    # The three racks not reserved for the gang: 56 free each, useless to a 72-GPU group, less the
    # 16 GPUs of the mover's way back, which are kept for it (not free).
    assert "tidal_stranded_gpus 152.0" in scraped
    room = compact.decode(eviction["returnTo"])

    old_rack = _racks_of(cluster, mover)
    cluster.annotate("TrainingJob", "ml", mover, {"tidal.dev/checkpoint-done": eviction["requestedAt"]})
    run(cluster, controller, cycles=4)
    big = cluster.status("TrainingJob", "ml", "whole-rack")
    assert big["phase"] == "Running" and {g["supernode"] for g in big["placement"]} == old_rack
    moved = cluster.status("TrainingJob", "ml", mover)
    assert moved["phase"] == "Running" and _racks_of(cluster, mover).isdisjoint(old_rack)
    assert moved["placement"] == room, "placed again exactly where the move was verified"
    preempted = next(c for c in moved["conditions"] if c["type"] == "Preempted")
    assert preempted["reason"] == "Defragmented" and "ml/whole-rack" in preempted["message"]
    assert moved["evictionHistory"][-1]["reason"] == "Defragmented"
    others = [f"small-{i}" for i in range(RACKS) if f"small-{i}" != mover]
    assert all(not cluster.status("TrainingJob", "ml", j).get("evictionHistory") for j in others)
    scraped = generate_latest(metrics.registry).decode()
    assert "tidal_defrag_moves_total 1.0" in scraped
    assert "tidal_stranded_gpus 0.0" in scraped, "nothing pending"
    check_sound(cluster)


def test_higher_priority_work_is_never_moved_and_nothing_happens():
    cluster, controller, _ = scattered()
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=0))  # below the small jobs
    run(cluster, controller, cycles=3)
    reason, message = _reason(cluster, "whole-rack")
    assert reason == "InsufficientFreeCapacity" and "defragmentation" not in message, "nothing it may move"
    assert not any(cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction") for i in range(RACKS))


def test_moves_stay_within_the_disruption_budget():
    settings = ControllerSettings(rebalance=RebalanceSettings(disruption_budget_gpus_per_hour=8))
    cluster, controller, _ = scattered(settings)
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))
    run(cluster, controller, cycles=3)
    reason, message = _reason(cluster, "whole-rack")
    assert reason == "InsufficientFreeCapacity", "a 16-GPU move exceeds 8"
    assert message.endswith(
        "; defragmentation found no plan of 8 or fewer moves of preemptible jobs of priority <= 1 within the "
        "8 GPUs the hourly disruption budget still allows that makes room with every moved job fitting again"
    ), message
    assert not any(cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction") for i in range(RACKS))


def test_defragmentation_can_be_turned_off():
    cluster, controller, _ = scattered(ControllerSettings(defragment=False))
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))
    run(cluster, controller, cycles=3)
    reason, message = _reason(cluster, "whole-rack")
    assert reason == "InsufficientFreeCapacity" and "defragmentation" not in message


def test_restarted_operator_keeps_waiting_and_plans_no_second_move():
    cluster, controller, clock = scattered()
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))
    run(cluster, controller, cycles=2)
    fresh = Controller(cluster, clock, ControllerSettings())  # the intent is in the movers' status
    run(cluster, fresh, cycles=3)
    moving = [i for i in range(RACKS) if cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction")]
    assert len(moving) == 1
    assert _reason(cluster, "whole-rack")[0] == "WaitingForDefragmentation"


TOLERANT = {"spec": {**TEMPLATE["spec"], "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}


def dedicate_every_rack(cluster: FakeCluster) -> None:
    """An admin's NoSchedule taint on every node: running pods stay, new ones must tolerate it."""
    for name in list(cluster.nodes):
        cluster.nodes[name] = dataclasses.replace(cluster.nodes[name], taints=(Taint("dedicated", "a", "NoSchedule"),))


def test_a_move_is_verified_under_the_movers_tolerations_not_the_preemptors():
    """The blocked gang tolerates the taint on every rack, the small jobs do not: once moved, none
    could be placed again anywhere, so none is moved (it was: 'it fits again' on a rack it does
    not tolerate, then Pending for good)."""
    cluster, controller, _ = scattered()
    dedicate_every_rack(cluster)
    run(cluster, controller)
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1, template=TOLERANT))
    run(cluster, controller, cycles=2)
    assert not any(cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction") for i in range(RACKS))
    assert _reason(cluster, "whole-rack")[0] == "InsufficientFreeCapacity"


def test_a_mover_that_tolerates_the_taint_is_moved_and_placed_again():
    """Only small-3 tolerates the taint: it is the one moved, and both it and the gang run after."""
    cluster, controller, _ = scattered(templates=[TEMPLATE] * (RACKS - 1) + [TOLERANT])
    dedicate_every_rack(cluster)
    run(cluster, controller)
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1, template=TOLERANT))
    run(cluster, controller, cycles=2)
    moving = [f"small-{i}" for i in range(RACKS) if cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction")]
    assert moving == [f"small-{RACKS - 1}"], moving
    old_rack = _racks_of(cluster, moving[0])
    eviction = cluster.status("TrainingJob", "ml", moving[0])["eviction"]
    cluster.annotate("TrainingJob", "ml", moving[0], {"tidal.dev/checkpoint-done": eviction["requestedAt"]})
    run(cluster, controller, cycles=4)
    big = cluster.status("TrainingJob", "ml", "whole-rack")
    assert big["phase"] == "Running" and {g["supernode"] for g in big["placement"]} == old_rack
    moved = cluster.status("TrainingJob", "ml", moving[0])
    assert moved["phase"] == "Running" and _racks_of(cluster, moving[0]).isdisjoint(old_rack), moved
    check_sound(cluster)


def test_a_mover_is_verified_on_tainted_nodes_only_it_tolerates():
    """Every small job tolerates the taint, the blocked gang does not. Untainted free nodes: the 14
    beside small-0 (the gang's rack once small-0 leaves) and 3 on each of small-1's and small-2's
    racks, so under the gang's own flags small-0 has no rack to go back to. It must be verified
    under its own tolerations (MovableGang.untainted: the tainted free nodes of the other racks),
    or the one move that unblocks the gang is never made."""
    cluster, controller, _ = scattered(templates=[TOLERANT] * RACKS)
    used = {
        n
        for i in range(RACKS)
        for g in cluster.status("TrainingJob", "ml", f"small-{i}")["placement"]
        for n in g["nodes"]
    }
    for name in list(cluster.nodes):
        if name not in used:
            cluster.nodes[name] = dataclasses.replace(
                cluster.nodes[name], taints=(Taint("dedicated", "a", "NoSchedule"),)
            )
    for job, count in (("small-0", 14), ("small-1", 3), ("small-2", 3)):
        rack = sorted(_racks_of(cluster, job))[0]
        free = sorted(n for n in cluster.nodes if n not in used and n.startswith(rack + "-"))
        for name in free[:count]:
            cluster.nodes[name] = dataclasses.replace(cluster.nodes[name], taints=())
    run(cluster, controller)
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))
    run(cluster, controller, cycles=2)
    moving = [f"small-{i}" for i in range(RACKS) if cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction")]
    assert moving == ["small-0"], moving
    check_sound(cluster)


def _move_for_whole_rack(cluster: FakeCluster, controller: Controller) -> tuple[str, list[dict], set[str]]:
    """The gang that needs a whole rack is added and one small job is moved for it: (the mover, its
    way back as recorded in status.eviction.returnTo, the rack it leaves)."""
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))
    run(cluster, controller, cycles=2)
    movers = [f"small-{i}" for i in range(RACKS) if cluster.status("TrainingJob", "ml", f"small-{i}").get("eviction")]
    assert len(movers) == 1
    room = compact.decode(cluster.status("TrainingJob", "ml", movers[0])["eviction"]["returnTo"])
    assert {g["supernode"] for g in room}.isdisjoint(_racks_of(cluster, movers[0]))
    return movers[0], room, _racks_of(cluster, movers[0])


def _checkpoint_done(cluster: FakeCluster, job: str) -> None:
    eviction = cluster.status("TrainingJob", "ml", job)["eviction"]
    cluster.annotate("TrainingJob", "ml", job, {"tidal.dev/checkpoint-done": eviction["requestedAt"]})


def _returns_to_its_room_despite_a_late_job(restart: bool) -> None:
    """While the mover checkpoints, a job arrives that fits only by taking the mover's way back: 3
    groups of 56 GPUs, with 56 free on two racks and 40 (56 less the room's 16) on the third. It
    waits; the mover goes back exactly where it was verified to fit, and the gang runs. Without the
    room kept, the late job took the three racks and the mover had nowhere to go back to."""
    cluster, controller, clock = scattered()
    mover, room, old_rack = _move_for_whole_rack(cluster, controller)
    if restart:  # the room lives in the mover's status, not in the operator's memory
        controller = Controller(cluster, clock, ControllerSettings())
    cluster.add("TrainingJob", "ml", "late", spec(4, 14, dp=3, priority=0))
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "late")["phase"] == "Pending"
    _checkpoint_done(cluster, mover)
    run(cluster, controller, cycles=4)
    moved = cluster.status("TrainingJob", "ml", mover)
    assert moved["phase"] == "Running" and moved["placement"] == room
    big = cluster.status("TrainingJob", "ml", "whole-rack")
    assert big["phase"] == "Running" and {g["supernode"] for g in big["placement"]} == old_rack
    assert any(r == "DefragmentationReturn" and n == mover for v, (n, r, _) in _events(cluster))
    check_sound(cluster)


def _events(cluster: FakeCluster) -> list[tuple[str, tuple[str, str, str]]]:
    return [(v, d) for v, d in cluster.calls if v == "event"]


def test_a_mover_goes_back_to_its_room_though_a_later_job_would_take_it():
    _returns_to_its_room_despite_a_late_job(restart=False)


def test_a_restarted_operator_keeps_a_movers_room():
    _returns_to_its_room_despite_a_late_job(restart=True)


def test_a_called_off_move_frees_its_room_in_the_same_cycle():
    """The gang is deleted while the mover checkpoints: the move is called off, and in that very
    cycle its room is free again: a job needing 56 GPUs on every rack is placed at once."""
    cluster, controller, _ = scattered()
    mover, _, _ = _move_for_whole_rack(cluster, controller)
    del cluster.objects[("TrainingJob", "ml", "whole-rack")]
    cluster.add("TrainingJob", "ml", "wide", spec(4, 14, dp=RACKS, priority=0))
    run(cluster, controller, cycles=1)
    assert not cluster.status("TrainingJob", "ml", mover).get("eviction"), "called off"
    assert cluster.status("TrainingJob", "ml", "wide")["phase"] in ("Admitted", "Running")


@pytest.mark.parametrize("recently_rebalanced", [False, True])
def test_given_back_replicas_grow_back_onto_their_room(recently_rebalanced: bool):
    """The only movable job is elastic, one DP replica on each of two racks: giving back its top
    replica clears a rack for the gang, and the replica is verified to fit again beside the other.
    A job arriving meanwhile (3 groups of 56 GPUs) fits only by taking that room: it waits, and
    the replica grows back exactly there in the cycle the shrink ends. Also when the job was
    shrunk for a pool a minute ago: the grow-back cooldown holds back growth, not a move's way
    back (a review found such a job shrunk for good, its room freed)."""
    cluster = FakeCluster("nvl72", RACKS)
    cluster.add_priority_class("prio-0", 0)
    cluster.add_priority_class("prio-1", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC))
    controller = Controller(cluster, clock, ControllerSettings())
    cluster.add("TrainingJob", "ml", "filler", spec(4, 14, dp=RACKS))  # 56 GPUs on every rack
    run(cluster, controller)
    elastic = {"minDP": 1, "maxDP": 2}
    cluster.add("TrainingJob", "ml", "elastic", spec(4, 4, dp=2, priority=1, preemptible=True, elastic=elastic))
    run(cluster, controller)
    for i in (2, 3):  # not preemptible: never moved
        cluster.add("TrainingJob", "ml", f"small-{i}", spec(4, 4, priority=1))
    run(cluster, controller)
    del cluster.objects[("TrainingJob", "ml", "filler")]
    for key in [k for k, p in cluster.pods.items() if p["metadata"]["labels"].get("tidal.dev/job") == "filler"]:
        del cluster.pods[key]
    run(cluster, controller)
    assert len(_racks_of(cluster, "elastic")) == 2
    if recently_rebalanced:
        key = ("TrainingJob", "ml", "elastic")
        record = {"at": "2026-05-01T11:59:00Z", "reason": "Rebalanced", "gpus": 0}
        view = cluster.objects[key]
        cluster.objects[key] = dataclasses.replace(view, status={**view.status, "evictionHistory": [record]})
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1))
    run(cluster, controller, cycles=2)
    eviction = cluster.status("TrainingJob", "ml", "elastic")["eviction"]
    assert eviction["reason"] == "Defragmented" and eviction["replicas"] == [1]
    room = compact.decode(eviction["returnTo"])
    cluster.add("TrainingJob", "ml", "late", spec(4, 14, dp=3, priority=0))
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "late")["phase"] == "Pending"
    _checkpoint_done(cluster, "elastic")
    run(cluster, controller, cycles=4)
    grown = cluster.status("TrainingJob", "ml", "elastic")
    assert grown["currentDP"] == 2 and [g for g in grown["placement"] if g["group"] == 1] == room
    assert cluster.status("TrainingJob", "ml", "whole-rack")["phase"] == "Running"
    assert any(r == "Expanded" and "room kept" in m for _, (n, r, m) in _events(cluster) if n == "elastic")
    check_sound(cluster)


def test_a_room_on_tainted_nodes_the_mover_tolerates_is_kept_from_others_who_do():
    """Every rack is tainted; only small-3 and the gang tolerate it, so small-3 moves and its room
    lies on tainted nodes. A late job that tolerates the taint too, and fits only by taking the
    room, waits (a review found it admitted there: the room was booked only where the nodes were
    free under the operator's untolerating view, which is nowhere)."""
    cluster, controller, _ = scattered(templates=[TEMPLATE] * (RACKS - 1) + [TOLERANT])
    dedicate_every_rack(cluster)
    run(cluster, controller)
    cluster.add("TrainingJob", "ml", "whole-rack", spec(4, 18, priority=1, template=TOLERANT))
    run(cluster, controller, cycles=2)
    mover = f"small-{RACKS - 1}"
    room = compact.decode(cluster.status("TrainingJob", "ml", mover)["eviction"]["returnTo"])
    cluster.add("TrainingJob", "ml", "late", spec(4, 14, dp=3, priority=0, template=TOLERANT))
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "late")["phase"] == "Pending"
    _checkpoint_done(cluster, mover)
    run(cluster, controller, cycles=4)
    assert cluster.status("TrainingJob", "ml", mover)["placement"] == room
    check_sound(cluster)


def _on_node(cluster: FakeCluster, controller: Controller, node: str, name: str, spec: dict) -> None:
    """Add a job and run it on exactly `node`: every other node tainted while it is placed."""
    views = dict(cluster.nodes)
    for n, view in views.items():
        cluster.nodes[n] = (
            view if n == node else dataclasses.replace(view, taints=(Taint("elsewhere", "", "NoSchedule"),))
        )
    cluster.add("TrainingJob", "ml", name, spec)
    run(cluster, controller)
    cluster.nodes.update(views)
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", name)["phase"] == "Running", name


def _one_pod(gpus: int, groups: int = 1, **extra) -> dict:
    return {"tp": gpus, "ep": 1, "pp": 1, "dp": groups, "gpusPerPod": gpus, "template": TEMPLATE, **extra}


def test_a_mover_done_first_waits_for_the_mover_still_on_its_way_back():
    """Pods smaller than a node, two movers: 8-GPU servers (each its own supernode), a gang of two
    4-GPU groups, and free GPUs scattered 1 or 2 per server. m1 (6 GPUs) leaves n0 for the one
    server only it tolerates; m2 (2 GPUs) leaves n7, and its way back is the 2 GPUs of n0 that the
    gang leaves, which m1 still uses. m2's checkpoint ends first: it keeps running until m1 has
    gone, then goes back exactly there. Evicted at once (before), it found its room not yet free,
    was queued like any job, and a job that arrived before it took those GPUs when m1 left."""
    cluster = FakeCluster("hgx8", 9)
    cluster.add_priority_class("prio-1", 1)
    clock = FixedClock(dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC))
    controller = Controller(cluster, clock, ControllerSettings())
    n = sorted(cluster.nodes)
    mover = {"preemptible": True, "priorityClassName": "prio-1"}
    _on_node(cluster, controller, n[0], "f0", _one_pod(2))
    _on_node(cluster, controller, n[0], "m1", _one_pod(6, **mover, template=TOLERANT))
    for i in range(1, 7):
        _on_node(cluster, controller, n[i], f"f{i}", _one_pod(7))
    _on_node(cluster, controller, n[7], "f7", _one_pod(4))
    _on_node(cluster, controller, n[7], "m2", _one_pod(2, **mover))
    _on_node(cluster, controller, n[8], "f8", _one_pod(2))
    cluster.nodes[n[8]] = dataclasses.replace(cluster.nodes[n[8]], taints=(Taint("dedicated", "m1", "NoSchedule"),))
    cluster.add("TrainingJob", "ml", "gang", _one_pod(4, groups=2, priorityClassName="prio-1"))
    run(cluster, controller, cycles=2)
    rooms = {m: compact.decode(cluster.status("TrainingJob", "ml", m)["eviction"]["returnTo"]) for m in ("m1", "m2")}
    assert [g["nodes"] for g in rooms["m1"]] == [[n[8]]] and [g["nodes"] for g in rooms["m2"]] == [[n[0]]]
    cluster.add("TrainingJob", "ml", "late", _one_pod(2, priorityClassName="prio-1"))
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "late")["phase"] == "Pending"

    clock.advance(seconds=30)
    _checkpoint_done(cluster, "m2")
    run(cluster, controller, cycles=2)
    m2 = cluster.status("TrainingJob", "ml", "m2")
    assert m2["phase"] == "Running" and m2.get("eviction") and len(cluster.pods_of("tidal.dev/job", "m2")) == 1
    requested = next(c for c in m2["conditions"] if c["type"] == "CheckpointRequested")
    assert "ml/m1" in requested["message"] and "way back" in requested["message"], requested
    assert [r for v, (name, r, _) in _events(cluster) if name == "m2"].count("AwaitingWayBack") == 1

    clock.advance(seconds=30)
    _checkpoint_done(cluster, "m1")
    run(cluster, controller, cycles=4)
    for job in ("m1", "m2"):
        st = cluster.status("TrainingJob", "ml", job)
        assert st["phase"] == "Running" and st["placement"] == rooms[job], (job, st)
        assert any(r == "DefragmentationReturn" and name == job for v, (name, r, _) in _events(cluster))
    assert cluster.status("TrainingJob", "ml", "gang")["phase"] == "Running"
    assert cluster.status("TrainingJob", "ml", "late")["phase"] == "Pending"
    used: dict[str, int] = {}
    for pod in cluster.pods.values():
        node = pod["spec"].get("nodeName")
        used[node] = used.get(node, 0) + int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
    assert all(gpus <= 8 for gpus in used.values()), used


@pytest.mark.parametrize(
    ("holder", "waited_for"),
    [
        ("checkpointing", True),
        ("done", False),
        ("past its grace period", False),
        ("not on the gang's nodes", False),
        ("shrinking replicas elsewhere", False),
        ("the room's node failed", False),
        ("the gang holds nothing", False),
    ],
)
def test_a_mover_waits_only_for_leaving_work_the_gang_waits_for_too(holder: str, waited_for: bool):
    """m2's way back is 2 GPUs of n0, which m1 (being moved too) still uses. m2 waits for m1 only
    while m1 still checkpoints (done, or past its grace period, m1 leaves in this cycle's
    reconciles, before admission places m2), only if the gang waits for m1 too (m1 leaves GPUs of
    the gang's held nodes: otherwise m2's wait would hold the gang up), and only for leaving
    replicas on the room's nodes; not for a room already void (its node failed), nor while the
    gang holds nothing (an operator restart)."""
    cluster = FakeCluster("hgx8", 2)
    clock = FixedClock(dt.datetime(2026, 5, 1, 12, 1, tzinfo=dt.UTC))
    controller = Controller(cluster, clock, ControllerSettings())
    n0, n1 = sorted(cluster.nodes)
    requested = "2026-05-01T12:00:00Z"
    deadline = "2026-05-01T12:00:30Z" if holder == "past its grace period" else "2026-05-01T12:05:00Z"
    eviction = {"reason": "Defragmented", "by": "ml/gang (x)", "requestedAt": requested, "deadline": deadline}
    if holder == "shrinking replicas elsewhere":  # replica 1 (on n1) leaves, replica 0 on n0 stays
        cluster.add("TrainingJob", "ml", "m1", _one_pod(3, groups=2, elastic={"minDP": 1, "maxDP": 2}))
        placement = [
            {"group": 0, "supernode": "hgx8-0000", "nodes": [n0]},
            {"group": 1, "supernode": "hgx8-0001", "nodes": [n1]},
        ]
        eviction["replicas"] = [1]
    else:
        cluster.add("TrainingJob", "ml", "m1", _one_pod(6))
        placement = [{"group": 0, "supernode": "hgx8-0000", "nodes": [n0]}]
    cluster.patch_status("TrainingJob", "ml", "m1", {"phase": "Running", "placement": placement, "eviction": eviction})
    if holder == "done":
        cluster.annotate("TrainingJob", "ml", "m1", {"tidal.dev/checkpoint-done": requested})
    gang = cluster.add("TrainingJob", "ml", "gang", _one_pod(4, groups=2))
    m2 = cluster.add("TrainingJob", "ml", "m2", _one_pod(2))
    room = ReturnRoom((GroupAssignment(0, "hgx8-0000", (n0,)),), Counter({n0: 2}))
    held = {n1} if holder == "not on the gang's nodes" else {n0, n1}
    holds = {} if holder == "the gang holds nothing" else {gang.uid: Hold(1, frozenset(held))}
    nodes = {n: SimpleNamespace(ready=not (holder == "the room's node failed" and n == n0)) for n in (n0, n1)}
    cyc = SimpleNamespace(
        state=cluster.state(),
        writer=controller.writer,
        return_rooms={m2.uid: room},
        now=clock.now(),
        snapshot=SimpleNamespace(nodes=nodes),
        held_before=holds,
        scratch={},
    )
    mover = {"by": "ml/gang (defragmentation: 2 group(s) of 4 GPUs blocked by scattered free GPUs)"}
    assert training._way_back_held_by(cyc, m2, mover) == (["ml/m1"] if waited_for else []), holder


def test_a_room_keeps_its_movers_quota_share_from_a_job_queued_before_it():
    """Namespace ml's quota is 140 GPUs: the four small jobs (64) and the gang (72) fit. A job of
    the same priority arrives while the mover checkpoints and waits on the quota. When the mover
    leaves (and another namespace's job ends, so the queue is tried again), that job is queued
    before it and would take the 16 GPUs of quota the mover frees: the mover could not take its
    room and would wait on the quota in turn. The room keeps the mover's share, as a hold does:
    the late job waits, the mover goes back."""
    cluster, controller, _ = scattered()
    cluster.add("TrainingJob", "x", "other", spec(4, 1))
    run(cluster, controller)
    cluster.add_quota("ml", "gpus", {"requests.nvidia.com/gpu": "140"})
    mover, room, _ = _move_for_whole_rack(cluster, controller)
    cluster.add("TrainingJob", "ml", "late", spec(4, 4, priority=1))
    run(cluster, controller, cycles=2)
    late = cluster.status("TrainingJob", "ml", "late")
    assert late["phase"] == "Pending" and late["reason"].startswith("ResourceQuota ml/gpus"), late
    # The quota's status.used as the API server reports it: it still counts the mover's pods,
    # which terminate after this cycle's decisions (the room's share must not count twice).
    cluster.quotas[("ml", "gpus")] = quota_view(
        {
            "metadata": {"namespace": "ml", "name": "gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "140"}},
            "status": {"used": {"requests.nvidia.com/gpu": "64"}},
        }
    )
    _checkpoint_done(cluster, mover)
    del cluster.objects[("TrainingJob", "x", "other")]
    for key in [k for k, p in cluster.pods.items() if p["metadata"]["labels"].get("tidal.dev/job") == "other"]:
        del cluster.pods[key]
    run(cluster, controller, cycles=4)
    moved = cluster.status("TrainingJob", "ml", mover)
    assert moved["phase"] == "Running" and moved["placement"] == room, moved
    assert cluster.status("TrainingJob", "ml", "whole-rack")["phase"] == "Running"
    late = cluster.status("TrainingJob", "ml", "late")
    assert late["phase"] == "Pending" and late["reason"].startswith("ResourceQuota ml/gpus"), late
    check_sound(cluster)
