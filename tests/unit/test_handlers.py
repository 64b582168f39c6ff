"""The kopf wiring (k8s/handlers.py), driven in process in kopf's order (tests/unit/kopf_sim.py):
no listing or event is lost when the cycle it was queued for does not run or when it races an
index function; ticks of many objects start one cycle; a failing cycle is logged as an error, the
next one starts from a full listing, and /healthz fails while none finishes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import types
from typing import Any

import kopf
import pytest
import structlog
from kubernetes import client

from tidal.clock import FixedClock
from tidal.k8s import handlers
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.informer import NODES, PODS, Informer, Informers
from tidal.k8s.state import NodeView, ResourceView, resource_view
from tidal.k8s.supernodes import Discovery

from .fake_cluster import FakeCluster
from .kopf_sim import MiniKopf

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def node_body(view: NodeView) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": view.name, "uid": f"node-{view.name}", "labels": dict(view.labels)},
        "spec": {"unschedulable": view.unschedulable},
        "status": {
            "allocatable": {k: str(v) for k, v in view.capacity.items()},
            "conditions": [{"type": "Ready", "status": "True" if view.ready else "False"}],
        },
    }


def object_body(view: ResourceView) -> dict[str, Any]:
    meta = {"name": view.name, "uid": view.uid, "generation": view.generation, "creationTimestamp": view.created}
    if view.namespace:
        meta["namespace"] = view.namespace
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": view.kind,
        "metadata": {**meta, "resourceVersion": view.resource_version},
        "spec": view.spec,
        "status": view.status,
    }


def setup(
    supernodes: int, discover_label: str | None = None, **settings: Any
) -> tuple[FakeCluster, Controller, MiniKopf, list[dict[str, Any]]]:
    cluster = FakeCluster("nvl72", supernodes)
    controller = Controller(cluster, FixedClock(NOW), ControllerSettings(**{"min_cycle_seconds": 0.0, **settings}))
    discovery = Discovery(cluster, discover_label) if discover_label else None  # type: ignore[arg-type]
    informers = Informers(
        pods=Informer(client.ApiClient(), controller.cache, active=controller.ticking, watched=PODS),
        nodes=Informer(
            client.ApiClient(),
            controller.cache,
            active=controller.ticking,
            watched=NODES,
            on_object=discovery.node if discovery else None,
        ),
    )
    # The first listings (none): pods and nodes come through `handle` (`list_nodes`, watch events).
    informers.pods.synced.set()
    informers.nodes.synced.set()
    sim = MiniKopf(controller=controller, informers=informers, discovery=discovery)
    bodies = [object_body(v) for (kind, _, _), v in sorted(cluster.objects.items()) if kind == "Supernode"]
    return cluster, controller, sim, bodies


async def list_nodes(cluster: FakeCluster, sim: MiniKopf) -> None:
    """The nodes as the node informer's watch brings them (it queues only once timers run: the
    first tick's copy of its table has them)."""
    for view in cluster.nodes.values():
        node_event(sim, node_body(view))


def node_event(sim: MiniKopf, body: dict[str, Any], type: str = "ADDED") -> None:
    sim.base.informers.nodes.handle({"type": type, "object": body})


def gpus_total(cluster: FakeCluster, name: str) -> int | None:
    return cluster.status("Supernode", None, name).get("gpus", {}).get("total")


@contextlib.contextmanager
def scrape_takes_the_lock_first(controller: Controller):
    """The worker thread reaches the cycle while a /metrics scrape holds the controller's lock."""
    cycle = controller.cycle

    def skipped(*args: Any, **kwargs: Any) -> Any:
        with controller.lock:
            return cycle(*args, **kwargs)

    controller.cycle = skipped  # type: ignore[method-assign]
    try:
        yield
    finally:
        del controller.cycle


def test_a_listing_whose_cycle_was_skipped_is_applied_by_the_next_cycle():
    """The cluster-test failure (no Supernode ever got a status): the first tick copied the indices
    and dropped the queued events for a cycle that then found the lock taken; nothing queued that
    listing again, so the cache stayed empty and every later cycle idled over it."""
    cluster, controller, sim, (first, second) = setup(2)

    async def scenario() -> None:
        await list_nodes(cluster, sim)
        await sim.event("supernodes", first)
        with scrape_takes_the_lock_first(controller):
            await sim.tick("supernodes", first)
        assert controller.cycles == 0 and gpus_total(cluster, "nvl72-0000") is None

        await sim.tick("supernodes", first)
        assert controller.cycles == 1
        assert gpus_total(cluster, "nvl72-0000") == 72, "the listing waited for the next cycle"

        await sim.event("supernodes", second)  # discovered later: a watch event, no listing
        await sim.tick("supernodes", first)
        assert gpus_total(cluster, "nvl72-0001") == 72

    asyncio.run(scenario())


def test_an_event_indexed_while_the_indices_are_copied_is_not_lost():
    """kopf runs an index function, and only then stores its result: a copy of the indices made in
    between lacks the object, so the event must reach the cache after the store, not before."""
    cluster, controller, sim, (first, second, third) = setup(3)
    controller.settings.resync_seconds = 0.0  # every cycle starts from a copy of the indices

    async def scenario() -> None:
        await list_nodes(cluster, sim)
        await sim.event("supernodes", first)
        await sim.tick("supernodes", first)
        assert gpus_total(cluster, "nvl72-0000") == 72

        store = await sim.index("supernodes", second)  # the index function ran; kopf has not stored it yet
        await sim.event("supernodes", third)
        await sim.tick("supernodes", third)  # copies the indices: the second supernode is not in them
        store()
        await sim.handle("supernodes", second)
        await sim.tick("supernodes", third)
        assert set(controller.cache.supernodes) == {"nvl72-0000", "nvl72-0001", "nvl72-0002"}
        assert gpus_total(cluster, "nvl72-0001") == 72

        await sim.event("supernodes", second, type="DELETED")
        await sim.tick("supernodes", third)
        assert set(controller.cache.supernodes) == {"nvl72-0000", "nvl72-0002"}

    asyncio.run(scenario())


def test_ticks_of_many_objects_in_one_instant_start_one_cycle():
    cluster, controller, sim, bodies = setup(4, min_cycle_seconds=60.0)

    async def scenario() -> None:
        await list_nodes(cluster, sim)
        for body in bodies:
            await sim.event("supernodes", body)
        await asyncio.gather(*(sim.tick("supernodes", body) for body in bodies))

    asyncio.run(scenario())
    assert controller.cycles == 1
    assert all(gpus_total(cluster, f"nvl72-000{i}") == 72 for i in range(4))


def test_a_failing_cycle_is_an_error_restarts_from_a_listing_and_fails_healthz():
    cluster, controller, sim, (first,) = setup(1, max_cycle_age_seconds=0.0)

    async def scenario(logs: list[dict[str, Any]]) -> None:
        await list_nodes(cluster, sim)
        await sim.event("supernodes", first)
        await sim.tick("supernodes", first)
        assert gpus_total(cluster, "nvl72-0000") == 72
        cycles = controller.cycles

        # A bad event makes the drain fail halfway: what was queued with it is lost to the cache.
        node = next(iter(cluster.nodes.values()))
        controller.cache.feed("no-such-kind", "x", None)
        node_event(sim, node_body(dataclasses.replace(node, ready=False)), "MODIFIED")
        await sim.tick("supernodes", first)
        assert controller.cycles == cycles and controller.failures == 1
        assert any(e["event"] == "cycle failed" and e["log_level"] == "error" for e in logs)
        with pytest.raises(kopf.PermanentError):
            handlers.cycle_age(memo=sim.memos[first["metadata"]["uid"]])
        assert controller.stuck_report() is not None

        await sim.tick("supernodes", first)  # restarts from a full copy of the indices
        assert controller.cycles == cycles + 1 and controller.failures == 0
        assert not controller.cache.nodes[node.name].ready, "the lost event came back with the listing"
        assert cluster.status("Supernode", None, "nvl72-0000")["readyNodes"] == 17
        handlers.cycle_age(memo=sim.memos[first["metadata"]["uid"]])

    with structlog.testing.capture_logs() as logs:
        asyncio.run(scenario(logs))


def test_a_failing_listener_neither_fails_the_cycle_nor_escapes_it():
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))

    def broken(*_: Any) -> None:
        raise RuntimeError("metrics bug")

    controller.listeners.append(broken)
    with structlog.testing.capture_logs() as logs:
        assert controller.cycle(cluster.state()) is not None
    assert controller.cycles == 1 and controller.failures == 0
    assert any(e["event"] == "cycle listener failed" and e["log_level"] == "error" for e in logs)


def test_the_first_tick_after_a_start_is_logged_once():
    """A warm-up's "timers running" moment (bench.operator reads it from the log)."""
    cluster, _, sim, (first,) = setup(1)

    async def scenario() -> None:
        await list_nodes(cluster, sim)
        await sim.event("supernodes", first)
        for _ in range(3):
            await sim.tick("supernodes", first)

    with structlog.testing.capture_logs() as logs:
        asyncio.run(scenario())
    assert [e["event"] for e in logs].count("first tick: timers running") == 1


@pytest.mark.parametrize("kind", ["pods", "nodes"])
def test_no_cycle_runs_before_the_first_listing_of_pods_and_of_nodes(kind: str):
    """A cycle before it would see half a cluster: without pods every GPU free and every gang's
    pods missing; without nodes every placement lost (k8s/informer.py)."""
    cluster, controller, sim, (first,) = setup(1)
    informer = getattr(sim.base.informers, kind)
    informer.synced.clear()

    async def scenario() -> None:
        await list_nodes(cluster, sim)
        await sim.event("supernodes", first)
        await sim.tick("supernodes", first)
        assert controller.cycles == 0 and not controller.last_tick
        informer.synced.set()
        await sim.tick("supernodes", first)
        assert controller.cycles == 1

    asyncio.run(scenario())


async def running(cluster: FakeCluster, sim: MiniKopf, *supernodes: dict[str, Any]) -> None:
    """Nodes and supernodes listed, the first cycle run."""
    await list_nodes(cluster, sim)
    for body in supernodes:
        await sim.event("supernodes", body)
    await sim.tick("supernodes", supernodes[0])


async def audit(controller: Controller, sim: MiniKopf, body: dict[str, Any]) -> None:
    """An index audit now (if some kind was listed again), and the cycle that applies what it found."""
    controller._next_audit = 0.0
    await sim.tick("supernodes", body)
    await asyncio.gather(*handlers._audits)
    await sim.tick("supernodes", body)


def test_a_supernode_deleted_while_the_watch_was_down_is_dropped_and_stays_dropped():
    """kopf lists again after a 410 Gone or a peering pause and keeps in its index what the new
    list lacks: the audit's LIST finds it gone, the cache forgets it (though the cache holds an
    older, equal view of it than the index), it is reported once, the next copy of the indices
    (which still hold it) does not bring it back, and a new Supernode of that name does come back."""
    cluster, controller, sim, (first, second) = setup(2)

    async def scenario() -> None:
        await running(cluster, sim, first, second)
        await sim.event("supernodes", second, type="MODIFIED")  # a watch event, not a re-list
        await sim.tick("supernodes", first)
        del cluster.objects[("Supernode", None, "nvl72-0001")]  # deleted while the watch was down
        controller._next_audit = float("inf")
        await sim.event("supernodes", first)  # kopf's list after the 410: the other again, as type None
        assert controller.relisted == {"supernode"}

        controller._next_resync = 0.0  # a copy of the indices: they still hold it
        await sim.tick("supernodes", first)
        assert "nvl72-0001" in controller.cache.supernodes

        with structlog.testing.capture_logs() as logs:
            await audit(controller, sim, first)
        assert "nvl72-0001" not in controller.cache.supernodes
        assert [e["objects"] for e in logs if e["event"].startswith("objects deleted")] == [["supernode nvl72-0001"]]

        controller._next_resync = 0.0
        await sim.tick("supernodes", first)
        assert "nvl72-0001" not in controller.cache.supernodes, "the copy of the indices did not bring it back"
        await sim.event("supernodes", first)  # another re-list, another audit: nothing new to report
        with structlog.testing.capture_logs() as logs:
            await audit(controller, sim, first)
        assert not [e for e in logs if e["event"].startswith("objects deleted")]

        again = {**second, "metadata": {**second["metadata"], "uid": "sn-new"}}  # made again: a new object
        cluster.objects[("Supernode", None, "nvl72-0001")] = resource_view(again)
        await sim.event("supernodes", again)
        controller._next_resync = 0.0
        await sim.tick("supernodes", first)
        assert "nvl72-0001" in controller.cache.supernodes

    asyncio.run(scenario())


def test_a_node_deleted_while_the_node_watch_was_down_is_gone_with_the_next_listing():
    """The node informer's LIST replaces its table (no audit needed): a node that went while no
    watch ran leaves the cache with the listing, and stays out of the next full copy."""
    cluster, controller, sim, (first,) = setup(1)

    async def scenario() -> None:
        await running(cluster, sim, first)
        assert gpus_total(cluster, "nvl72-0000") == 72
        gone = sorted(cluster.nodes)[0]
        cluster.nodes.pop(gone)  # deleted while the watch was down: no DELETED event, ever
        nodes = sim.base.informers.nodes
        nodes.core = ListingCore([node_body(v) for v in cluster.nodes.values()])  # type: ignore[assignment]
        nodes.list()
        await sim.tick("supernodes", first)
        assert gone not in controller.cache.nodes and gpus_total(cluster, "nvl72-0000") == 68
        controller._next_resync = 0.0
        await sim.tick("supernodes", first)
        assert gone not in controller.cache.nodes and gpus_total(cluster, "nvl72-0000") == 68

    asyncio.run(scenario())


class ListingCore:
    """`list_node` answering one LIST page of these nodes."""

    def __init__(self, bodies: list[dict[str, Any]]):
        self.data = json.dumps({"metadata": {"resourceVersion": "99"}, "items": bodies}).encode()

    def list_node(self, **_: Any) -> Any:
        return types.SimpleNamespace(data=self.data)


def test_an_audit_lists_only_after_a_re_list_and_survives_a_failed_list():
    cluster, controller, sim, (first, second) = setup(2)

    async def scenario() -> None:
        await running(cluster, sim, first, second)
        nodes = set(controller.cache.nodes)
        await sim.event("supernodes", second, type="MODIFIED")  # a watch event, no re-list
        await audit(controller, sim, first)
        assert not [c for c in cluster.calls if c[0] == "list_keys"], "nothing was listed again: no LIST"

        def refused(kind: str) -> set[Any]:
            raise RuntimeError("503")

        cluster.list_keys = refused  # type: ignore[method-assign]
        await sim.event("supernodes", second)  # kopf listed Supernodes again (type None)
        await audit(controller, sim, first)
        assert set(controller.cache.nodes) == nodes and controller.relisted == {"supernode"}, "tried again later"

        del cluster.list_keys
        await audit(controller, sim, first)
        assert set(controller.cache.nodes) == nodes and set(controller.cache.supernodes) == {"nvl72-0000", "nvl72-0001"}
        listed = [c for c in cluster.calls if c[0] == "list_keys"]
        assert listed == [("list_keys", "supernode")], "only the kind re-listed"
        assert not controller.relisted

    asyncio.run(scenario())


def test_a_supernode_deleted_while_its_watch_was_down_is_discovered_again():
    """kopf's index keeps the deleted Supernode and no event tells discovery; the audit's LIST
    does, so a node that still bears its label creates it again."""
    cluster, controller, sim, (first, second) = setup(2, discover_label="tidal.dev/supernode")
    discovery = sim.base.discovery

    async def scenario() -> None:
        await running(cluster, sim, first, second)
        discovery.work()
        member = next(
            n for n in sorted(cluster.nodes) if cluster.nodes[n].labels["tidal.dev/supernode"] == "nvl72-0000"
        )

        def creates() -> list[Any]:
            return [c for c in cluster.calls if c[0] == "create_supernode"]

        assert creates() == [], "the seeding LIST of Supernodes knew both"
        node_event(sim, node_body(cluster.nodes[member]), "MODIFIED")
        discovery.work()
        assert creates() == [], "it exists: nothing to create"

        del cluster.objects[("Supernode", None, "nvl72-0000")]  # deleted while the watch was down
        controller._next_audit = float("inf")
        await sim.event("supernodes", second)  # kopf's list after the 410 lacks it
        node_event(sim, node_body(cluster.nodes[member]), "MODIFIED")
        discovery.work()
        assert creates() == [], "nothing said it was deleted yet"
        await audit(controller, sim, second)
        assert "nvl72-0000" not in controller.cache.supernodes

        node_event(sim, node_body(cluster.nodes[member]), "MODIFIED")
        discovery.work()
        assert creates() == [("create_supernode", "nvl72-0000")]

    asyncio.run(scenario())


def test_kopfs_deleted_event_of_a_supernode_makes_the_next_node_event_create_it_again():
    """Even a node event that changes nothing the cache reads (a heartbeat) reaches discovery."""
    cluster, _, sim, (first, second) = setup(2, discover_label="tidal.dev/supernode")
    discovery = sim.base.discovery

    async def scenario() -> None:
        await running(cluster, sim, first, second)
        discovery.work()
        await sim.event("supernodes", second, type="DELETED")
        labelled = [n for n in sorted(cluster.nodes) if cluster.nodes[n].labels["tidal.dev/supernode"] == "nvl72-0001"]
        node_event(sim, node_body(cluster.nodes[labelled[0]]), "MODIFIED")  # an equal view
        discovery.work()
        assert [c for c in cluster.calls if c[0] == "create_supernode"] == [("create_supernode", "nvl72-0001")]

    asyncio.run(scenario())


def test_a_deleted_pod_leaves_its_final_state_to_tell_a_drain_from_a_crash():
    """The DELETED event's object is the pod's final state: a drained pod's DisruptionTarget and
    deletionTimestamp, which the cache keeps (`WatchCache.departed`) for the job's next reconcile."""
    _, controller, sim, bodies = setup(1)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "j-0",
            "namespace": "ml",
            "uid": "pod-1",
            "deletionTimestamp": "2026-05-01T00:00:00Z",
            "labels": {"app.kubernetes.io/managed-by": "tidal", "tidal.dev/job": "j", "tidal.dev/hbd-group": "0"},
            "ownerReferences": [
                {"apiVersion": "tidal.dev/v1alpha1", "kind": "TrainingJob", "name": "j", "uid": "job-1"}
                | {"controller": True}
            ],
        },
        "spec": {"nodeName": "nvl72-0000-n00", "containers": [{"name": "c"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        },
    }

    meta = {k: v for k, v in pod["metadata"].items() if k != "deletionTimestamp"}
    running = {**pod, "metadata": meta, "status": {"phase": "Running"}}

    async def scenario() -> None:
        await sim.tick("supernodes", bodies[0])  # timers run: the informer queues its events
        informer = sim.base.informers.pods
        informer.handle({"type": "MODIFIED", "object": running})  # the last event before the delete
        informer.handle({"type": "DELETED", "object": pod})
        controller.cache.drain()
        assert ("ml", "j-0") not in controller.cache.pods
        last = controller.cache.departed[("ml", "j-0")]
        assert (last.disruption, last.terminating, last.owner_uid) == ("EvictionByEvictionAPI", True, "job-1")

    asyncio.run(scenario())
