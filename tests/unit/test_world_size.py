"""After an elastic resize every surviving pod learns the new world size: its WORLD_SIZE env keeps
the size it started with (env cannot change), so tidal keeps the pod's annotations current and
every container reads them as files from a downward API volume."""

from __future__ import annotations

import datetime as dt

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.k8s.manifests import WORLD_MOUNT, WORLD_VOLUME

from ..evictions import rebalanced_past_grace
from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
ELASTIC = {
    "tp": 4, "ep": 1, "pp": 1, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE,
    "preemptible": True, "elastic": {"minDP": 1, "maxDP": 2},
}  # fmt: skip


def _world(pod: dict) -> tuple[str, str]:
    notes = pod["metadata"].get("annotations") or {}
    return notes.get("tidal.dev/world-size", ""), notes.get("tidal.dev/dp", "")


def test_pods_start_with_the_world_files_and_survivors_of_a_shrink_learn_the_new_size():
    cluster = FakeCluster("nvl72", 2)
    cluster.add("TrainingJob", "ml", "job", ELASTIC)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    pods = cluster.pods_of("tidal.dev/job", "job")
    assert len(pods) == 2 and all(_world(p) == ("8", "2") for p in pods)
    for pod in pods:
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == WORLD_VOLUME)
        paths = {i["path"]: i["fieldRef"]["fieldPath"] for i in volume["downwardAPI"]["items"]}
        assert paths == {
            "world-size": "metadata.annotations['tidal.dev/world-size']",
            "dp": "metadata.annotations['tidal.dev/dp']",
            "generation": "metadata.annotations['tidal.dev/world-generation']",
            "leaving": "metadata.annotations['tidal.dev/world-leaving']",
            "joining": "metadata.annotations['tidal.dev/world-joining']",
            "checkpoint-requested": "metadata.annotations['tidal.dev/checkpoint-requested']",
            "checkpoint-cancelled": "metadata.annotations['tidal.dev/checkpoint-cancelled']",
        }
        for container in pod["spec"]["containers"]:
            assert {"name": WORLD_VOLUME, "mountPath": WORLD_MOUNT, "readOnly": True} in container["volumeMounts"]
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["WORLD_SIZE"] == "8"

    eviction = rebalanced_past_grace([1])
    cluster.patch_status("TrainingJob", "ml", "job", {"eviction": eviction})
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "ml", "job")["worldSize"] == 4
    survivors = [p for p in cluster.pods_of("tidal.dev/job", "job") if not p["metadata"].get("deletionTimestamp")]
    assert [p["metadata"]["name"] for p in survivors] == ["job-0"]
    assert _world(survivors[0]) == ("4", "1"), "the surviving pod still announces the old world size"
