"""Serving: spec.replicas (the scale subresource) in the desired count, leader labels, the pool's
Service (made once, written again only when it drifted), and the CRD's scale subresource."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.k8s.manifests import pool_service, service_update, serving_ports
from tidal.model.crd import RESOURCE_KINDS, crd_for
from tidal.rebalance import desired_replicas

from .fake_cluster import FakeCluster

NOON = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
DAY = {"timezone": "UTC", "windows": [{"start": "08:00", "end": "20:00", "minReplicas": 4}]}
SERVER = {
    "spec": {
        "containers": [
            {"name": "vllm", "image": "vllm:latest", "ports": [{"name": "http", "containerPort": 8000}]},
            {"name": "sidecar", "image": "metrics:latest", "ports": [{"name": "metrics", "containerPort": 9090}]},
        ]
    }
}


# -- desired = clamp(max(floor, spec.replicas, load), min, max) -------------------------------------


def test_requested_replicas_raise_the_pool_above_its_floor():
    spec = {"minReplicas": 1, "maxReplicas": 10, "schedule": DAY, "replicas": 6}
    assert desired_replicas(spec, NOON, None) == (6, "spec.replicas 6 (autoscaler or kubectl scale)")


def test_the_schedule_floor_holds_against_a_smaller_request():
    spec = {"minReplicas": 1, "maxReplicas": 10, "schedule": DAY, "replicas": 2}
    assert desired_replicas(spec, NOON, None) == (4, "window 08:00-20:00 UTC")
    night = NOON.replace(hour=22)
    assert desired_replicas(spec, night, None)[0] == 2, "outside the window the request is all there is"


def test_max_replicas_bounds_a_request():
    spec = {"minReplicas": 0, "maxReplicas": 3, "replicas": 9}
    assert desired_replicas(spec, NOON, None) == (3, "spec.replicas 9 (autoscaler or kubectl scale) (bounded to 3)")


def test_min_replicas_bounds_a_request_of_zero():
    assert desired_replicas({"minReplicas": 2, "maxReplicas": 5, "replicas": 0}, NOON, None)[0] == 2


def test_the_larger_of_request_and_load_wins():
    spec = {"minReplicas": 0, "maxReplicas": 50, "replicas": 5, "load": {"targetPerReplica": 10}}
    assert desired_replicas(spec, NOON, 95) == (10, "load 95 req/s / 10 per replica")
    assert desired_replicas(spec, NOON, 12)[0] == 5, "an autoscaler's request is not undercut by low load"
    assert desired_replicas(spec, NOON, None)[0] == 5, "no load reading: the request alone"


def test_without_a_request_nothing_changes():
    spec = {"minReplicas": 1, "maxReplicas": 50, "schedule": DAY, "load": {"targetPerReplica": 10}}
    assert desired_replicas(spec, NOON, 95)[0] == 10
    assert desired_replicas(spec, NOON, 5)[0] == 4
    # spec.replicas defaults to 0 in the CRD (the API server serves /scale only with the field set).
    assert desired_replicas({**spec, "replicas": 0}, NOON, 5) == desired_replicas(spec, NOON, 5)
    assert desired_replicas({"minReplicas": 0, "maxReplicas": 5, "replicas": 0}, NOON, None)[0] == 0


def test_spec_replicas_defaults_to_zero_in_the_crd():
    (pool_kind,) = [k for k in RESOURCE_KINDS if k.kind == "InferencePool"]
    schema = crd_for(pool_kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["replicas"]["default"] == 0


# -- the CRD ------------------------------------------------------------------------------------


def test_inference_pools_have_a_scale_subresource_and_the_others_do_not():
    subresources = {k.kind: crd_for(k)["spec"]["versions"][0]["subresources"] for k in RESOURCE_KINDS}
    assert subresources["InferencePool"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "scale" not in subresources["TrainingJob"] and "scale" not in subresources["Supernode"]


# -- the Service's shape ------------------------------------------------------------------------


def test_service_ports_come_from_every_containers_declared_ports():
    assert serving_ports(SERVER) == [
        {"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"},
        {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"},
    ]
    unnamed = {"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 30000, "protocol": "UDP"}]}]}}
    assert serving_ports(unnamed) == [{"name": "udp-30000", "port": 30000, "targetPort": 30000, "protocol": "UDP"}]
    twice = {"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80}, {"containerPort": 80}]}]}}
    assert len(serving_ports(twice)) == 1


def test_no_declared_port_no_service():
    assert pool_service("chat", "ns", "uid-1", {"spec": {"containers": [{"name": "a", "image": "x"}]}}) is None


def test_service_selects_leaders_only_and_publishes_ready_pods_only():
    svc = pool_service("chat", "ns", "uid-1", SERVER)
    assert svc["spec"]["selector"] == {"tidal.dev/pool": "chat", "tidal.dev/role": "leader"}
    assert svc["spec"]["publishNotReadyAddresses"] is False
    (owner,) = svc["metadata"]["ownerReferences"]
    assert owner["kind"] == "InferencePool" and owner["uid"] == "uid-1" and owner["controller"] is True


def test_service_update_keeps_what_the_api_server_and_users_set():
    desired = pool_service("chat", "ns", "uid-1", SERVER)
    as_read = {
        **desired,
        "metadata": {**desired["metadata"], "resourceVersion": "7", "annotations": {"team": "x"}},
        "spec": {
            **desired["spec"],
            "clusterIP": "10.96.3.4",
            "type": "NodePort",
            "sessionAffinity": "None",
            "ports": [{**p, "nodePort": 30000 + i} for i, p in enumerate(desired["spec"]["ports"])],
        },
    }
    assert service_update(as_read, desired) is None, "defaults and extra fields are no difference"
    drifted = {**as_read, "spec": {**as_read["spec"], "selector": {"app": "other"}}}
    fixed = service_update(drifted, desired)
    assert fixed["spec"]["selector"] == desired["spec"]["selector"]
    assert fixed["spec"]["clusterIP"] == "10.96.3.4" and fixed["spec"]["type"] == "NodePort"
    assert [p["nodePort"] for p in fixed["spec"]["ports"]] == [30000, 30001]
    assert fixed["metadata"]["resourceVersion"] == "7" and fixed["metadata"]["annotations"] == {"team": "x"}
    assert service_update(fixed, desired) is None


# -- the controller: leader labels, status fields, Service written only when it changed -----------


def _pool_cluster(**spec) -> tuple[FakeCluster, Controller]:
    cluster = FakeCluster("nvl72", 2)
    body = {"minReplicas": 2, "maxReplicas": 4, "tp": 8, "gpusPerPod": 4, "template": SERVER, **spec}
    cluster.add("InferencePool", "ns", "chat", body)
    return cluster, Controller(cluster, FixedClock(NOON))


def test_leader_labels_status_selector_and_replicas():
    cluster, controller = _pool_cluster(replicas=3)
    for _ in range(3):
        controller.cycle(cluster.state())
    status = cluster.status("InferencePool", "ns", "chat")
    assert status["desiredReplicas"] == 3 and status["replicas"] == 3
    assert status["selector"] == "tidal.dev/pool=chat,tidal.dev/role=leader"
    roles = {p["metadata"]["name"]: p["metadata"]["labels"]["tidal.dev/role"] for p in cluster.pods.values()}
    assert roles == {f"chat-{r}-{i}": "leader" if i == 0 else "worker" for r in range(3) for i in range(2)}


def test_pods_made_before_the_role_label_get_it_once():
    cluster, controller = _pool_cluster(replicas=3)
    for _ in range(3):
        controller.cycle(cluster.state())
    assert cluster.requests["label_pod"] == 0, "new pods are made with their role"
    for pod in cluster.pods.values():  # as an older operator made them
        del pod["metadata"]["labels"]["tidal.dev/role"]
    for _ in range(3):
        controller.cycle(cluster.state())
    assert cluster.requests["label_pod"] == 6, "each pod labelled once"
    roles = {p["metadata"]["name"]: p["metadata"]["labels"]["tidal.dev/role"] for p in cluster.pods.values()}
    assert roles == {f"chat-{r}-{i}": "leader" if i == 0 else "worker" for r in range(3) for i in range(2)}
    assert cluster.requests["create_pod"] == 6 and cluster.requests["delete_pod"] == 0, "no replica re-made"


def test_the_service_is_made_once_and_written_again_only_after_it_drifted():
    cluster, controller = _pool_cluster()
    for _ in range(5):
        controller.cycle(cluster.state())
    assert cluster.requests["create_service"] == 1
    assert cluster.requests["get_service"] == 1, "an unchanged Service is not even read every cycle"
    assert cluster.requests["update_service"] == 0
    key = ("ns", "chat")
    assert cluster.services[key]["spec"]["selector"] == {"tidal.dev/pool": "chat", "tidal.dev/role": "leader"}

    # A resync reads it again: unchanged, so no write.
    assert controller.resync_due()
    controller.cycle(cluster.state())
    assert cluster.requests["get_service"] == 2 and cluster.requests["update_service"] == 0

    # Someone edits the selector; the next resync puts it back.
    svc = cluster.services[key]
    cluster.services[key] = {**svc, "spec": {**svc["spec"], "selector": {"app": "else"}}}
    controller._next_resync = 0.0
    assert controller.resync_due()
    controller.cycle(cluster.state())
    assert cluster.requests["update_service"] == 1
    assert cluster.services[key]["spec"]["selector"]["tidal.dev/role"] == "leader"

    # The template's ports change: written at once, without waiting for a resync.
    view = cluster.get("InferencePool", "ns", "chat")
    template = {"spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8080}]}]}}
    cluster.objects[("InferencePool", "ns", "chat")] = replace(view, spec={**view.spec, "template": template})
    controller.cycle(cluster.state())
    assert cluster.requests["update_service"] == 2
    assert [p["port"] for p in cluster.services[key]["spec"]["ports"]] == [8080]


def test_a_service_name_taken_by_another_owner_is_left_alone():
    cluster, controller = _pool_cluster()
    theirs = {
        "metadata": {
            "name": "chat",
            "namespace": "ns",
            "ownerReferences": [{"kind": "TrainingJob", "name": "chat", "uid": "someone-else", "controller": True}],
        },
        "spec": {"clusterIP": "None", "selector": {"tidal.dev/job": "chat"}},
    }
    cluster.services[("ns", "chat")] = theirs
    for _ in range(3):
        controller.cycle(cluster.state())
    assert cluster.services[("ns", "chat")] is theirs
    assert cluster.requests["get_service"] == 1, "a taken name is not read every cycle"
    assert cluster.requests["update_service"] == 0

    # Their Service goes (say, the garbage collector took a deleted pool's): ours follows once the
    # retry interval is over, without waiting for a resync.
    del cluster.services[("ns", "chat")]
    controller.cycle(cluster.state())
    assert ("ns", "chat") not in cluster.services, "not before the retry interval"
    controller.service_conflicts[("ns", "chat")] = 0.0  # as if the interval had passed
    controller.cycle(cluster.state())
    assert cluster.services[("ns", "chat")]["spec"]["selector"]["tidal.dev/role"] == "leader"
    assert cluster.requests["create_service"] == 1
