"""The compact TrainingJob placement (status.assignment): round trip, old-format objects, size."""

import dataclasses
import datetime as dt
import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.clock import FixedClock
from tidal.k8s.compact import decode, encode, expand_hostlist, fits, from_wire, hostlist, to_wire
from tidal.k8s.controller import Controller
from tidal.model import TrainingJobStatus
from tidal.model.training_job import ASSIGNMENT_GROUPS_MAX, ASSIGNMENT_NODES_MAX

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

ETCD_LIMIT = 1536 * 1024


def nvl72_placement(gpus: int, gpus_per_pod: int, group_gpus: int = 64) -> list[dict]:
    """Groups packed rack by rack (18 nodes of 4 GPUs), pods in rank order, as the planner does."""
    pods_per_node = 4 // gpus_per_pod
    placement, node = [], 0
    for g in range(gpus // group_gpus):
        pods = group_gpus // gpus_per_pod
        if (node % 18) * 4 + group_gpus > 72:  # the group would cross the rack: next rack
            node = (node // 18 + 1) * 18
        nodes = [
            f"nvl72-{(node + i // pods_per_node) // 18:04d}-n{(node + i // pods_per_node) % 18:02d}"
            for i in range(pods)
        ]
        node += group_gpus // 4
        placement.append({"group": g, "supernode": nodes[0][:10], "nodes": nodes})
    return placement


def test_round_trip_of_packed_and_scattered_placements():
    for gpp in (1, 2, 4):
        placement = nvl72_placement(16_384, gpp)
        assert decode(encode(placement)) == placement
    rng = random.Random(3)
    names = [f"node-{i}" for i in range(50)] + ["gpu-a", "x0y", "n007", "n7", "n08"]
    scattered = [
        {"group": g, "supernode": f"sn-{g % 3}", "nodes": [rng.choice(names) for _ in range(4)]} for g in range(40)
    ]
    assert decode(encode(scattered)) == scattered


@settings(max_examples=100, deadline=None)
@given(st.lists(st.from_regex(r"[a-z]{1,3}(-?[0-9]{1,3})?", fullmatch=True), max_size=30))
def test_hostlist_expands_to_the_same_names_in_the_same_order(names):
    assert expand_hostlist(hostlist(names)) == names


def test_a_16k_gpu_job_is_small_now():
    for gpp in (4, 1):
        placement = nvl72_placement(16_384, gpp)
        old = len(json.dumps(placement))
        new = len(json.dumps(encode(placement)))
        assert new < old / 5 and new < 16 * 1024, (gpp, old, new)  # 11 KiB for both (was 85 / 301 KiB)


def test_the_largest_status_the_schema_allows_fits_well_under_etcds_limit():
    """Both assignment strings at their maxLength, plus everything else a status holds at its
    largest in practice (ten eviction records, every condition with a long message)."""
    message = "m" * 1024
    status = {
        "phase": "Running",
        "reason": message,
        "worldSize": 100_000,
        "currentDP": 100_000,
        "assignment": {"nodes": "n" * ASSIGNMENT_NODES_MAX, "groups": "g" * ASSIGNMENT_GROUPS_MAX},
        "supernodes": 1_400,
        "restarts": 1000,
        "admittedAt": "2026-05-01T00:00:00Z",
        "pendingSince": "2026-05-01T00:00:00Z",
        "eviction": {"reason": "Preempted", "by": message, "requestedAt": "x", "deadline": "y", "replicas": [1] * 100},
        "evictionHistory": [{"at": "2026-05-01T00:00:00Z", "gpus": 100_000, "reason": "Rebalanced"}] * 10,
        "conditions": [
            {"type": t, "status": "True", "reason": "R", "message": message, "lastTransitionTime": "x"}
            for t in ("Admitted", "Schedulable", "Running", "Preempted", "CheckpointRequested", "Failed")
        ],
    }
    TrainingJobStatus.model_validate(status)
    size = len(json.dumps({"status": status}))
    assert size < 0.75 * ETCD_LIMIT, size
    too_long = {**status, "assignment": {"nodes": "n" * (ASSIGNMENT_NODES_MAX + 1), "groups": ""}}
    try:
        TrainingJobStatus.model_validate(too_long)
    except ValueError:
        pass
    else:
        raise AssertionError("the schema must refuse a longer node table")


def test_a_whole_cluster_gang_at_one_gpu_per_pod_fits_the_bounds():
    placement = nvl72_placement(100_000 // 64 * 64, 1)
    assert fits(encode(placement))


def test_an_old_format_status_is_read_and_migrated_on_the_next_write():
    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", {"tp": 4, "ep": 4, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    run(cluster, controller, cycles=3)
    held = cluster.status("TrainingJob", "ml", "job")
    assert held["phase"] == "Running"

    # The object as an operator before `assignment` wrote it, read by a fresh operator.
    old = {k: v for k, v in held.items()}
    view = cluster.get("TrainingJob", "ml", "job")
    cluster.objects[("TrainingJob", "ml", "job")] = dataclasses.replace(view, status=old)
    assert "assignment" not in old and isinstance(old["placement"], list)
    fresh = Controller(cluster, FixedClock(dt.datetime(2026, 5, 1, tzinfo=dt.UTC)))
    cluster.calls.clear()
    run(cluster, fresh, cycles=2)
    assert not [c for c in cluster.calls if c[0] in ("create_pod", "delete_pod")], "kept running as it was"
    assert fresh.keeper.snapshot.allocated_gpus() == 32, "its GPUs booked from the old form"

    # Any status write moves it to the compact form (the old list removed in the same patch).
    node = old["placement"][0]["nodes"][0]
    cluster.nodes[node] = dataclasses.replace(cluster.nodes[node], ready=False)
    run(cluster, fresh, cycles=3)
    raw = cluster.get("TrainingJob", "ml", "job").status
    assert "placement" not in raw and "assignment" in raw
    assert from_wire(raw)["placement"] != old["placement"] and len(from_wire(raw)["placement"]) == 2
    assert to_wire(from_wire(raw)) == raw
