"""spec.elastic.resize: Live (issue 35): a shrink asks for no checkpoint, announces a membership
generation, and deletes the leaving pods once every survivor acknowledges it; without every
acknowledgement in time it falls back to checkpoint-first. A suspension stays checkpoint-first."""

from __future__ import annotations

import dataclasses

from tidal.clock import FixedClock
from tidal.k8s import labels
from tidal.k8s.admission import running_gangs
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.rebalancing import RebalanceSettings

from .fake_cluster import FakeCluster
from .test_rebalance import at, check_sound, day_cluster, run


def live_day(timeout: int = 120) -> tuple[FakeCluster, FixedClock, Controller]:
    """The day cluster with a Live trainer, at 08:00: the day pool's window takes one DP replica."""
    cluster = day_cluster()
    job = cluster.get("TrainingJob", "ml", "pretrain")
    elastic = {**job.spec["elastic"], "resize": "Live", "liveTimeoutSeconds": timeout}
    cluster.objects[("TrainingJob", "ml", "pretrain")] = dataclasses.replace(job, spec={**job.spec, "elastic": elastic})
    clock = FixedClock(at("06:00"))
    controller = Controller(cluster, clock, ControllerSettings(rebalance=RebalanceSettings()))
    run(cluster, controller)
    clock.at = at("08:00")
    cluster.calls.clear()
    run(cluster, controller)
    return cluster, clock, controller


def pods(cluster: FakeCluster) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in cluster.pods_of("tidal.dev/job", "pretrain")}


def notes(pod: dict) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def ack(cluster: FakeCluster, generation: int, but: tuple[str, ...] = ()) -> None:
    """What tidal.workload does on each surviving pod once its trainer has rebuilt."""
    for name, pod in pods(cluster).items():
        if notes(pod).get(labels.WORLD_LEAVING) is not None and name not in but:
            cluster.annotate_pod("ml", name, {labels.WORLD_ACK: str(generation)})


def status(cluster: FakeCluster) -> dict:
    return cluster.status("TrainingJob", "ml", "pretrain")


def test_a_live_shrink_announces_a_generation_and_deletes_the_leavers_once_every_survivor_acknowledges():
    cluster, _clock, controller = live_day()
    eviction = status(cluster).get("eviction") or {}
    assert eviction.get("mode") == "Live" and eviction.get("generation") == 1 and eviction.get("replicas") == [3]
    assert not any(labels.CHECKPOINT_REQUESTED in notes(p) for p in pods(cluster).values()), "no checkpoint asked"
    assert labels.CHECKPOINT_REQUESTED not in cluster.get("TrainingJob", "ml", "pretrain").annotations
    for name, pod in pods(cluster).items():
        assert notes(pod).get(labels.WORLD_GENERATION) == "1" and notes(pod).get(labels.WORLD_LEAVING) == "3", name
        assert notes(pod).get(labels.WORLD_SIZE) == "192" and notes(pod).get(labels.CURRENT_DP) == "3", name
    assert len(pods(cluster)) == 64, "nothing deleted before the survivors acknowledge"

    ack(cluster, 1, but=("pretrain-0",))  # one survivor still rebuilding
    run(cluster, controller)
    assert len(pods(cluster)) == 64, "every survivor must acknowledge"
    ack(cluster, 1)
    cluster.calls.clear()
    run(cluster, controller)
    deleted = sorted(d for v, d in cluster.calls if v == "delete_pod")
    assert deleted == sorted(f"pretrain-{i}" for i in range(48, 64)), "only DP replica 3 goes"
    st = status(cluster)
    assert st["currentDP"] == 3 and "eviction" not in st and st["worldGeneration"] == 1
    assert st["evictionHistory"][-1]["gpus"] == 64, "the budget counts a live shrink like any other"
    live = next(c for c in st["conditions"] if c["type"] == "LiveResize")
    assert live["status"] == "False" and live["reason"] == "Done"
    events = [d for v, d in cluster.calls if v == "event"]
    assert any(reason == "Shrunk" and "live" in message for _, reason, message in events)
    check_sound(cluster)


def test_a_live_shrink_nobody_acknowledges_falls_back_to_checkpoint_first_after_the_timeout():
    cluster, clock, controller = live_day(timeout=120)
    ack(cluster, 1, but=("pretrain-5",))
    clock.advance(seconds=119)
    run(cluster, controller)
    assert status(cluster)["eviction"]["mode"] == "Live" and len(pods(cluster)) == 64
    clock.advance(seconds=2)
    cluster.calls.clear()
    run(cluster, controller)
    events = [d for v, d in cluster.calls if v == "event"]
    timed_out = [m for _, reason, m in events if reason == "LiveResizeTimedOut"]
    assert timed_out and "pretrain-5" in timed_out[0], events
    eviction = status(cluster)["eviction"]
    assert eviction.get("mode", "Restart") == "Restart" and eviction["replicas"] == [3]
    assert all(notes(p).get(labels.CHECKPOINT_REQUESTED) == eviction["requestedAt"] for p in pods(cluster).values())
    assert len(pods(cluster)) == 64, "checkpoint first, as for a Restart job"
    cluster.annotate("TrainingJob", "ml", "pretrain", {labels.CHECKPOINT_DONE: eviction["requestedAt"]})
    run(cluster, controller)
    assert status(cluster)["currentDP"] == 3 and len(pods(cluster)) == 48
    check_sound(cluster)


def live_night() -> tuple[FakeCluster, Controller]:
    """The day cluster with a Live trainer at 06:00: running whole, nothing asked of it."""
    cluster = day_cluster()
    job = cluster.get("TrainingJob", "ml", "pretrain")
    elastic = {**job.spec["elastic"], "resize": "Live"}
    cluster.objects[("TrainingJob", "ml", "pretrain")] = dataclasses.replace(job, spec={**job.spec, "elastic": elastic})
    controller = Controller(cluster, FixedClock(at("06:00")), ControllerSettings(rebalance=RebalanceSettings()))
    run(cluster, controller)
    return cluster, controller


def test_a_live_job_is_suspended_checkpoint_first():
    cluster, controller = live_night()
    view = cluster.get("TrainingJob", "ml", "pretrain")
    cluster.objects[("TrainingJob", "ml", "pretrain")] = dataclasses.replace(view, spec={**view.spec, "suspend": True})
    run(cluster, controller)
    eviction = status(cluster).get("eviction") or {}
    assert eviction.get("replicas") == [] and eviction.get("mode", "Restart") == "Restart", eviction
    assert all(notes(p).get(labels.CHECKPOINT_REQUESTED) == eviction["requestedAt"] for p in pods(cluster).values())
    assert len(pods(cluster)) == 64


def test_the_planner_weighs_a_live_job_as_live():
    cluster, controller = live_night()
    view = cluster.get("TrainingJob", "ml", "pretrain")
    gangs = running_gangs(controller_cycle(cluster, controller), {view.uid: (view, status(cluster))})
    assert [g.resize for g in gangs] == ["Live"]


def controller_cycle(cluster: FakeCluster, controller: Controller):
    """A cycle context over the cluster as it is (for running_gangs)."""
    controller._last_start = 0.0
    report = controller.cycle(cluster.state())
    return report.cycle


def test_a_fallen_back_live_shrink_is_carried_out_though_its_pool_no_longer_wants_the_room():
    # Review: the survivors that answered have rebuilt without replica 3, whose trainer has taken
    # the announcement; calling the eviction off would leave replica 3 booked and out of the world.
    cluster, clock, controller = live_day(timeout=120)
    ack(cluster, 1, but=("pretrain-5",))
    clock.advance(seconds=121)
    run(cluster, controller)
    eviction = status(cluster).get("eviction") or {}
    assert eviction.get("mode", "Restart") == "Restart" and eviction.get("generation") == 1, eviction
    del cluster.objects[("InferencePool", "serve", "chat")]  # the room is no longer wanted
    cluster.calls.clear()
    run(cluster, controller)
    assert not [d for v, d in cluster.calls if v == "event" and d[1] == "EvictionCancelled"]
    cluster.annotate("TrainingJob", "ml", "pretrain", {labels.CHECKPOINT_DONE: eviction["requestedAt"]})
    run(cluster, controller)
    assert status(cluster)["currentDP"] == 3 and len(pods(cluster)) == 48, "carried out, not called off"


def test_a_live_grow_back_is_a_new_generation_whose_new_replicas_know_they_join():
    cluster, clock, controller = live_day()
    ack(cluster, 1)
    run(cluster, controller)
    assert status(cluster)["currentDP"] == 3
    clock.at = at("23:05")  # the day pool is gone for the night: training grows back
    run(cluster, controller, cycles=4)
    st = status(cluster)
    assert st["currentDP"] == 4 and st["worldGeneration"] == 2 and st["worldJoining"] == [3]
    for name, pod in pods(cluster).items():
        shown = notes(pod)
        assert shown.get(labels.WORLD_GENERATION) == "2" and shown.get(labels.WORLD_JOINING) == "3", name
        assert shown.get(labels.WORLD_LEAVING) == "" and shown.get(labels.WORLD_SIZE) == "256", name
    assert len(pods(cluster)) == 64
    check_sound(cluster)


def test_a_finished_live_shrinks_generation_is_the_jobs_though_the_status_lost_it():
    """A status that no longer holds worldGeneration (restored from an older write, or an eviction
    recorded without it) still ends the shrink at its generation, so the grow-back after it is a
    higher one that trainers which acknowledged the shrink take on."""
    cluster, clock, controller = live_day()
    st = status(cluster)
    cluster.patch_status("TrainingJob", "ml", "pretrain", {**st, "worldGeneration": None})
    ack(cluster, 1)
    run(cluster, controller)
    assert status(cluster)["currentDP"] == 3 and status(cluster).get("worldGeneration") == 1
    clock.at = at("23:05")
    run(cluster, controller, cycles=4)
    assert status(cluster)["worldGeneration"] == 2 and status(cluster)["currentDP"] == 4


def test_a_job_that_holds_nothing_has_nobody_joining_but_keeps_its_generation():
    """After a suspension or preemption the next start loads the checkpoint on every pod: no
    replica is told to fetch the state from peers that have none, and the generation only grows."""
    from tidal.k8s.training import _cleared

    cleared = _cleared({"phase": "Running", "currentDP": 4, "worldGeneration": 2, "worldJoining": [3]})
    assert "worldJoining" not in cleared and cleared["worldGeneration"] == 2


def test_a_new_generation_is_above_every_one_a_pod_shows_or_acknowledged():
    """Generations never repeat: a pod that acknowledged 5 (a status restored from an older write
    says 1) would take a second generation 2 as acknowledged, and the leaving pods would go before
    any survivor rebuilt."""
    cluster, clock, controller = live_day()
    ack(cluster, 1)
    run(cluster, controller)
    name = sorted(pods(cluster))[0]
    cluster.annotate_pod("ml", name, {labels.WORLD_ACK: "5"})
    clock.at = at("23:05")
    run(cluster, controller, cycles=4)
    assert status(cluster)["worldGeneration"] == 6 and status(cluster)["currentDP"] == 4
