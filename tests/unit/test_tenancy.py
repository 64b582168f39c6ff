"""Priorities from PriorityClasses (issue 13): a free integer let any namespace outrank any other."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter

import pytest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.quota import Quotas, quota_view
from tidal.k8s.state import ResourceView
from tidal.k8s.taints import Taint

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, check_sound, run

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


def rack_job(**extra) -> dict:
    return {"tp": 4, "ep": 16, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE, **extra}


def test_unknown_priority_class_keeps_the_job_pending_naming_the_field_until_it_exists():
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "j", rack_job(priorityClassName="gold"))
    run(cluster, controller)
    status = cluster.status("TrainingJob", "a", "j")
    assert status["phase"] == "Pending"
    cond = {c["type"]: c for c in status["conditions"]}["Schedulable"]
    assert (cond["status"], cond["reason"]) == ("False", "UnknownPriorityClass")
    assert cond["message"] == "spec.priorityClassName: PriorityClass 'gold' not found"
    assert not cluster.pods, "no pod made (the API server would refuse it)"
    cluster.add_priority_class("gold", 100)
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "j")["phase"] == "Running"
    assert {p["spec"]["priorityClassName"] for p in cluster.pods.values()} == {"gold"}


def test_spec_priority_is_ignored_unless_the_operator_allows_it():
    """Tenant b writes priority 1000000 without a class: it must not preempt tenant a's work."""
    for allowed in (False, True):
        cluster = FakeCluster("nvl72", 1)
        controller = Controller(cluster, FixedClock(NOW), ControllerSettings(spec_priority=allowed))
        cluster.add("TrainingJob", "a", "victim", rack_job(preemptible=True, priority=0))
        run(cluster, controller)
        assert cluster.status("TrainingJob", "a", "victim")["phase"] == "Running"
        cluster.add("TrainingJob", "b", "bully", rack_job(priority=1_000_000))
        run(cluster, controller)
        evicted = bool(cluster.status("TrainingJob", "a", "victim").get("eviction"))
        assert evicted is allowed, f"spec_priority={allowed}"


def test_a_system_priority_class_is_refused_and_preempts_nothing():
    """system-cluster-critical exists in every cluster and no quota limits it by default: a tenant
    naming it would outrank every workload. tidal refuses the system range, naming the field."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add_priority_class("system-cluster-critical", 2_000_000_000)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "victim", rack_job(preemptible=True))
    run(cluster, controller)
    cluster.add("TrainingJob", "b", "bully", rack_job(priorityClassName="system-cluster-critical"))
    run(cluster, controller)
    assert not cluster.status("TrainingJob", "a", "victim").get("eviction")
    status = cluster.status("TrainingJob", "b", "bully")
    cond = {c["type"]: c for c in status["conditions"]}["Schedulable"]
    assert (status["phase"], cond["reason"]) == ("Pending", "UnknownPriorityClass")
    assert cond["message"].startswith(
        "spec.priorityClassName: PriorityClass 'system-cluster-critical' is in the system range"
    )


def test_priority_class_value_preempts_and_the_global_default_applies_without_a_class():
    cluster = FakeCluster("nvl72", 1)
    cluster.add_priority_class("batch", 10, global_default=True)
    cluster.add_priority_class("urgent", 100)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "victim", rack_job(preemptible=True))  # the default: 10
    run(cluster, controller)
    cluster.add("TrainingJob", "b", "same", rack_job(priority=1_000_000))  # also 10: no preemption
    run(cluster, controller)
    assert not cluster.status("TrainingJob", "a", "victim").get("eviction")
    cluster.add("TrainingJob", "b", "urgent", rack_job(priorityClassName="urgent"))
    run(cluster, controller)
    eviction = cluster.status("TrainingJob", "a", "victim")["eviction"]
    assert eviction["by"] == "b/urgent (priority 100)"


def test_a_gang_past_its_namespaces_gpu_quota_stays_pending_naming_it_and_nothing_is_made():
    cluster = FakeCluster("nvl72", 2)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "80", "cpu": "100"})
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "first", rack_job())  # 64 GPUs
    cluster.add("TrainingJob", "b", "elsewhere", rack_job())  # another namespace: no quota
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "second", {**rack_job(), "ep": 4, "dp": 2})  # 32 more: 96 > 80
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "first")["phase"] == "Running"
    assert cluster.status("TrainingJob", "b", "elsewhere")["phase"] == "Running"
    status = cluster.status("TrainingJob", "a", "second")
    cond = {c["type"]: c for c in status["conditions"]}["Schedulable"]
    assert (status["phase"], cond["reason"]) == ("Pending", "QuotaExceeded")
    assert cond["message"] == "ResourceQuota a/gpus: requests.nvidia.com/gpu 64 of 80 in use, 16 left; this needs 32"
    assert not cluster.pods_of("tidal.dev/job", "second")
    # An elastic job starts as large as the quota allows.
    cluster.add("TrainingJob", "a", "elastic", {**rack_job(), "ep": 2, "dp": 4, "elastic": {"minDP": 1, "maxDP": 4}})
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "elastic")["currentDP"] == 2  # 2 x 8 = the 16 left
    # Room freed in the namespace: the waiting job is tried again and admitted.
    del cluster.objects[("TrainingJob", "a", "first")]
    for key in [k for k, body in cluster.pods.items() if body["metadata"]["labels"].get("tidal.dev/job") == "first"]:
        del cluster.pods[key]  # the garbage collector's part: its pods hold GPUs until they are gone
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "second")["phase"] == "Running"


def test_quota_scoped_to_other_priority_classes_does_not_apply():
    cluster = FakeCluster("nvl72", 1)
    cluster.add_priority_class("tidal-batch", 1)
    scope = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["tidal-serving"]}]}
    cluster.add_quota("a", "serving-gpus", {"requests.nvidia.com/gpu": "0"}, scopeSelector=scope)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "batch", rack_job(priorityClassName="tidal-batch"))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "batch")["phase"] == "Running"


LOW_ONLY = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["low"]}]}


def test_a_quota_scoped_to_a_priority_class_counts_only_that_classs_gpus():
    """a/low-gpus (hard 16) is scoped to PriorityClass low: the API server counts only low pods
    against it, so a 64-GPU high job of the namespace leaves all 16 to a low job; a second low
    job finds them taken."""
    cluster = FakeCluster("nvl72", 2)
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    cluster.add_quota("a", "low-gpus", {"requests.nvidia.com/gpu": "16"}, scopeSelector=LOW_ONLY)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))  # 64 GPUs
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "big")["phase"] == "Running"
    cluster.add("TrainingJob", "a", "small", rack_job(ep=4, priorityClassName="low"))  # 16 GPUs
    run(cluster, controller)
    status = cluster.status("TrainingJob", "a", "small")
    assert status["phase"] == "Running", status.get("reason")
    cluster.add("TrainingJob", "a", "more", small_job(priorityClassName="low"))
    run(cluster, controller)
    cond = {c["type"]: c for c in cluster.status("TrainingJob", "a", "more")["conditions"]}["Schedulable"]
    assert cond["reason"] == "QuotaExceeded"
    assert cond["message"] == "ResourceQuota a/low-gpus: requests.nvidia.com/gpu 16 of 16 in use, 0 left; this needs 8"
    check_sound(cluster)


def test_a_workload_without_a_class_counts_under_the_global_default_for_scoped_quotas():
    """The API server gives the pods of a workload without spec.priorityClassName the globalDefault
    class's name, and a quota scoped to that class counts them: tidal checks the whole gang
    against it first (else half the gang would be created and the rest refused), and a quota
    scoped to other classes leaves it alone."""
    cluster = FakeCluster("nvl72", 2)
    cluster.add_priority_class("low", 1, global_default=True)
    cluster.add_priority_class("high", 100)
    cluster.add_quota("a", "low-gpus", {"requests.nvidia.com/gpu": "16"}, scopeSelector=LOW_ONLY)
    high_only = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}
    cluster.add_quota("b", "high-gpus", {"requests.nvidia.com/gpu": "0"}, scopeSelector=high_only)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "unnamed", rack_job(ep=8))  # 32 GPUs, no class
    cluster.add("TrainingJob", "b", "free", rack_job(ep=8))  # no class: low, so not under b's quota
    run(cluster, controller)
    cond = {c["type"]: c for c in cluster.status("TrainingJob", "a", "unnamed")["conditions"]}["Schedulable"]
    assert cond["reason"] == "QuotaExceeded", cond
    assert cond["message"] == "ResourceQuota a/low-gpus: requests.nvidia.com/gpu 0 of 16 in use, 16 left; this needs 32"
    assert not cluster.pods_of("tidal.dev/job", "unnamed")
    assert cluster.status("TrainingJob", "b", "free")["phase"] == "Running"
    check_sound(cluster)


def test_a_scoped_quota_counts_bookings_holds_and_foreign_pods_of_its_classes_only():
    """The ledger (foreign pods included), this cycle's bookings and the carried holds are each
    split by PriorityClass; status.used (already scoped by the API server) stays a floor."""
    from tidal.k8s.cycle import Hold
    from tidal.k8s.quota import Quotas, quota_view
    from tidal.k8s.state import pod_view, resource_view

    quota = quota_view(
        {
            "metadata": {"namespace": "a", "name": "low-gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "16"}, "scopeSelector": LOW_ONLY},
            "status": {"used": {"requests.nvidia.com/gpu": "4"}},
        }
    )

    def job(name: str, priority_class: str) -> ResourceView:
        body = {
            "metadata": {"namespace": "a", "name": name, "uid": name},
            "spec": rack_job(priorityClassName=priority_class),
        }
        return resource_view({"kind": "TrainingJob", **body})

    tenant = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}], "priorityClassName": "high"}
    pod = pod_view({"metadata": {"namespace": "a", "name": "tenant"}, "spec": tenant})
    assert pod.priority_class == "high"
    quotas = Quotas.build(
        [quota], held=[("a", "nvidia.com/gpu", 8, pod.priority_class), ("a", "nvidia.com/gpu", 2, "low")]
    )
    quotas.carry(
        {
            "h": Hold(100, frozenset(), "a", "nvidia.com/gpu", 64, "high"),
            "l": Hold(100, frozenset(), "a", "nvidia.com/gpu", 4, "low"),
        },
        lambda view: 1,
    )
    low = job("low-job", "low")
    assert quotas.room(low) == 8, "16 - (status.used 4 over the ledger's 2 low) - the low hold's 4"
    quotas.book(job("high-job", "high"), 64)
    assert quotas.room(low) == 8, "a high booking is not counted by a quota of class low"
    quotas.book(job("other-low", "low"), 8)
    assert quotas.room(low) == 0
    assert quotas.problem(low, 1) == (
        "ResourceQuota a/low-gpus: requests.nvidia.com/gpu 16 of 16 in use, 0 left; this needs 1"
    )


def test_pool_replicas_stay_within_the_namespaces_gpu_quota():
    cluster = FakeCluster("nvl72", 1)
    cluster.add_quota("serve", "gpus", {"requests.nvidia.com/gpu": "20"})
    controller = Controller(cluster, FixedClock(NOW))
    pool = {"minReplicas": 4, "maxReplicas": 4, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "serve", "chat", pool)
    run(cluster, controller)
    status = cluster.get("InferencePool", "serve", "chat").status
    assert status["placedReplicas"] == 2, "whole replicas of 8 within 20 GPUs"
    cond = {c["type"]: c for c in status["conditions"]}["Schedulable"]
    assert cond["reason"] == "QuotaExceeded" and "ResourceQuota serve/gpus" in cond["message"]
    assert len(cluster.pods_of("tidal.dev/pool", "chat")) == 4


def test_two_admissions_in_one_cycle_never_share_the_quotas_room():
    """status.used above tidal's own ledger (it counts terminating pods) must not hide what this
    cycle already booked: 32 of 64 used by the quota's count, 32 left, two 32-GPU jobs -> one."""
    from tidal.k8s.quota import Quotas, quota_view
    from tidal.k8s.state import resource_view

    quota = quota_view(
        {
            "metadata": {"namespace": "a", "name": "gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "64"}},
            "status": {"used": {"requests.nvidia.com/gpu": "32"}},
        }
    )
    quotas = Quotas.build([quota], held=[("a", "nvidia.com/gpu", 8, None)])  # the ledger: 8
    job = resource_view(
        {"kind": "TrainingJob", "metadata": {"namespace": "a", "name": "j", "uid": "u"}, "spec": rack_job()}
    )
    assert quotas.problem(job, 32) is None
    quotas.book(job, 32)
    assert quotas.problem(job, 32) is not None, "the second 32 GPUs fit into the room the first took"
    assert quotas.room(job) == 0


def test_pods_of_an_earlier_job_of_the_same_name_are_not_the_new_ones():
    """A job deleted and made again at once: until the garbage collector removes the old pods
    (their controller ownerReference names the old uid) the new job must neither count them as
    its own (Running on pods it never made) nor delete them (they are not its to delete)."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    old = cluster.add("TrainingJob", "a", "j", rack_job())
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "j")["phase"] == "Running"
    old_pods = {key: dict(body) for key, body in cluster.pods.items()}
    assert {b["metadata"]["ownerReferences"][0]["uid"] for b in old_pods.values()} == {old.uid}
    del cluster.objects[("TrainingJob", "a", "j")]
    new = cluster.add("TrainingJob", "a", "j", rack_job())
    cluster.calls.clear()
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "j").get("phase") != "Running", "adopted the old job's pods"
    assert not [d for verb, d in cluster.calls if verb == "delete_pod"], "deleted pods it does not own"
    for key in old_pods:  # the garbage collector removes them
        cluster.pods.pop(key)
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "j")["phase"] == "Running"
    assert {b["metadata"]["ownerReferences"][0]["uid"] for b in cluster.pods.values()} == {new.uid}


def test_a_job_waiting_for_its_victims_keeps_its_quota_share():
    """Tenant a (quota 64 GPUs) preempts b's rack job for a 64-GPU job; while b checkpoints, a's
    small job must not take the quota the waiting job needs, or that job would be refused once b
    has left (b evicted for nothing)."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "64"})
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "b", "victim", rack_job(preemptible=True, priorityClassName="low"))
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))
    small = {"tp": 4, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE, "priorityClassName": "low"}
    cluster.add("TrainingJob", "a", "small", small)
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "b", "victim").get("eviction"), "the victim is leaving for big"
    big = cluster.status("TrainingJob", "a", "big")
    assert big["phase"] == "Pending" and big["reason"].startswith("waiting for 1 preempted job(s)"), big
    status = cluster.status("TrainingJob", "a", "small")
    cond = {c["type"]: c for c in status["conditions"]}["Schedulable"]
    assert (status["phase"], cond["reason"]) == ("Pending", "QuotaExceeded"), status


def test_nodes_freed_for_a_waiting_job_are_not_taken_by_a_pool_or_a_lower_job_first():
    """b's rack job is preempted for a's; while it checkpoints, a low-priority pool asks for the
    same GPUs. The pool is reconciled before admission in each cycle: it must not take the nodes
    freed for a's job (which would then wait for good, b evicted for nothing)."""
    cluster = FakeCluster("nvl72", 1)
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    controller = Controller(cluster, FixedClock(NOW))
    clock = controller.clock
    ckpt = {"gracePeriodSeconds": 30}
    cluster.add("TrainingJob", "b", "victim", rack_job(preemptible=True, priorityClassName="low", checkpoint=ckpt))
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "b", "victim").get("eviction"), "the victim is leaving for big"
    pool = {"minReplicas": 2, "maxReplicas": 2, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "c", "p", pool)
    for _ in range(6):
        clock.advance(seconds=20)
        run(cluster, controller, cycles=1)
    big = cluster.status("TrainingJob", "a", "big")
    assert big["phase"] in ("Admitted", "Running"), big
    # The pool may have the 8 GPUs nobody waits for, not the ones freed for big.
    pool_nodes = {n for r in cluster.get("InferencePool", "c", "p").status.get("placement", []) for n in r["nodes"]}
    assert not pool_nodes & {n for g in big["placement"] for n in g["nodes"]}
    check_sound(cluster)


def test_a_pool_waiting_for_its_victims_keeps_its_quota_share():
    cluster = FakeCluster("nvl72", 1)
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("serving", 1000)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "64"})
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "b", "victim", rack_job(preemptible=True, priorityClassName="low"))
    run(cluster, controller)
    pool = {"minReplicas": 2, "maxReplicas": 2, "tp": 32, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "a", "p", {**pool, "priorityClassName": "serving"})
    small = {"tp": 4, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE, "priorityClassName": "low"}
    cluster.add("TrainingJob", "a", "small", small)
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "b", "victim").get("eviction"), "the victim is leaving for the pool"
    status = cluster.status("TrainingJob", "a", "small")
    cond = {c["type"]: c for c in status["conditions"]}["Schedulable"]
    assert (status["phase"], cond["reason"]) == ("Pending", "QuotaExceeded"), status


def test_gpus_of_a_deleted_jobs_pods_stay_booked_until_the_pods_are_gone():
    """Deleting a job removes the object at once; its pods keep their GPUs through their grace
    period until the garbage collector and kubelets are done. Nothing may be placed on them."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "j", rack_job())
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "j")["phase"] == "Running"
    del cluster.objects[("TrainingJob", "a", "j")]
    cluster.add("TrainingJob", "b", "k", rack_job())
    run(cluster, controller)
    assert cluster.status("TrainingJob", "b", "k")["phase"] == "Pending", "placed onto GPUs j's pods still hold"
    check_sound(cluster)
    for key in [k for k in cluster.pods if k[0] == "a"]:
        del cluster.pods[key]
    run(cluster, controller)
    assert cluster.status("TrainingJob", "b", "k")["phase"] == "Running"
    check_sound(cluster)


def small_job(**extra) -> dict:
    return {"tp": 4, "ep": 2, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE, **extra}


def test_a_restarting_lower_job_neither_takes_a_waiting_jobs_nodes_nor_spoils_its_plan():
    """A lower-priority job restarting after a node failure is tried first (recoveries first); it
    plans around the nodes held for a higher-priority job waiting for its victim, and what it
    derived under its own view of the snapshot is not reused for the holder (which would then find
    its own nodes blocked, give up its hold, and leave its victim evicted for nothing)."""
    cluster = FakeCluster("nvl72", 2)
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    controller = Controller(cluster, FixedClock(NOW))
    clock = controller.clock
    ckpt = {"gracePeriodSeconds": 30}
    cluster.add("TrainingJob", "v", "victim", rack_job(preemptible=True, priorityClassName="low", checkpoint=ckpt))
    cluster.add("TrainingJob", "x", "x", rack_job(priorityClassName="low"))
    cluster.add("TrainingJob", "y", "y1", small_job(priorityClassName="low"))
    cluster.add("TrainingJob", "y", "y2", small_job(priorityClassName="low"))
    run(cluster, controller)
    x_nodes = {n for g in cluster.status("TrainingJob", "x", "x")["placement"] for n in g["nodes"]}
    lost = sorted(x_nodes)[0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=2)
    cluster.add("TrainingJob", "b", "big", rack_job(priorityClassName="high"))
    for _ in range(7):
        run(cluster, controller, cycles=1)
        clock.advance(seconds=20)
    big = cluster.status("TrainingJob", "b", "big")
    assert big["phase"] in ("Admitted", "Running"), big
    check_sound(cluster)


def test_pods_of_a_deleted_job_stay_booked_after_a_new_leader_takes_over():
    cluster = FakeCluster("nvl72", 1)
    cluster.add("TrainingJob", "a", "j", rack_job())
    run(cluster, Controller(cluster, FixedClock(NOW)))
    del cluster.objects[("TrainingJob", "a", "j")]  # its pods are still terminating
    fresh = Controller(cluster, FixedClock(NOW))  # failover, or the operator restarted
    cluster.add("TrainingJob", "b", "k", rack_job())
    run(cluster, fresh)
    assert cluster.status("TrainingJob", "b", "k")["phase"] == "Pending"
    check_sound(cluster)


def test_a_job_preempts_on_tainted_nodes_it_tolerates():
    """A rack dedicated to team a (every node tainted dedicated=a:NoSchedule); both jobs tolerate
    it. The high-priority job must preempt the low-priority one there, as it would untainted."""
    cluster = FakeCluster("nvl72", 1)
    for name in list(cluster.nodes):
        cluster.nodes[name] = dataclasses.replace(cluster.nodes[name], taints=(Taint("dedicated", "a", "NoSchedule"),))
    tolerant = {"spec": {**TEMPLATE["spec"], "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add("TrainingJob", "a", "low", rack_job(preemptible=True, priorityClassName="low", template=tolerant))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "a", "low")["phase"] == "Running"
    cluster.add("TrainingJob", "a", "high", rack_job(priorityClassName="high", template=tolerant))
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "a", "low").get("eviction"), "the tolerating job never preempts"


def waiting_for_a_rack(cluster: FakeCluster, controller: Controller) -> None:
    """Namespace a (quota 64 GPUs) has its 64-GPU job `big` (high) wait for b's preempted rack job
    (low, 300 s to checkpoint) on the one rack: big holds its nodes and its whole quota share."""
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "64"})
    ckpt = {"gracePeriodSeconds": 300}
    cluster.add("TrainingJob", "b", "victim", rack_job(preemptible=True, priorityClassName="low", checkpoint=ckpt))
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "b", "victim").get("eviction"), "the victim is leaving for big"


def schedulable(cluster: FakeCluster, kind: str, namespace: str, name: str) -> str:
    status = cluster.get(kind, namespace, name).status
    return {c["type"]: c for c in status.get("conditions", [])}["Schedulable"]["reason"]


def test_a_lower_pool_of_its_namespace_does_not_take_a_waiting_jobs_quota_share_next_cycle():
    """Pools are grown before admission plans big again: the quota share big booked last cycle
    must still be its own then, or the pool takes 8 of the 64 GPUs, big is refused by the quota
    and its victim was evicted for nothing."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    waiting_for_a_rack(cluster, controller)
    pool = {"minReplicas": 1, "maxReplicas": 1, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "a", "p", {**pool, "priorityClassName": "low"})
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    assert cluster.get("InferencePool", "a", "p").status["placedReplicas"] == 0
    assert schedulable(cluster, "InferencePool", "a", "p") == "QuotaExceeded"


def test_a_higher_pool_of_its_namespace_is_not_held_back_by_a_lower_waiting_jobs_quota_share():
    """A hold keeps quota only from workloads that do not outrank the holder, as it keeps nodes."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    waiting_for_a_rack(cluster, controller)
    cluster.add_priority_class("serving", 1000)
    pool = {"minReplicas": 1, "maxReplicas": 1, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add("InferencePool", "a", "p", {**pool, "priorityClassName": "serving"})
    run(cluster, controller, cycles=1)
    assert cluster.get("InferencePool", "a", "p").status["placedReplicas"] == 1


def test_a_job_refused_for_a_holds_quota_share_is_tried_again_once_the_holder_is_gone():
    """A small job of namespace a is refused while big holds the whole quota; big is deleted
    while nothing else changes (the victim still checkpoints): the small job is admitted."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    waiting_for_a_rack(cluster, controller)
    cluster.add("TrainingJob", "a", "small", small_job(priorityClassName="low"))  # 8 GPUs, 8 free
    run(cluster, controller, cycles=2)
    assert schedulable(cluster, "TrainingJob", "a", "small") == "QuotaExceeded"
    del cluster.objects[("TrainingJob", "a", "big")]
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "a", "small")["phase"] in ("Admitted", "Running")
    check_sound(cluster)


def rack_with_room_for_four_nodes(cluster: FakeCluster, controller: Controller) -> None:
    """b's preemptible low job on 14 of the rack's 18 nodes (checkpoint 300 s), 4 nodes free."""
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    cluster.add_priority_class("serving", 1000)
    ckpt = {"gracePeriodSeconds": 300}
    victim = {"tp": 4, "ep": 14, "pp": 1, "dp": 1, "gpusPerPod": 4, "template": TEMPLATE}
    cluster.add(
        "TrainingJob", "b", "victim", {**victim, "preemptible": True, "priorityClassName": "low", "checkpoint": ckpt}
    )
    run(cluster, controller)


def pool_spec(tp: int, replicas: int, priority: str) -> dict:
    return {
        "minReplicas": replicas,
        "maxReplicas": max(replicas, 1),
        "tp": tp,
        "gpusPerPod": 4,
        "template": TEMPLATE,
        "priorityClassName": priority,
    }


def held_nodes(controller: Controller) -> set[str]:
    return {n for hold in controller.holds.values() for n in hold.nodes}


def placed_on(cluster: FakeCluster, namespace: str, pool: str) -> set[str]:
    return {n for r in cluster.get("InferencePool", namespace, pool).status.get("placement", []) for n in r["nodes"]}


def test_a_pools_hold_lasts_into_the_next_cycle_for_an_equal_pool_planned_before_it():
    """Pool p2 waits for the victim on 16 nodes (2 of them free); next cycle p1, of equal priority
    but older (so grown first), asks for 4 nodes: it must not take p2's 2 free held nodes (then p2
    would never fit and the victim was evicted for nothing)."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    rack_with_room_for_four_nodes(cluster, controller)
    cluster.add("InferencePool", "c", "p1", pool_spec(16, 0, "serving"))
    cluster.add("InferencePool", "c", "p2", pool_spec(64, 1, "serving"))
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "b", "victim").get("eviction"), "the victim is leaving for p2"
    held = held_nodes(controller)
    assert len(held) == 16
    p1 = cluster.get("InferencePool", "c", "p1")
    cluster.objects[("InferencePool", "c", "p1")] = dataclasses.replace(p1, spec=pool_spec(16, 1, "serving"))
    run(cluster, controller, cycles=1)
    assert "desiredReplicas" in cluster.get("InferencePool", "c", "p1").status, "p1 was reconciled"
    assert not placed_on(cluster, "c", "p1") & held, "p1 took nodes held for p2"


@pytest.mark.parametrize(("priority", "placed"), [("serving", 1), ("low", 0)])
def test_a_pool_takes_a_waiting_jobs_held_nodes_only_if_it_outranks_the_job(priority: str, placed: int):
    """big (high) waits for the victim on 16 nodes, 2 of them free; 2 more are free. A pool of 4
    nodes may use big's free held nodes next cycle only if it outranks big."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    rack_with_room_for_four_nodes(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    cluster.add("InferencePool", "c", "p", pool_spec(16, 1, priority))
    run(cluster, controller, cycles=1)
    assert cluster.get("InferencePool", "c", "p").status["placedReplicas"] == placed


def test_nodes_a_deleted_holder_held_are_free_to_lower_jobs_in_the_same_cycle():
    """big is deleted while it waits: its hold is dropped when admission starts, not at the end of
    the cycle, so a lower job queued after it may use the free nodes big held at once."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    rack_with_room_for_four_nodes(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    del cluster.objects[("TrainingJob", "a", "big")]
    cluster.add("TrainingJob", "c", "four-nodes", rack_job(ep=4, priorityClassName="low"))  # 16 GPUs
    run(cluster, controller, cycles=1)
    assert cluster.status("TrainingJob", "c", "four-nodes")["phase"] == "Admitted"
    check_sound(cluster)


def test_a_pool_grown_in_the_cycle_its_holder_is_deleted_evicts_nothing_for_the_hold():
    """big (high) waits for v1 on rack A and holds it; big is deleted and in that cycle a pool of
    4 nodes (mid) is grown, before admission: rack A's free nodes are everyone's again, so the
    pool goes there and does not evict v2's whole rack B for room it already has."""
    cluster = FakeCluster("nvl72", 2)
    for name, value in (("low", 1), ("mid", 50), ("high", 100)):
        cluster.add_priority_class(name, value)
    controller = Controller(cluster, FixedClock(NOW))
    ckpt = {"gracePeriodSeconds": 300}
    cluster.add("TrainingJob", "b", "v1", rack_job(ep=14, preemptible=True, priorityClassName="low", checkpoint=ckpt))
    run(cluster, controller)
    cluster.add("TrainingJob", "b", "v2", rack_job(ep=18, preemptible=True, priorityClassName="low", checkpoint=ckpt))
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(ep=18, priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    assert cluster.status("TrainingJob", "b", "v1").get("eviction")
    del cluster.objects[("TrainingJob", "a", "big")]
    cluster.add("InferencePool", "c", "p", pool_spec(16, 1, "mid"))
    run(cluster, controller, cycles=1)
    assert not cluster.status("TrainingJob", "b", "v2").get("eviction"), "v2 evicted for a deleted holder's nodes"
    assert cluster.get("InferencePool", "c", "p").status["placedReplicas"] == 1
    check_sound(cluster)


@pytest.mark.parametrize("gone", ["deleted", "suspended"])
def test_a_holder_that_waits_no_more_frees_its_quota_share_for_pools_in_that_cycle(gone: str):
    """big holds all 64 GPUs of a's quota while it waits; deleted or suspended, the pool of its
    namespace grown in the same cycle gets its 16 GPUs (not a false QuotaExceeded)."""
    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "64"})
    rack_with_room_for_four_nodes(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    if gone == "deleted":
        del cluster.objects[("TrainingJob", "a", "big")]
    else:
        big = cluster.get("TrainingJob", "a", "big")
        cluster.objects[("TrainingJob", "a", "big")] = dataclasses.replace(big, spec={**big.spec, "suspend": True})
    cluster.add("InferencePool", "a", "p", pool_spec(16, 1, "low"))
    run(cluster, controller, cycles=1)
    status = cluster.get("InferencePool", "a", "p").status
    assert status["placedReplicas"] == 1, status.get("reason")
    check_sound(cluster)


def test_a_holder_planned_again_counts_its_quota_share_once():
    """big (high) holds 72 of namespace a's 88 GPUs while it waits. The next cycle it is planned
    again: last cycle's share is dropped before the new one is booked, so a low job of a queued
    after it still finds the 16 left (not 72 carried + 72 re-booked)."""
    cluster = FakeCluster("nvl72", 3)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "88"})
    controller = Controller(cluster, FixedClock(NOW))
    rack_with_room_for_four_nodes(cluster, controller)
    cluster.add("TrainingJob", "z", "full", rack_job(ep=18, priorityClassName="serving"))
    cluster.add("TrainingJob", "z", "most", rack_job(ep=14, priorityClassName="serving"))  # 4 nodes free
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(ep=18, priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    cluster.add("TrainingJob", "a", "small", rack_job(ep=4, priorityClassName="low"))  # 16 GPUs
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption", "big held again"
    status = cluster.status("TrainingJob", "a", "small")
    assert status["phase"] == "Admitted", status.get("reason")
    check_sound(cluster)


def test_held_nodes_are_flipped_once_per_priority_band_not_once_per_queued_job(monkeypatch: pytest.MonkeyPatch):
    """big (high) holds the rack's 18 nodes while it waits. 10 low jobs restarting (tried before
    big: recoveries first) and 10 low jobs pending are queued: the held nodes are made unusable
    once for the restarting band, and not at all for queued jobs in reconcile (they place
    nothing there; the pending ones come after big, whose hold is then released). Each job
    opening its own block flipped the 18 nodes for every queued job."""
    from tidal.topology.snapshot import ClusterSnapshot

    cluster = FakeCluster("nvl72", 1)
    controller = Controller(cluster, FixedClock(NOW))
    rack_with_room_for_four_nodes(cluster, controller)
    cluster.add("TrainingJob", "a", "big", rack_job(ep=18, priorityClassName="high"))
    run(cluster, controller, cycles=1)
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    assert len(held_nodes(controller)) == 18
    for i in range(10):
        cluster.add("TrainingJob", "c", f"pending-{i}", rack_job(ep=18, priorityClassName="low"))
        restarting = cluster.add("TrainingJob", "c", f"restarting-{i}", rack_job(ep=18, priorityClassName="low"))
        cluster.objects[("TrainingJob", "c", f"restarting-{i}")] = dataclasses.replace(
            restarting, status={"phase": "Restarting", "pendingSince": "2026-05-01T11:00:00Z"}
        )
    flips: list[str] = []
    update_node = ClusterSnapshot.update_node

    def counted(snapshot: ClusterSnapshot, name: str, **changes: object) -> None:
        if changes == {"cordoned": True} and snapshot is controller.keeper.snapshot:  # an avoiding block opens
            flips.append(name)
        update_node(snapshot, name, **changes)

    monkeypatch.setattr(ClusterSnapshot, "update_node", counted)
    run(cluster, controller, cycles=1)
    monkeypatch.undo()
    assert schedulable(cluster, "TrainingJob", "a", "big") == "WaitingForPreemption"
    assert {
        schedulable(cluster, "TrainingJob", "c", f"{k}-{i}") for k in ("pending", "restarting") for i in range(10)
    } == {"InsufficientFreeCapacity"}
    # One block for the victim's reconcile (placed, being evicted), one for the restarting band.
    assert len(flips) == 2 * 18, f"{len(flips)} held nodes made unusable (18 per block)"
    check_sound(cluster)


def _quota_cluster(racks: int = 2, quota: int = 80) -> tuple[FakeCluster, Controller]:
    cluster = FakeCluster("nvl72", racks)
    cluster.add_priority_class("low", 1)
    cluster.add_priority_class("high", 100)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": str(quota)})
    return cluster, Controller(cluster, FixedClock(NOW))


def test_a_job_over_its_namespaces_quota_preempts_its_namespaces_lower_work_checkpoint_first():
    """Kueue's withinClusterQueue: LowerPriority for a ResourceQuota: a's quota is 80 GPUs and its
    preemptible low job holds 64; a's high job needs 32. The cluster has room, the quota has not:
    the low job is asked to checkpoint and leaves, and the high job runs. Other namespaces' work
    and a's own work of equal priority are never touched for a's quota."""
    cluster, controller = _quota_cluster()
    cluster.add("TrainingJob", "a", "low", rack_job(preemptible=True, priorityClassName="low"))
    cluster.add("TrainingJob", "b", "other", rack_job(preemptible=True, priorityClassName="low", ep=2))
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), "ep": 4, "dp": 2})
    run(cluster, controller, cycles=1)
    eviction = cluster.status("TrainingJob", "a", "low")["eviction"]
    assert (eviction["reason"], eviction["by"]) == ("Preempted", "a/high (priority 100, over the quota of a)")
    assert not cluster.status("TrainingJob", "b", "other").get("eviction"), "another namespace's quota is not a's"
    high = cluster.status("TrainingJob", "a", "high")
    assert high["phase"] == "Pending" and high["reason"].startswith("waiting for 1 preempted job(s)"), high
    assert not cluster.pods_of("tidal.dev/job", "high"), "nothing made while the quota is still in use"
    run(cluster, controller, cycles=2)
    assert cluster.status("TrainingJob", "a", "low").get("eviction"), "the same eviction, not a second one"
    cluster.annotate("TrainingJob", "a", "low", {"tidal.dev/checkpoint-done": eviction["requestedAt"]})
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "a", "high")["phase"] == "Running"
    low = cluster.status("TrainingJob", "a", "low")
    cond = {c["type"]: c for c in low["conditions"]}["Schedulable"]
    assert (low["phase"], cond["reason"]) == ("Pending", "QuotaExceeded"), low
    assert cluster.status("TrainingJob", "b", "other")["phase"] == "Running"
    check_sound(cluster)


def test_a_job_over_its_quota_shrinks_an_elastic_job_of_its_namespace_by_what_is_missing_only():
    """The low job is elastic, 4 DP replicas of 16 GPUs: the high job is short of 16 GPUs of quota,
    so one replica goes, not the whole job (64 GPUs)."""
    cluster, controller = _quota_cluster()
    elastic = {"minDP": 1, "maxDP": 4}
    low = {**rack_job(preemptible=True, priorityClassName="low"), "ep": 4, "dp": 4, "elastic": elastic}
    cluster.add("TrainingJob", "a", "low", low)
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), "ep": 4, "dp": 2})
    run(cluster, controller, cycles=1)
    eviction = cluster.status("TrainingJob", "a", "low")["eviction"]
    assert eviction["replicas"] == [3], eviction
    cluster.annotate("TrainingJob", "a", "low", {"tidal.dev/checkpoint-done": eviction["requestedAt"]})
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "a", "high")["phase"] == "Running"
    assert cluster.status("TrainingJob", "a", "low")["currentDP"] == 3
    check_sound(cluster)


@pytest.mark.parametrize("why", ["equal priority", "not preemptible", "no room in the cluster even then"])
def test_nothing_is_evicted_for_a_quota_when_it_would_not_make_the_job_fit_or_may_not(why: str):
    racks = 1 if why == "no room in the cluster even then" else 2
    cluster, controller = _quota_cluster(racks=racks)
    low = rack_job(preemptible=why != "not preemptible", priorityClassName="high" if why == "equal priority" else "low")
    cluster.add("TrainingJob", "a", "low", low)
    run(cluster, controller)
    if racks == 1:  # the rest of the only rack goes to another namespace's work that may not be preempted
        cluster.add("TrainingJob", "b", "fill", {**rack_job(), "ep": 2})
        run(cluster, controller)
    size = {"ep": 4, "dp": 2} if racks == 2 else {"ep": 9, "dp": 2}  # 32 GPUs; 72 on one rack
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "80" if racks == 2 else "100"})
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), **size})
    run(cluster, controller, cycles=2)
    assert not cluster.status("TrainingJob", "a", "low").get("eviction"), why
    high = cluster.status("TrainingJob", "a", "high")
    cond = {c["type"]: c for c in high["conditions"]}["Schedulable"]
    assert (high["phase"], cond["reason"]) == ("Pending", "QuotaExceeded"), (why, high)


def _quota_used(cluster: FakeCluster, gpus: int, hard: int = 80) -> None:
    """The quota's status.used as the API server's quota controller reports it (it may lag)."""
    body = {
        "metadata": {"namespace": "a", "name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(hard)}},
        "status": {"used": {"requests.nvidia.com/gpu": str(gpus)}},
    }
    cluster.quotas[("a", "gpus")] = quota_view(body)


def test_a_victims_pods_still_counted_by_the_quota_evict_nobody_else_and_the_job_keeps_its_nodes():
    """a's quota is 80; low1 and low2 hold 32 each; high needs 32, so low1 goes. In the cycles
    after low1 has left, the quota's status.used still counts its pods (they terminate; the quota
    controller lags): that is not a reason to evict low2 as well, nor to give up the nodes high
    holds, which another namespace's job queued meanwhile would take."""
    cluster, controller = _quota_cluster(racks=1)
    slow = {"spec": {**TEMPLATE["spec"], "terminationGracePeriodSeconds": 300}}  # counted up to ~10 min
    half = {"ep": 8, "priorityClassName": "low", "preemptible": True, "template": slow}
    cluster.add("TrainingJob", "a", "low1", {**rack_job(), **half})
    cluster.add("TrainingJob", "a", "low2", {**rack_job(), **half})
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), "ep": 8})
    run(cluster, controller, cycles=1)
    evicted = [j for j in ("low1", "low2") if cluster.status("TrainingJob", "a", j).get("eviction")]
    assert len(evicted) == 1, evicted
    kept = "low2" if evicted == ["low1"] else "low1"
    _quota_used(cluster, 64)
    cluster.add("TrainingJob", "b", "other", {**rack_job(), "ep": 4})  # 16: fits only on what high holds
    requested = cluster.status("TrainingJob", "a", evicted[0])["eviction"]["requestedAt"]
    cluster.annotate("TrainingJob", "a", evicted[0], {"tidal.dev/checkpoint-done": requested})
    run(cluster, controller, cycles=2)
    controller.clock.advance(seconds=240)  # its pods' grace period is 300 s: still counted
    run(cluster, controller, cycles=2)
    assert not cluster.status("TrainingJob", "a", kept).get("eviction"), "nobody else evicted"
    assert cluster.status("TrainingJob", "a", kept)["phase"] == "Running"
    high = cluster.status("TrainingJob", "a", "high")
    cond = {c["type"]: c for c in high["conditions"]}["Schedulable"]
    assert (high["phase"], cond["reason"]) == ("Pending", "WaitingForPreemption"), high
    assert cluster.status("TrainingJob", "b", "other")["phase"] == "Pending", "high's nodes stay held"
    _quota_used(cluster, 32)  # the quota controller caught up
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "a", "high")["phase"] == "Running"
    check_sound(cluster)


def test_a_quota_that_is_not_short_does_not_keep_a_victim_from_being_counted():
    """An overall cap of 80 and a cap of 200 on class high: only the first is short, and low's
    GPUs count under it, so low is evicted (a victim need not count under a quota with room)."""
    cluster, controller = _quota_cluster()
    scope = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}
    cluster.add_quota("a", "high-gpus", {"requests.nvidia.com/gpu": "200"}, scopeSelector=scope)
    cluster.add("TrainingJob", "a", "low", rack_job(preemptible=True, priorityClassName="low"))
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), "ep": 4, "dp": 2})
    run(cluster, controller, cycles=1)
    assert (cluster.status("TrainingJob", "a", "low").get("eviction") or {}).get("reason") == "Preempted"


def test_quota_victims_whose_gpus_the_job_needs_in_a_full_cluster_are_planned_as_freed():
    """One rack, full: a's low job (64) and b's job (8, not preemptible). a's high job (32) is
    over a's quota and finds no room: only low's GPUs, freed for the quota, make room for it."""
    cluster, controller = _quota_cluster(racks=1)
    cluster.add("TrainingJob", "a", "low", rack_job(preemptible=True, priorityClassName="low"))
    cluster.add("TrainingJob", "b", "fill", {**rack_job(), "ep": 2})
    run(cluster, controller)
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), "ep": 4, "dp": 2})
    run(cluster, controller, cycles=1)
    assert (cluster.status("TrainingJob", "a", "low").get("eviction") or {}).get("reason") == "Preempted"
    assert not cluster.status("TrainingJob", "b", "fill").get("eviction")


def test_a_quota_lowered_below_its_use_is_short_by_all_of_it_evicted_in_one_round():
    """a's four low jobs hold 128 GPUs; the quota is then lowered to 64. high (32) is short by 96,
    not by the 32 a room floored at 0 would say: three victims go in one round, not one per
    checkpoint round."""
    cluster, controller = _quota_cluster(quota=200)
    for i in range(4):
        cluster.add("TrainingJob", "a", f"low{i}", {**rack_job(preemptible=True, priorityClassName="low"), "ep": 8})
    run(cluster, controller)
    cluster.add_quota("a", "gpus", {"requests.nvidia.com/gpu": "64"})
    cluster.add("TrainingJob", "a", "high", {**rack_job(priorityClassName="high"), "ep": 8})
    run(cluster, controller, cycles=1)
    evicted = [i for i in range(4) if cluster.status("TrainingJob", "a", f"low{i}").get("eviction")]
    assert len(evicted) == 3, evicted
    run(cluster, controller, cycles=2)
    assert len([i for i in range(4) if cluster.status("TrainingJob", "a", f"low{i}").get("eviction")]) == 3


def test_the_shortfall_subtracts_leaving_gpus_only_under_the_quotas_whose_scope_counts_them():
    """An overall cap of 64 and a cap of 48 on class high, with a high job of 32 and a low one
    of 32 in use. A victim of class low leaving for a high job of 32 frees room under the overall
    cap, not under the class-high cap: that one is still short by 16."""
    scope = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}
    quotas = [
        quota_view(
            {"metadata": {"namespace": "a", "name": "all"}, "spec": {"hard": {"requests.nvidia.com/gpu": "64"}}}
        ),
        quota_view(
            {
                "metadata": {"namespace": "a", "name": "high"},
                "spec": {"hard": {"requests.nvidia.com/gpu": "48"}, "scopeSelector": scope},
            }
        ),
    ]
    held = [("a", "nvidia.com/gpu", 32, "high"), ("a", "nvidia.com/gpu", 32, "low")]
    book = Quotas.build(quotas, held, class_of=lambda v: v.spec.get("priorityClassName"))
    job = ResourceView(
        "TrainingJob", "a", "j", "uid-j", 1, NOW.isoformat(), {"priorityClassName": "high"}, {}, {}, "1", deleting=False
    )
    deficit, _ = book.shortfall(job, 32, leaving=Counter({"low": 32}))
    assert deficit == 16
    deficit, _ = book.shortfall(job, 32, leaving=Counter({"high": 32}))
    assert deficit == 0
