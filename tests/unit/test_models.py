import pytest
import yaml
from pydantic import ValidationError

from tidal.model import InferencePoolSpec, SupernodeSpec, TrainingJobSpec, describe_errors
from tidal.model.crd import render_crds

TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}


def errors_of(model, data):
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return describe_errors(info.value)


def test_training_job_shape_and_defaults():
    spec = TrainingJobSpec.model_validate({"tp": 8, "ep": 8, "pp": 4, "dp": 64, "gpusPerPod": 4, "template": TEMPLATE})
    assert spec.world_size == 16_384
    assert spec.hbd_group_gpus == 64
    assert spec.placement_group_gpus == 64
    assert spec.placement_groups() == 256
    assert spec.placement_groups(dp=32) == 128
    assert spec.restart_policy.scope == "Group"
    assert spec.preemptible is False
    assert spec.to_api()["gpusPerPod"] == 4


def test_pod_holding_several_groups_is_the_placement_unit():
    spec = TrainingJobSpec.model_validate({"tp": 2, "dp": 8, "gpusPerPod": 8, "template": TEMPLATE})
    assert spec.placement_group_gpus == 8
    assert spec.placement_groups() == 2


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"tp": 0, "gpusPerPod": 1}, "spec.tp: must be >= 1"),
        ({"tp": 8, "gpusPerPod": 6}, "spec.gpusPerPod: 6 does not divide tp*ep=8 and is not a multiple of it"),
        ({"tp": 8, "dp": 1, "gpusPerPod": 16}, "spec.gpusPerPod: 16 does not divide the world size tp*ep*pp*dp=8"),
        ({"gpusPerPod": 1, "dp": 4, "elastic": {"minDP": 8, "maxDP": 16}}, "spec.dp: 4 is outside elastic"),
        ({"gpusPerPod": 1, "elastic": {"minDP": 4, "maxDP": 2}}, "spec.elastic.minDP: 4 is greater than maxDP=2"),
        ({"gpusPerPod": 1, "bogus": 1}, "spec.bogus: unknown field"),
        ({"tp": 8}, "spec.gpusPerPod: is required"),
        ({"gpusPerPod": 1, "restartPolicy": {"scope": "Node"}}, "spec.restartPolicy.scope: must be one of"),
    ],
)
def test_training_job_errors_name_the_field(data, expected):
    data = {"template": TEMPLATE, **data}
    messages = errors_of(TrainingJobSpec, data)
    assert any(m.startswith(expected) for m in messages), messages


def test_inference_pool_validation():
    ok = InferencePoolSpec.model_validate(
        {
            "minReplicas": 2,
            "maxReplicas": 40,
            "tp": 4,
            "gpusPerPod": 4,
            "template": TEMPLATE,
            "schedule": {
                "timezone": "Asia/Shanghai",
                "windows": [{"start": "08:00", "end": "23:00", "minReplicas": 30}],
            },
        }
    )
    assert ok.replica_gpus == 4
    assert errors_of(InferencePoolSpec, {"maxReplicas": -1, "gpusPerPod": 1, "template": {}}) == [
        "spec.maxReplicas: must be >= 0"
    ]
    assert "spec.minReplicas: 5 is greater than maxReplicas=2" in errors_of(
        InferencePoolSpec, {"minReplicas": 5, "maxReplicas": 2, "gpusPerPod": 1, "template": {}}
    )
    tz = errors_of(
        InferencePoolSpec,
        {"maxReplicas": 2, "gpusPerPod": 1, "template": {}, "schedule": {"timezone": "Mars/Olympus"}},
    )
    assert tz[0].startswith("spec.schedule.timezone: ") and "Mars/Olympus" in tz[0]
    assert "valid names are IANA tz database names such as UTC" in tz[0], "says which names are valid"
    near = errors_of(
        InferencePoolSpec, {"maxReplicas": 2, "gpusPerPod": 1, "template": {}, "schedule": {"timezone": "Europe/Pari"}}
    )
    assert "did you mean Europe/Paris" in near[0], near
    window = errors_of(
        InferencePoolSpec,
        {
            "maxReplicas": 2,
            "gpusPerPod": 1,
            "template": {},
            "schedule": {"windows": [{"start": "8am", "end": "23:00", "minReplicas": 1}]},
        },
    )
    assert window[0].startswith("spec.schedule.windows[0].start: must match")
    # An empty window is refused by the API server (a CEL rule, tests/cluster/test_cluster_api.py),
    # not by the operator: a pool stored before the rule keeps being served (the window is never open).
    InferencePoolSpec.model_validate(
        {
            "maxReplicas": 2,
            "gpusPerPod": 1,
            "template": {},
            "schedule": {"windows": [{"start": "00:00", "end": "00:00", "minReplicas": 1}] * 50},
        }
    )
    crd = yaml.safe_load(render_crds()["tidal.dev_inferencepools.yaml"])
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    window_schema = spec["properties"]["schedule"]["properties"]["windows"]
    assert window_schema["maxItems"] == 48
    assert window_schema["items"]["x-kubernetes-validations"][0]["rule"] == "self.start != self.end"
    load = errors_of(
        InferencePoolSpec,
        {"maxReplicas": 2, "gpusPerPod": 1, "template": {}, "load": {"targetPerReplica": 5, "source": "Prometheus"}},
    )
    assert load == ["spec.load.prometheus: is required when source is Prometheus"]
    url = errors_of(
        InferencePoolSpec,
        {
            "maxReplicas": 2,
            "gpusPerPod": 1,
            "template": {},
            "load": {"targetPerReplica": 5, "source": "Prometheus", "prometheus": {"url": "http://x", "query": "up"}},
        },
    )
    assert len(url) == 1 and url[0].startswith("spec.load.prometheus.url: no longer accepted"), url
    assert "spec.load.prometheus.server" in url[0]


def test_supernode_defaults():
    spec = SupernodeSpec.model_validate({})
    assert spec.accelerator == "nvidia.com/gpu"
    assert spec.spares.count == 0
    assert errors_of(SupernodeSpec, {"spares": {"count": -2}}) == ["spec.spares.count: must be >= 0"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"nodeName": "n0"}, "spec.template.spec.nodeName: must not be set"),
        ({"nodeSelector": {"gpu": "h100"}}, "spec.template.spec.nodeSelector: must not be set"),
        ({"schedulingGates": [{"name": "mine"}]}, "spec.template.spec.schedulingGates: must not be set"),
        ({"activeDeadlineSeconds": 3600}, "spec.template.spec.activeDeadlineSeconds: must not be set: the kubelet"),
        (
            {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]},
            "spec.template.spec.resourceClaims: must not be set: a DRA claim takes devices",
        ),
        (
            {"containers": [{"name": "a", "resources": {"claims": [{"name": "gpus"}]}}]},
            "spec.template.spec.containers[0].resources.claims: must not be set",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
                }
            },
            "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        ),
        (
            {"containers": [{"name": "a"}, {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}}]},
            "spec.template.spec.containers[1].resources: only the first container may request nvidia.com/gpu",
        ),
        (
            {
                "containers": [{"name": "a"}],
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            "spec.template.spec.initContainers[0].resources: init containers must not request nvidia.com/gpu",
        ),
    ],
)
def test_pod_template_fields_tidal_owns_are_refused(spec, expected):
    """The operator's own check (objects admitted before the CRD's CEL rules) matches the rules."""
    for model, base in ((TrainingJobSpec, {"gpusPerPod": 1}), (InferencePoolSpec, {"gpusPerPod": 1, "maxReplicas": 1})):
        problems = errors_of(model, {**base, "template": {"spec": spec}})
        assert any(expected in p for p in problems), problems


def test_pod_template_keeps_undeclared_fields_and_allows_gpus_on_the_first_container():
    template = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {
            "containers": [{"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 8}}}, {"name": "b"}],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        },
    }
    spec = TrainingJobSpec.model_validate({"gpusPerPod": 1, "template": template})
    assert spec.to_api()["template"] == template
