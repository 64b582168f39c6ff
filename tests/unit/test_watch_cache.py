"""The incremental watch cache and what the cycle skips because of it (k8s/watch.py)."""

import dataclasses
import datetime as dt
from collections import Counter

import pytest

from tidal.clock import FixedClock
from tidal.k8s import labels
from tidal.k8s.admission import placement_demand
from tidal.k8s.cache import build_snapshot, memberships
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.manifests import owner_reference
from tidal.k8s.pools import pool_allocations
from tidal.k8s.state import ClusterState, pod_view
from tidal.k8s.training import allocations
from tidal.k8s.watch import Deleted, WatchCache
from tidal.placement import Packing, plan_gang
from tidal.placement.leftover import QUEUE_WEIGHT, ArrivalHistory
from tidal.topology import build_fleet, snapshot_from_fleet

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, record_packing, run

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def job(cluster: FakeCluster, name: str, dp: int, priority: int = 0, preemptible: bool = False):
    spec = {"tp": 4, "ep": 4, "pp": 1, "dp": dp, "gpusPerPod": 4, "template": TEMPLATE, "priority": priority}
    return cluster.add("TrainingJob", "ml", name, {**spec, "preemptible": preemptible})


def relabel(cluster: FakeCluster, node: str, supernode: str) -> None:
    view = cluster.nodes[node]
    cluster.nodes[node] = dataclasses.replace(view, labels={**view.labels, labels.SUPERNODE: supernode})


def test_membership_follows_label_changes_through_the_index():
    cluster = FakeCluster("nvl72", 3)
    cache = WatchCache()
    cache.sync(cluster.state())
    assert cache.memberships() == memberships(cluster.state())
    version = cache.membership_version
    assert cache.memberships() is cache.memberships(), "not recomputed without a change"
    assert cache.membership_version == version

    relabel(cluster, "nvl72-0000-n03", "nvl72-0002")
    cache.sync(cluster.state())
    members = cache.memberships()
    assert "nvl72-0000-n03" in members["nvl72-0002"].nodes
    assert "nvl72-0000-n03" not in members["nvl72-0000"].nodes
    assert members == memberships(cluster.state())

    # A pod event alone never touches membership.
    version = cache.membership_version
    cache.feed("pod", ("x", "p"), pod_view({"metadata": {"name": "p", "namespace": "x", "uid": "u"}}))
    cache.drain()
    cache.memberships()
    assert cache.membership_version == version

    cache.feed("node", "nvl72-0001-n00", None)
    cache.drain()
    assert cache.memberships() == memberships(cluster_state_without(cluster, "nvl72-0001-n00"))


def cluster_state_without(cluster: FakeCluster, node: str):
    state = cluster.state()
    del state.nodes[node]
    return state


def test_pod_views_follow_events_without_a_full_listing():
    cache = WatchCache()
    body = {
        "metadata": {
            "name": "j-0",
            "namespace": "ml",
            "uid": "u1",
            "labels": {labels.JOB: "j"},
            "ownerReferences": [owner_reference("TrainingJob", "j", "uid-j")],
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Pending"},
    }
    cache.feed("pod", ("ml", "j-0"), pod_view(body))
    cache.drain()
    assert [p.name for p in cache.pods_of("TrainingJob", "ml", "j")] == ["j-0"]
    assert cache.take_dirty()[0] == {("TrainingJob", "ml", "j")}
    cache.feed("pod", ("ml", "j-0"), pod_view({**body, "status": {"phase": "Running"}}))
    cache.drain()
    assert cache.pods_of("TrainingJob", "ml", "j")[0].phase == "Running"
    assert cache.take_dirty()[0] == {("TrainingJob", "ml", "j")}
    cache.feed("pod", ("ml", "j-0"), None)
    cache.drain()
    assert cache.pods_of("TrainingJob", "ml", "j") == [] and "u1" not in cache.pod_uids


def test_other_pods_gpus_are_held_per_node_and_released_on_delete():
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    node = "nvl72-0000-n00"
    cluster.pods[("default", "other")] = {
        "metadata": {"name": "other", "namespace": "default", "uid": "o1"},
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"nvidia.com/gpu": "3"}}}]},
        "status": {"phase": "Running"},
    }
    run(cluster, controller, cycles=1)
    assert controller.keeper.snapshot.nodes[node].allocated == 3
    del cluster.pods[("default", "other")]
    run(cluster, controller, cycles=1)
    assert controller.keeper.snapshot.nodes[node].allocated == 0


def test_snapshot_patched_in_place_equals_a_full_rebuild():
    cluster = FakeCluster("nvl72", 3)
    job(cluster, "a", 2)
    job(cluster, "b", 1, priority=5)
    job(cluster, "c", 9)  # does not fit
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=4)
    lost = cluster.status("TrainingJob", "ml", "a")["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=3)
    rebuilds = controller.keeper.rebuilds

    state = cluster.state()
    controller.cache.sync(state)
    members = controller.cache.memberships()
    _, dirty = controller.cache.take_dirty()
    statuses = {v.uid: (v, controller.writer.effective(v)) for v in state.jobs.values()}
    pools = {v.uid: (v, controller.writer.effective(v)) for v in state.pools.values()}
    controller._book(statuses, pools, {m.accelerator for m in members.values()})
    patched = controller.keeper.refresh(controller.cache, dirty)
    held = [a for v, s in statuses.values() for a in allocations(v, s)]
    held += [a for v, s in pools.values() for a in pool_allocations(v, s)]
    rebuilt = build_snapshot(state, memberships(state), held)
    assert controller.keeper.rebuilds == rebuilds, "patched, not rebuilt"
    for name, node in rebuilt.nodes.items():
        mine = patched.nodes[name]
        fields = ("allocated", "gpus", "ready", "spare")
        assert [getattr(mine, f) for f in fields] == [getattr(node, f) for f in fields], name
    for sn in rebuilt.supernodes:
        assert patched.pod_slots(sn, 4) == rebuilt.pod_slots(sn, 4)


def test_settled_jobs_are_not_reconciled_until_their_pods_move():
    cluster = FakeCluster("nvl72", 2)
    job(cluster, "a", 2)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=4)
    assert cluster.status("TrainingJob", "ml", "a")["phase"] == "Running"
    cluster.calls.clear()
    run(cluster, controller, cycles=1)
    assert controller.last_report.cycle.counters.get("reconciles_skipped") == 1
    assert cluster.calls == []

    del cluster.pods[("ml", "a-3")]  # the watch shows a pod gone: the job is looked at again
    run(cluster, controller, cycles=1)
    assert "reconciles_skipped" not in controller.last_report.cycle.counters
    assert any(verb == "patch_status" for verb, _ in cluster.calls)


def finish(cluster: FakeCluster, name: str) -> None:
    cluster.objects[("TrainingJob", "ml", name)] = dataclasses.replace(
        cluster.get("TrainingJob", "ml", name), deleting=True
    )
    for key in [k for k, p in cluster.pods.items() if p["metadata"]["labels"].get(labels.JOB) == name]:
        del cluster.pods[key]


def test_queued_job_retried_only_when_capacity_goes_up_and_written_only_when_its_reason_kind_changes():
    cluster = FakeCluster("nvl72", 2)  # 8 groups of 16 (4 per rack of 72)
    job(cluster, "small", 1)
    job(cluster, "mid", 2)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=2)
    job(cluster, "big", 8)  # needs every group the cluster holds
    run(cluster, controller, cycles=1)
    big = cluster.status("TrainingJob", "ml", "big")
    assert big["phase"] == "Pending" and "InsufficientFreeCapacity" in {c["reason"] for c in big["conditions"]}
    assert len([d for v, d in cluster.calls if v == "event" and d[0] == "big"]) == 1

    cluster.calls.clear()
    run(cluster, controller, cycles=2)
    cyc = controller.last_report.cycle
    assert cyc.counters.get("queue_skipped") == 1 and cyc.placements_ms == [], "nothing moved: not tried"

    # Free GPUs go up (mid finishes): tried again, still short; the numbers changed, the kind did
    # not, so neither the status nor a new Warning event is written.
    finish(cluster, "mid")
    cluster.calls.clear()
    run(cluster, controller, cycles=1)
    assert controller.last_report.cycle.placements_ms, "retried after capacity went up"
    assert cluster.status("TrainingJob", "ml", "big")["phase"] == "Pending"
    assert not [d for v, d in cluster.calls if d and d[0] == "big" and v in ("patch_status", "event")]
    assert cluster.status("TrainingJob", "ml", "big")["reason"] == big["reason"], "numbers kept"

    finish(cluster, "small")
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "ml", "big")["phase"] in ("Admitted", "Running")


def test_a_label_no_selector_reads_does_not_touch_membership_or_the_snapshot():
    cluster = FakeCluster("nvl72", 2)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=1)
    version, rebuilds = controller.cache.membership_version, controller.keeper.rebuilds
    view = cluster.nodes["nvl72-0000-n01"]
    cluster.nodes["nvl72-0000-n01"] = dataclasses.replace(view, labels={**view.labels, "team": "a"})
    run(cluster, controller, cycles=1)
    assert (controller.cache.membership_version, controller.keeper.rebuilds) == (version, rebuilds)


def test_a_queued_listing_supersedes_the_events_before_it_not_those_after():
    cluster = FakeCluster("nvl72", 1)
    cache = WatchCache()

    def pod(name: str):
        owner = [owner_reference("TrainingJob", "j", "uid-j")]
        return pod_view({"metadata": {"name": name, "namespace": "x", "uid": name, "ownerReferences": owner}})

    cache.feed("pod", ("x", "old"), pod("old"))  # queued before the listing: in it, or superseded by it
    cache.resync(cluster.state())
    cache.feed("pod", ("x", "new"), pod("new"))
    assert cache.drain() == 1
    assert set(cache.pods) == {("x", "new")} and len(cache.nodes) == 18 and set(cache.supernodes) == {"nvl72-0000"}


def test_a_listing_of_one_kind_supersedes_that_kinds_events_only():
    """The pod informer's listing (k8s/informer.py) replaces the pods and drops the pod events
    queued before it; the nodes' events around it are kept, in order, and other tables untouched."""
    cluster = FakeCluster("nvl72", 1)
    cache = WatchCache()
    cache.resync(cluster.state())
    cache.drain()

    def pod(name: str):
        owner = [owner_reference("TrainingJob", "j", "uid-j")]
        return pod_view({"metadata": {"name": name, "namespace": "x", "uid": name, "ownerReferences": owner}})

    cache.feed("pod", ("x", "gone"), pod("gone"))  # deleted while unwatched: the listing lacks it
    cache.feed("node", "nvl72-0000-n00", None)  # a node deleted before the pods' listing
    cache.resync(ClusterState(pods={("x", "kept"): pod("kept")}), kinds=("pod",))
    cache.feed("pod", ("x", "new"), pod("new"))
    assert cache.drain() == 2
    assert set(cache.pods) == {("x", "kept"), ("x", "new")}
    assert "nvl72-0000-n00" not in cache.nodes and len(cache.nodes) == 17, "other kinds' events all applied"
    assert set(cache.supernodes) == {"nvl72-0000"}, "a pods' listing leaves other tables alone"


def test_a_deletion_a_listing_supersedes_still_leaves_the_pods_final_state():
    """The DELETED event's view (a drain's DisruptionTarget) is what tells a drain from a crash,
    not the older view the cache held when the listing dropped the pod."""
    cache = WatchCache()
    meta = {
        "name": "j-0",
        "namespace": "x",
        "uid": "p1",
        "ownerReferences": [owner_reference("TrainingJob", "j", "uid-j")],
    }
    cache.feed("pod", ("x", "j-0"), pod_view({"metadata": meta, "status": {"phase": "Running"}}))
    cache.drain()
    drained = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    final = pod_view(
        {"metadata": {**meta, "deletionTimestamp": "2026-05-01T00:00:00Z"}, "status": {"conditions": [drained]}}
    )
    cache.feed("pod", ("x", "j-0"), Deleted(final))
    cache.resync(ClusterState(), kinds=("pod",))
    cache.drain()
    assert ("x", "j-0") not in cache.pods
    assert cache.departed[("x", "j-0")].disruption == "EvictionByEvictionAPI"


def test_a_listing_given_to_a_cycle_that_could_not_run_waits_for_the_next_one():
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    with controller.lock:  # a metrics scrape
        assert controller.cycle(cluster.state()) is None
    assert controller.cycle() is not None
    assert len(controller.cache.nodes) == 18
    assert cluster.status("Supernode", None, "nvl72-0000")["gpus"]["total"] == 72


class FlakyStatus(FakeCluster):
    """Each object's first status patch fails, as Api.patch_status reports a 429 or a timeout."""

    def __init__(self, *args):
        super().__init__(*args)
        self.failed: set[tuple] = set()

    def patch_status(self, kind, namespace, name, status, resource_version=None):
        if (kind, namespace, name) not in self.failed:
            self.failed.add((kind, namespace, name))
            self._log("patch_status", (kind, name))
            return None
        return super().patch_status(kind, namespace, name, status, resource_version)


def test_a_supernode_status_that_failed_to_write_is_written_by_the_next_cycle():
    cluster = FlakyStatus("nvl72", 2)
    controller = Controller(cluster, FixedClock(NOW))
    controller.cycle(cluster.state())
    assert cluster.status("Supernode", None, "nvl72-0000") == {}
    controller.cycle(cluster.state())
    assert cluster.status("Supernode", None, "nvl72-0000")["gpus"]["total"] == 72
    assert cluster.status("Supernode", None, "nvl72-0001")["gpus"]["total"] == 72
    cluster.calls.clear()
    run(cluster, controller, cycles=2)
    assert not [c for c in cluster.calls if c[0] == "patch_status"], "written once, then left alone"


def test_a_pod_labelled_as_tidals_without_a_tidal_owner_holds_foreign_gpus():
    """Ownership is the controller ownerReference: a tenant's label tidal.dev/job=x on its own
    GPU pod must not make tidal stop counting that pod's GPUs (issue 13)."""
    cache = WatchCache()
    body = {
        "metadata": {"name": "mine", "namespace": "t", "uid": "u", "labels": {labels.JOB: "x", labels.HBD_GROUP: "0"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running"},
    }
    view = pod_view(body)
    assert view.owner is None and view.group is None
    cache.feed("pod", ("t", "mine"), view)
    cache.drain()
    assert cache.other_held["n1"]["nvidia.com/gpu"] == 4
    assert cache.pods_of("TrainingJob", "t", "x") == []
    # A foreign controller (a Job, a ReplicaSet) is not tidal's either.
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "j", "controller": True}
    ]
    assert pod_view(body).owner is None
    body["metadata"]["ownerReferences"] = [owner_reference("TrainingJob", "x", "uid-x")]
    assert pod_view(body).owner == ("TrainingJob", "x")


def _supernodes_per_job(cluster: FakeCluster, *names: str) -> Counter:
    out: Counter = Counter()
    for name in names:
        out.update({g["supernode"] for g in cluster.status("TrainingJob", "ml", name)["placement"]})
    return out


def test_resident_workloads_per_supernode_follow_bookings_and_membership():
    cluster = FakeCluster("nvl72", 3)
    job(cluster, "a", 6)  # 6 groups of 16: more than one rack holds (4 each)
    job(cluster, "b", 1)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=3)
    expected = _supernodes_per_job(cluster, "a", "b")
    assert sum(expected.values()) >= 3
    assert controller.keeper.residents == expected
    assert controller.keeper.snapshot.residents == expected

    finish(cluster, "a")
    run(cluster, controller, cycles=2)
    assert controller.keeper.residents == _supernodes_per_job(cluster, "b")

    # One of b's nodes moves to another supernode: b is counted where its nodes are now.
    moved = cluster.status("TrainingJob", "ml", "b")["placement"][0]["nodes"][0]
    other = next(sn for sn in ("nvl72-0000", "nvl72-0001", "nvl72-0002") if not moved.startswith(sn))
    relabel(cluster, moved, other)
    run(cluster, controller, cycles=1)
    supernode_of = {n: m.supernode for m in controller.cache.memberships().values() for n in m.nodes}
    b_nodes = {n for g in cluster.status("TrainingJob", "ml", "b")["placement"] for n in g["nodes"]}
    assert controller.keeper.residents == Counter({supernode_of[n] for n in b_nodes})

    restarted = Controller(cluster, FixedClock(NOW))  # a new leader: its first cycle knows them
    run(cluster, restarted, cycles=1)
    assert restarted.keeper.snapshot.residents == Counter({supernode_of[n] for n in b_nodes})


def test_placement_demand_counts_each_job_once_as_an_arrival_and_queued_ones_again():
    cluster = FakeCluster("nvl72", 1)
    running = job(cluster, "running", 1)
    queued = job(cluster, "queued", 9)
    broken = cluster.add("TrainingJob", "ml", "broken", {"tp": 4, "template": TEMPLATE})  # no gpusPerPod
    arrivals = ArrivalHistory()
    statuses = {
        running.uid: (running, {"phase": "Running", "placement": [{"group": 0}]}),
        queued.uid: (queued, {"phase": "Pending"}),
        broken.uid: (broken, {"phase": "Pending"}),
    }
    # A 128-GPU group no 72-GPU rack holds asks for nothing, before admission has said so too.
    never = cluster.add("TrainingJob", "ml", "never", {"tp": 8, "ep": 16, "gpusPerPod": 4, "template": TEMPLATE})
    statuses[never.uid] = (never, {"phase": "Pending"})
    # A job whose PriorityClass does not exist waits for configuration, not capacity.
    unknown = cluster.add("TrainingJob", "ml", "unknown", {"tp": 8, "gpusPerPod": 4, "template": TEMPLATE})
    reason = {"type": "Schedulable", "status": "False", "reason": "UnknownPriorityClass"}
    statuses[unknown.uid] = (unknown, {"phase": "Pending", "conditions": [reason]})
    snapshot = snapshot_from_fleet(build_fleet("nvl72", 1))
    demand = placement_demand(statuses, arrivals, snapshot)
    # Two arrivals of 16-GPU groups (the second ages the first by HISTORY_DECAY), one queued.
    assert demand.sizes("nvidia.com/gpu") == {16: pytest.approx(QUEUE_WEIGHT + 0.98 + 1.0)}
    again = placement_demand(statuses, arrivals, snapshot)
    assert again.sizes("nvidia.com/gpu") == demand.sizes("nvidia.com/gpu"), "an arrival is counted once"


def test_jobs_first_seen_together_arrive_in_creation_order():
    # After a restart every job is new at once: the history must not depend on dict order.
    cluster = FakeCluster("nvl72", 1)
    old = cluster.add("TrainingJob", "ml", "old", {"tp": 8, "gpusPerPod": 4, "template": TEMPLATE})
    new = job(cluster, "new", 1)  # created later, 16-GPU groups
    forward, backward = ArrivalHistory(), ArrivalHistory()
    snapshot = snapshot_from_fleet(build_fleet("nvl72", 1))
    placement_demand({old.uid: (old, {"phase": "Running"}), new.uid: (new, {"phase": "Running"})}, forward, snapshot)
    placement_demand({new.uid: (new, {"phase": "Running"}), old.uid: (old, {"phase": "Running"})}, backward, snapshot)
    assert (
        forward.history.sizes("nvidia.com/gpu")
        == backward.history.sizes("nvidia.com/gpu")
        == {
            8: pytest.approx(0.98),
            16: 1.0,
        }
    )


def test_a_job_admitted_earlier_in_the_cycle_is_a_resident_for_the_next(monkeypatch):
    from tidal.k8s import admission

    residents_seen = []

    def recording(snapshot, request, demand=None):
        residents_seen.append(sum(snapshot.residents.values()))
        return plan_gang(snapshot, request, demand)

    monkeypatch.setattr(admission, "plan_gang", recording)
    cluster = FakeCluster("nvl72", 2)
    job(cluster, "a", 1)
    job(cluster, "b", 1)
    run(cluster, Controller(cluster, FixedClock(NOW)), cycles=1)
    assert residents_seen[:2] == [0, 1]


def test_admission_places_with_the_cycles_demand(monkeypatch):
    from tidal.k8s import admission

    seen = []

    def recording(snapshot, request, demand=None):
        seen.append(demand)
        return plan_gang(snapshot, request, demand)

    monkeypatch.setattr(admission, "plan_gang", recording)
    cluster = FakeCluster("nvl72", 2)
    job(cluster, "a", 1)
    run(cluster, Controller(cluster, FixedClock(NOW)), cycles=1)
    assert seen and seen[0] is not None and 16 in seen[0].sizes("nvidia.com/gpu")


@pytest.mark.parametrize("packing", list(Packing))
def test_admission_places_with_the_operators_packing(monkeypatch, packing):
    from tidal.k8s import admission

    seen = record_packing(monkeypatch, admission)
    cluster = FakeCluster("nvl72", 2)
    job(cluster, "a", 1)
    run(cluster, Controller(cluster, FixedClock(NOW), ControllerSettings(packing=packing)), cycles=1)
    assert seen == [packing]


def test_a_pods_deletion_handled_after_its_successor_under_the_name_keeps_the_successor():
    # Issue 34 (bench.recovery, a 1,024-GPU gang restarted at 1,008 nodes): kopf handles each pod
    # (uid) apart, so the deletion of rank 1's old pod reached the cache after its new pod was
    # added; the cache dropped the new one, and the gang waited minutes, its create refused
    # (409) every cycle, until a relisting found it.
    cache = WatchCache()
    key = ("ml", "j-1")
    base = {"metadata": {"namespace": "ml", "name": "j-1"}, "spec": {"containers": [{"name": "c"}]}, "status": {}}
    old = pod_view({**base, "metadata": {**base["metadata"], "uid": "old", "deletionTimestamp": "t"}})
    new = pod_view({**base, "metadata": {**base["metadata"], "uid": "new"}})
    cache.feed("pod", key, old)
    cache.drain()
    cache.feed("pod", key, new)
    cache.feed("pod", key, Deleted(old))  # the old pod's deletion, handled late
    cache.drain()
    assert getattr(cache.pods.get(key), "uid", None) == "new", "the new pod was dropped"
    cache.feed("pod", key, old)  # a late update of the deleted pod does not bring it back
    cache.drain()
    assert getattr(cache.pods.get(key), "uid", None) == "new", "the deleted pod came back"
    cache.feed("pod", key, Deleted(new))
    cache.drain()
    assert key not in cache.pods
    cache.feed("pod", key, new)  # a late update of the deleted pod, with no other pod of its name
    cache.drain()
    assert key not in cache.pods, "a deleted pod came back"
    # The reviewer's order: the new pod, then the old pod's late (terminating) update, then its deletion.
    cache = WatchCache()
    cache.feed("pod", key, new)
    cache.feed("pod", key, old)
    cache.feed("pod", key, Deleted(old))
    cache.drain()
    assert getattr(cache.pods.get(key), "uid", None) == "new", "an old pod's late update replaced the new one"
