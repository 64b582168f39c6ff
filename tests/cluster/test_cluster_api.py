"""The generated CRDs on a real API server, and a GPU pod bound by the real kube-scheduler."""

from __future__ import annotations

import json

import pytest
import yaml

from tidal.k8s import api as tidal_api
from tidal.k8s.api import Api, load_client

from .kube import REPO, Kube, eventually

TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
MAIN = {"name": "main", "image": "busybox"}
SIDECAR = {"name": "sidecar", "image": "busybox"}
GPU_LIMIT = {"limits": {"nvidia.com/gpu": 1}}
GPU_REQUEST = {"requests": {"nvidia.com/gpu": "1"}}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def prometheus_load(prometheus: dict) -> dict:
    return {"targetPerReplica": 10, "source": "Prometheus", "prometheus": prometheus}


def pod_spec(**fields) -> dict:
    return {"spec": {"containers": [MAIN], **fields}}


def training_job(name: str, **spec) -> dict:
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"tp": 4, "ep": 2, "pp": 2, "dp": 2, "gpusPerPod": 4, "template": TEMPLATE, **spec},
    }


def inference_pool(name: str, **spec) -> dict:
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {"minReplicas": 1, "maxReplicas": 4, "tp": 4, "gpusPerPod": 4, "template": TEMPLATE, **spec},
    }


def test_crds_are_established(kube: Kube):
    names = [
        doc["metadata"]["name"]
        for path in sorted((REPO / "crds").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]
    assert len(names) == 5
    for name in names:
        crd = kube.get("crd", name)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", name
        assert conditions.get("NamesAccepted") == "True", name


def test_valid_objects_of_each_kind_are_accepted_with_defaults(kube: Kube, namespace: str):
    kube.run(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump_all([training_job("ok-job", elastic={"minDP": 1, "maxDP": 4}), inference_pool("ok-pool")]),
    )
    # What the template may still say: sidecars without GPUs, GPUs on the first container (tidal
    # overwrites the count), preferred node affinity, tolerations, pod labels.
    allowed = pod_spec(
        containers=[{**MAIN, "resources": GPU_LIMIT}, {**SIDECAR, "resources": {"limits": {"cpu": "1"}}}],
        initContainers=[{"name": "init", "image": "busybox"}],
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        tolerations=[{"key": "gpu", "operator": "Exists"}],
        # Empty values of refused fields, as Helm charts render them by default.
        nodeSelector={},
        schedulingGates=[],
        nodeName="",
        resourceClaims=[],
    )
    kube.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(training_job("ok-template", template=allowed)))
    named = inference_pool("ok-load", load=prometheus_load({"server": "main", "query": "sum(rate(x[1m]))"}))
    kube.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(named))
    kept = kube.get("trainingjob", "ok-template", "-n", namespace)["spec"]["template"]["spec"]
    assert kept["tolerations"] == allowed["spec"]["tolerations"], "undeclared template fields are kept, not pruned"
    kube.apply(
        {
            "apiVersion": "tidal.dev/v1alpha1",
            "kind": "Supernode",
            "metadata": {"name": "t-sn"},
            "spec": {"topology": {"block": "b0"}},
        }
    )
    job = kube.get("trainingjob", "ok-job", "-n", namespace)
    assert job["spec"]["accelerator"] == "nvidia.com/gpu", "schema default applied by the API server"
    assert job["spec"]["preemptible"] is False
    assert kube.get("tpool", "ok-pool", "-n", namespace)["spec"]["priority"] == 1000
    assert kube.get("supernode", "t-sn")["spec"]["accelerator"] == "nvidia.com/gpu"
    explain = kube.run("explain", "trainingjob.spec.gpusPerPod").stdout
    assert "must divide tp*ep" in explain
    kube.delete("supernode", "t-sn")


@pytest.mark.parametrize(
    ("obj", "field", "fragment"),
    [
        (training_job("bad-tp", tp=0), "spec.tp", "should be greater than or equal to 1"),
        (training_job("bad-gpp", tp=8, ep=1, gpusPerPod=6), "spec.gpusPerPod", "must divide tp*ep"),
        # An elastic job whose pod holds ranks of two DP replicas: no replica could be given back alone.
        (
            training_job("bad-span", tp=1, ep=1, pp=1, dp=16, gpusPerPod=8, elastic={"minDP": 8, "maxDP": 16}),
            "spec.gpusPerPod",
            "two DP replicas",
        ),
        (training_job("bad-dp", dp=8, elastic={"minDP": 1, "maxDP": 4}), "spec.dp", "elastic.minDP"),
        (inference_pool("bad-replicas", minReplicas=-1), "spec.minReplicas", "greater than or equal to 0"),
        (inference_pool("bad-range", minReplicas=5, maxReplicas=2), "spec.minReplicas", "<= maxReplicas"),
        (training_job("bad-field", bogus=1), "spec.bogus", "unknown field"),
        # The pod template: fields tidal owns are refused, not silently broken (issue 13).
        (training_job("tpl-nodename", template=pod_spec(nodeName="n0")), "spec.template.spec.nodeName", "must not"),
        (
            training_job("tpl-gates", template=pod_spec(schedulingGates=[{"name": "mine"}])),
            "spec.template.spec.schedulingGates",
            "must not be set",
        ),
        (
            training_job("tpl-deadline", template=pod_spec(activeDeadlineSeconds=3600)),
            "spec.template.spec.activeDeadlineSeconds",
            "must not be set: the kubelet would kill",
        ),
        (
            training_job(
                "tpl-claims", template=pod_spec(resourceClaims=[{"name": "g", "resourceClaimTemplateName": "gpus"}])
            ),
            "spec.template.spec.resourceClaims",
            "must not be set: a DRA claim takes devices",
        ),
        (
            training_job(
                "tpl-ctr-claims", template=pod_spec(containers=[{**MAIN, "resources": {"claims": [{"name": "g"}]}}])
            ),
            "spec.template.spec.containers",
            "resources.claims: must not be set",
        ),
        (
            training_job("tpl-selector", template=pod_spec(nodeSelector={"gpu": "h100"})),
            "spec.template.spec.nodeSelector",
            "must not be set",
        ),
        (
            training_job(
                "tpl-affinity", template=pod_spec(affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}})
            ),
            "spec.template.spec.affinity",
            f"{REQUIRED}: must not be set",
        ),
        (
            training_job("tpl-second-gpu", template=pod_spec(containers=[MAIN, {**SIDECAR, "resources": GPU_LIMIT}])),
            "spec.template.spec.containers",
            "only the first container may request",
        ),
        (
            inference_pool("tpl-init-gpu", template=pod_spec(initContainers=[{**SIDECAR, "resources": GPU_REQUEST}])),
            "spec.template.spec.initContainers",
            "init containers must not request",
        ),
        (
            inference_pool(
                "tpl-other-acc",
                accelerator="amd.com/gpu",
                template=pod_spec(containers=[MAIN, {**SIDECAR, "resources": {"limits": {"amd.com/gpu": 1}}}]),
            ),
            "spec.template.spec.containers",
            "only the first container may request",
        ),
        (
            training_job("tpl-dup-names", template=pod_spec(containers=[MAIN, {**MAIN, "resources": GPU_LIMIT}])),
            "spec.template.spec.containers[1]",
            "Duplicate value",
        ),
        (
            training_job("tpl-class", template=pod_spec(priorityClassName="system-node-critical")),
            "spec.template.spec.priorityClassName",
            "set spec.priorityClassName",
        ),
        (
            inference_pool("bad-class-name", priorityClassName="Not_A_Name"),
            "spec.priorityClassName",
            "should match",
        ),
        # Load from a free URL let any tenant make the operator fetch any address (issue 13).
        (
            inference_pool("free-url", load=prometheus_load({"url": "http://169.254.169.254/", "query": "up"})),
            "spec.load.prometheus.url",
            "no longer accepted",
        ),
        (
            inference_pool("no-server", load=prometheus_load({"query": "up"})),
            "spec.load.prometheus.server",
            "is required",
        ),
        # Stored, it could never read its load (the operator reported it in status only; issue 34).
        (
            inference_pool("prometheus-no-query", load={"targetPerReplica": 10, "source": "Prometheus"}),
            "spec.load.prometheus",
            "is required when source is Prometheus",
        ),
        (training_job("tpl-no-name", template=pod_spec(containers=[{"image": "busybox"}])), "name", "Required value"),
        # An empty window (start == end) was accepted and never open: an all-day floor silently absent.
        (
            inference_pool(
                "empty-window", schedule={"windows": [{"start": "00:00", "end": "00:00", "minReplicas": 1}]}
            ),
            "spec.schedule.windows[0].end",
            "must differ from start",
        ),
    ],
)
def test_invalid_objects_are_rejected_naming_the_field(kube: Kube, namespace: str, obj, field, fragment):
    result = kube.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert result.returncode != 0, f"{obj['metadata']['name']} was accepted"
    assert field in result.stderr and fragment in result.stderr, result.stderr
    gone = kube.run("get", obj["kind"].lower(), obj["metadata"]["name"], "-n", namespace, check=False)
    assert gone.returncode != 0, "nothing half-created"


def test_gpu_pod_with_node_affinity_is_bound_by_kube_scheduler_and_runs(kube: Kube, namespace: str):
    target = "nvl72-0003-n07"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-probe", "namespace": namespace},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [target]}]}
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"nvidia.com/gpu": "4"}},
                }
            ],
        },
    }
    kube.apply(pod)
    running = eventually(
        lambda: (p := kube.get("pod", "gpu-probe", "-n", namespace))["status"].get("phase") == "Running" and p,
        timeout=60,
        what="gpu-probe Running",
    )
    assert running["spec"]["nodeName"] == target
    # The node's 4 GPUs are now taken: a second identical pod must stay Pending.
    kube.apply({**pod, "metadata": {"name": "gpu-probe-2", "namespace": namespace}})

    def unschedulable():
        p = kube.get("pod", "gpu-probe-2", "-n", namespace)
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        return conds.get("PodScheduled", {}).get("reason") == "Unschedulable" and conds["PodScheduled"]["message"]

    message = eventually(unschedulable, timeout=60, what="gpu-probe-2 Unschedulable")
    assert "nvidia.com/gpu" in message


def test_list_keys_names_every_object_of_each_kind_across_pages(kube: Kube, namespace: str, monkeypatch):
    """The index audit's LIST (k8s/handlers.py audit_indices): metadata only, paginated, one key per
    object in the watch cache's form; compared with what kubectl lists."""
    kube.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([training_job(f"j{i}") for i in range(3)]))
    monkeypatch.setattr(tidal_api, "LIST_PAGE", 2)  # several pages even on this small cluster
    api = Api(load_client(str(kube.kubeconfig)), workers=1)

    def names(resource: str, namespaced: bool) -> set:
        items = kube.get(resource, "-A" if namespaced else "--all-namespaces=false")["items"]
        meta = [i["metadata"] for i in items]
        return {(m["namespace"], m["name"]) if namespaced else m["name"] for m in meta}

    for kind, resource, namespaced in (
        ("job", "trainingjobs", True),
        ("node", "nodes", False),
        ("supernode", "supernodes", False),
        ("pod", "pods", True),  # the operator is making the jobs' pods meanwhile: listed between two looks
        ("priorityclass", "priorityclasses", False),
        ("quota", "resourcequotas", True),
        ("pool", "inferencepools", True),
    ):
        before = names(resource, namespaced)
        listed = api.list_keys(kind)
        after = names(resource, namespaced)
        assert before & after <= listed <= before | after, kind
    assert {(namespace, f"j{i}") for i in range(3)} <= api.list_keys("job")
    assert len(api.list_keys("node")) > 2 and api.requests["list_keys:node"] >= 2, "more than one page"
    page = json.loads(api._list_page("node")(limit=1).data)
    assert page["kind"] == "PartialObjectMetadataList" and "spec" not in page["items"][0], "metadata only"


def test_a_pod_delete_with_a_uid_removes_only_that_pod_not_a_successor_of_its_name(kube: Kube, namespace: str):
    """k8s/api.py delete_pod: the uid goes as a precondition, so a delete decided on a pod another
    leader has since replaced (same name, new uid) leaves the new pod alone and still counts as done."""
    api = Api(load_client(str(kube.kubeconfig)), workers=1)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rank-0", "namespace": namespace}, **TEMPLATE}
    kube.apply(pod)
    first = kube.get("pod", "rank-0", "-n", namespace)["metadata"]["uid"]
    api.delete_pod(namespace, "rank-0", 0, first)
    eventually(lambda: not kube.get("pods", "-n", namespace)["items"], timeout=30, what="rank-0 gone")
    kube.apply(pod)
    second = kube.get("pod", "rank-0", "-n", namespace)["metadata"]["uid"]
    assert second != first
    api.delete_pod(namespace, "rank-0", 0, first)  # the old decision: refused (409), not raised
    assert kube.get("pod", "rank-0", "-n", namespace)["metadata"]["uid"] == second
    api.delete_pod(namespace, "rank-0", 0, second)
    eventually(lambda: not kube.get("pods", "-n", namespace)["items"], timeout=30, what="rank-0 deleted by its uid")
