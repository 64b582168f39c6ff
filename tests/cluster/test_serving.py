"""Serving on the KWOK cluster: a real HorizontalPodAutoscaler drives an InferencePool through its
scale subresource, and the pool's Service routes to the leader pods of its running replicas.

There is no metrics-server here. The HPA controller (kube-controller-manager's
horizontal-pod-autoscaler controller) still scales without metrics at its bounds: a target whose
replicas are below the HPA's minReplicas is set to minReplicas, one above maxReplicas to
maxReplicas, before any metric is read (pkg/controller/podautoscaler/horizontal.go). Moving the
HPA's bounds therefore moves the pool, through the same /scale calls a metric-driven HPA makes.
"""

from __future__ import annotations

import json
import time

import pytest

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import submit
from .test_tide import pool, pool_status, scrape, set_clock

SERVER = {
    "spec": {
        "containers": [
            {
                "name": "server",
                "image": "vllm:latest",
                "ports": [{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 9090}],
            }
        ]
    }
}
LEADERS = "tidal.dev/role=leader"


@pytest.fixture
def controlled_clock(running_operator: OperatorProcess):
    yield running_operator
    running_operator.clock_file.unlink(missing_ok=True)


def spec_of(kube: Kube, namespace: str, name: str) -> dict:
    return kube.get("inferencepools.tidal.dev", name, "-n", namespace)["spec"]


def scale_of(kube: Kube, namespace: str, name: str) -> dict:
    path = f"/apis/tidal.dev/v1alpha1/namespaces/{namespace}/inferencepools/{name}/scale"
    return json.loads(kube.run("get", "--raw", path).stdout)


def hpa(name: str, target: str, min_replicas: int, max_replicas: int) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "tidal.dev/v1alpha1", "kind": "InferencePool", "name": target},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}},
                }
            ],
        },
    }


def set_hpa_bounds(kube: Kube, namespace: str, name: str, min_replicas: int, max_replicas: int) -> None:
    patch = json.dumps({"spec": {"minReplicas": min_replicas, "maxReplicas": max_replicas}})
    kube.run("patch", "-n", namespace, "hpa", name, "--type=merge", "-p", patch)


def wait_pool(kube: Kube, namespace: str, name: str, *, requested: int, desired: int, timeout: float = 90) -> dict:
    """Until spec.replicas is `requested` and `desired` replicas are placed and ready."""

    def settled():
        st = pool_status(kube, namespace, name)
        ok = (
            spec_of(kube, namespace, name).get("replicas") == requested
            and st.get("desiredReplicas") == desired
            and st.get("replicas") == desired
            and st.get("readyReplicas") == desired
        )
        return ok and st

    return eventually(settled, timeout=timeout, what=f"{name}: spec.replicas={requested}, {desired} ready")


def hpa_condition(kube: Kube, namespace: str, name: str, kind: str) -> dict:
    conditions = kube.get("hpa", name, "-n", namespace).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_an_hpa_drives_the_pool_through_the_scale_subresource(
    kube: Kube, controlled_clock: OperatorProcess, namespace: str
):
    op = controlled_clock
    set_clock(op, "06:00")
    day = {"timezone": "UTC", "windows": [{"start": "08:00", "end": "20:00", "minReplicas": 3}]}
    # spec.replicas starts at 1: an HPA leaves alone a target whose replicas are 0.
    submit(kube, namespace, pool("chat", minReplicas=0, maxReplicas=4, replicas=1, schedule=day, template=SERVER))
    wait_pool(kube, namespace, "chat", requested=1, desired=1)
    scale = scale_of(kube, namespace, "chat")
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 1 and scale["status"]["replicas"] == 1
    assert scale["status"]["selector"] == "tidal.dev/pool=chat,tidal.dev/role=leader"
    # The selector names one pod per replica (its leader), as an HPA counts pods as replicas.
    selected = kube.get("pods", "-n", namespace, "-l", scale["status"]["selector"])["items"]
    assert [p["metadata"]["name"] for p in selected] == ["chat-0-0"]
    assert len(kube.get("pods", "-n", namespace, "-l", "tidal.dev/pool=chat")["items"]) == 2

    submit(kube, namespace, hpa("chat", "chat", 2, 4))
    wait_pool(kube, namespace, "chat", requested=2, desired=2, timeout=120)
    able = eventually(lambda: hpa_condition(kube, namespace, "chat", "AbleToScale"), what="AbleToScale")
    assert able["status"] == "True", able

    set_hpa_bounds(kube, namespace, "chat", 3, 4)
    wait_pool(kube, namespace, "chat", requested=3, desired=3)
    assert len(kube.get("pods", "-n", namespace, "-l", "tidal.dev/pool=chat")["items"]) == 6
    # Within its bounds the HPA reads CPU for the pods status.selector names: it parses the selector
    # and lists those pods, then finds no metrics API (no metrics-server here). A selector it could
    # not use would say InvalidSelector or FailedGetScale instead.
    active = eventually(
        lambda: (c := hpa_condition(kube, namespace, "chat", "ScalingActive")).get("reason") and c,
        timeout=90,
        what="the HPA to try the metric path",
    )
    assert active["reason"] == "FailedGetResourceMetric", active

    # The pool's maxReplicas bounds what the HPA asks for.
    set_hpa_bounds(kube, namespace, "chat", 6, 6)
    st = wait_pool(kube, namespace, "chat", requested=6, desired=4)
    assert "bounded to 4" in st["reason"], st["reason"]
    assert scale_of(kube, namespace, "chat")["status"]["replicas"] == 4

    # The HPA asks for 1; by day the schedule's floor of 3 holds it up...
    set_hpa_bounds(kube, namespace, "chat", 1, 1)
    eventually(lambda: spec_of(kube, namespace, "chat").get("replicas") == 1, timeout=90, what="HPA sets 1")
    set_clock(op, "12:00")  # hours later: past the stabilization window of the 4 before
    st = wait_pool(kube, namespace, "chat", requested=1, desired=3)
    assert st["floor"] == 3 and st["reason"].startswith("window 08:00-20:00"), st
    # ...and at night the pool follows the HPA down to 1.
    set_clock(op, "21:00")
    wait_pool(kube, namespace, "chat", requested=1, desired=1)
    assert able["status"] == hpa_condition(kube, namespace, "chat", "AbleToScale")["status"] == "True"

    # Without the HPA, kubectl scale writes the same field.
    kube.delete("hpa", "chat", "-n", namespace)
    eventually(lambda: not kube.get("hpa", "-n", namespace)["items"], timeout=30, what="HPA gone")
    out = kube.run("scale", "-n", namespace, "inferencepools.tidal.dev/chat", "--replicas=2").stdout
    assert "scaled" in out, out
    wait_pool(kube, namespace, "chat", requested=2, desired=2)


def endpoints(kube: Kube, namespace: str, service: str) -> tuple[set[str], set[str], set[int]]:
    """(ready pod names, all pod names, ports) over the Service's EndpointSlices."""
    slices = kube.get("endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}")["items"]
    ready, every, ports = set(), set(), set()
    for s in slices:
        ports |= {p["port"] for p in s.get("ports") or []}
        for e in s.get("endpoints") or []:
            name = e["targetRef"]["name"]
            every.add(name)
            if e.get("conditions", {}).get("ready"):
                ready.add(name)
    return ready, every, ports


def service_calls(op: OperatorProcess) -> dict[str, float]:
    """The operator's Service requests so far, by verb (from its tidal_api_requests gauge)."""
    metrics = scrape(op)
    verbs = ("get_service", "create_service", "update_service")
    return {v: metrics.get(("tidal_api_requests", (("verb", v),)), 0.0) for v in verbs}


def running_leaders(kube: Kube, namespace: str, name: str) -> set[str]:
    pods = kube.get("pods", "-n", namespace, "-l", f"tidal.dev/pool={name},{LEADERS}")["items"]
    return {p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"}


def test_the_pool_service_routes_to_ready_leaders_only(kube: Kube, controlled_clock: OperatorProcess, namespace: str):
    set_clock(controlled_clock, "06:00")
    # Two pods per replica (tp=8, 4 GPUs a pod): only pod 0 of each serves.
    # A sidecar asking for more CPU than any node has: tidal books GPUs only, so it places the
    # replica, and kube-scheduler never binds it (a nodeSelector, the easier way, is refused).
    hog = {"name": "hog", "image": "x", "resources": {"requests": {"cpu": "100000"}}}
    stuck_template = {"spec": {**SERVER["spec"], "containers": [*SERVER["spec"]["containers"], hog]}}
    submit(
        kube,
        namespace,
        pool("serve", minReplicas=3, maxReplicas=3, template=SERVER),
        # Placed by tidal but never schedulable by kube-scheduler: its pods stay Pending.
        pool("stuck", minReplicas=1, maxReplicas=1, template=stuck_template),
    )
    eventually(lambda: pool_status(kube, namespace, "serve").get("readyReplicas") == 3, timeout=90, what="3 ready")
    uid = kube.get("inferencepools.tidal.dev", "serve", "-n", namespace)["metadata"]["uid"]
    # Made without spec.replicas: the schema defaults it to 0, so /scale answers (the API server
    # fails a /scale read with a 500 when the field is missing); a Scale's JSON omits a zero.
    assert spec_of(kube, namespace, "serve")["replicas"] == 0
    assert scale_of(kube, namespace, "serve")["spec"].get("replicas", 0) == 0

    svc = eventually(lambda: kube.get("services", "-n", namespace, "serve"), what="the pool's Service")
    assert svc["spec"]["selector"] == {"tidal.dev/pool": "serve", "tidal.dev/role": "leader"}
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http", 8000, 8000),
        ("metrics", 9090, 9090),
    ]
    assert not svc["spec"].get("publishNotReadyAddresses")
    assert svc["spec"]["type"] == "ClusterIP"
    (owner,) = svc["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("InferencePool", "serve", uid, True)

    leaders = {"serve-0-0", "serve-1-0", "serve-2-0"}
    assert running_leaders(kube, namespace, "serve") == leaders

    def routed():
        ready, every, ports = endpoints(kube, namespace, "serve")
        return ready == leaders and every == leaders and ports == {8000, 9090} and (ready, every, ports)

    eventually(routed, timeout=60, what="EndpointSlices list the three leaders")

    # A Running leader that stops being Ready (its readiness probe failing) gets no traffic.
    def set_ready(pod: str, ready: str) -> None:
        patch = json.dumps({"status": {"conditions": [{"type": "Ready", "status": ready}]}})
        kube.run("patch", "-n", namespace, "pod", pod, "--subresource=status", "--type=strategic", "-p", patch)

    set_ready("serve-1-0", "False")
    eventually(
        lambda: endpoints(kube, namespace, "serve")[0] == leaders - {"serve-1-0"},
        timeout=60,
        what="the not-ready leader out of the ready endpoints",
    )
    set_ready("serve-1-0", "True")
    eventually(routed, timeout=60, what="the leader back once Ready again")

    # The stuck pool has its Service too, and nothing to route to.
    eventually(lambda: kube.get("services", "-n", namespace, "stuck"), what="the stuck pool's Service")
    assert pool_status(kube, namespace, "stuck").get("placedReplicas") == 1
    assert pool_status(kube, namespace, "stuck").get("readyReplicas") == 0
    assert not running_leaders(kube, namespace, "stuck")
    assert endpoints(kube, namespace, "stuck")[0] == set()

    # Idempotent: the pool changes (an annotation), cycles go on, and the Service is not written
    # nor read each cycle (the API server drops a no-op PUT without a new resourceVersion, so the
    # operator's own request counts are the evidence).
    version = kube.get("services", "-n", namespace, "serve")["metadata"]["resourceVersion"]
    before = service_calls(controlled_clock)
    kube.run("annotate", "-n", namespace, "inferencepools.tidal.dev", "serve", "example.com/touched=1")
    time.sleep(5)
    during = service_calls(controlled_clock)
    assert during["update_service"] == before["update_service"], (before, during)
    assert during["create_service"] == before["create_service"], (before, during)
    # A resync (every 300 s) re-reads each pool's Service once; a read per cycle would be >= 10.
    assert during["get_service"] - before["get_service"] <= 2, (before, during)
    assert kube.get("services", "-n", namespace, "serve")["metadata"]["resourceVersion"] == version

    # A leader without its role label (as an operator before the label made it) gets it back.
    kube.run("label", "-n", namespace, "pod", "serve-0-0", "tidal.dev/role-")
    eventually(
        lambda: kube.get("pod", "serve-0-0", "-n", namespace)["metadata"]["labels"].get("tidal.dev/role") == "leader",
        timeout=30,
        what="the role label put back",
    )
    eventually(routed, timeout=60, what="the relabelled leader routed again")

    # A replica removed: its leader leaves the EndpointSlices.
    patch = json.dumps({"spec": {"minReplicas": 2, "maxReplicas": 2}})
    kube.run("patch", "-n", namespace, "inferencepools.tidal.dev", "serve", "--type=merge", "-p", patch)
    set_clock(controlled_clock, "07:00")  # past the scale-down stabilization window
    eventually(lambda: pool_status(kube, namespace, "serve").get("placedReplicas") == 2, timeout=60, what="2 left")

    def two_routed():
        ready, every, _ = endpoints(kube, namespace, "serve")
        live = running_leaders(kube, namespace, "serve")
        return len(ready) == 2 and ready == every == live and ready < leaders and ready

    eventually(two_routed, timeout=60, what="EndpointSlices down to the two remaining leaders")

    # The template's ports change: the Service follows (updated in place, same ClusterIP).
    template = {
        "spec": {
            "containers": [{**SERVER["spec"]["containers"][0], "ports": [{"name": "http", "containerPort": 8080}]}]
        }
    }
    kube.run(
        "patch",
        "-n",
        namespace,
        "inferencepools.tidal.dev",
        "serve",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"template": template}}),
    )

    def follows():
        now = kube.get("services", "-n", namespace, "serve")
        return [(p["name"], p["port"]) for p in now["spec"]["ports"]] == [("http", 8080)] and now

    updated = eventually(follows, timeout=30, what="the Service's port follows the template")
    assert updated["spec"]["clusterIP"] == svc["spec"]["clusterIP"]
    after = service_calls(controlled_clock)
    assert after["update_service"] == before["update_service"] + 1, (before, after)

    # Deleted with its pool (garbage collector, through the owner reference).
    kube.delete("inferencepools.tidal.dev", "serve", "-n", namespace)
    eventually(
        lambda: not kube.get("services", "-n", namespace, "--field-selector=metadata.name=serve")["items"],
        timeout=60,
        what="the Service deleted with its pool",
    )
