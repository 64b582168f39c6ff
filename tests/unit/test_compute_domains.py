"""ComputeDomains for multi-node NVLink (GB200 NVL72): the pure rules, and the controller's
decisions on the in-memory cluster (tests/cluster/test_compute_domain.py runs them against a real
API server with the real CRDs and kube-scheduler allocating the claims)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from tidal.clock import FixedClock
from tidal.k8s.compute_domains import RECHECK_SECONDS, ComputeDomainSupport
from tidal.k8s.controller import Controller
from tidal.k8s.manifests import GangShape, pinned_node, training_pods
from tidal.placement.compute_domains import (
    CLAIM_NAME,
    NAME_MAX,
    add_channel_claim,
    claims_by_group,
    domain_name,
    exclusive_nodes,
    job_uses_domain,
    plan_domains,
    stale_domains,
    supernode_uses_domains,
    template_name,
)

from ..evictions import rebalanced_past_grace
from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
RACK = {"tp": 4, "ep": 18, "pp": 1, "gpusPerPod": 4, "template": TEMPLATE}
"""One group of 72 GPUs = one whole NVL72 rack of 18 trays x 4 GPUs."""


# -- the pure rules ----------------------------------------------------------------------------


def test_names_are_deterministic_per_job_and_supernode_and_fit_a_dns_label_with_the_template_suffix():
    assert domain_name("moe", "nvl72-0001") == "moe-nvl72-0001"
    assert template_name("moe-nvl72-0001") == "moe-nvl72-0001-channel"
    job, long_a, long_b = "j" * 50, "rack-" + "a" * 60, "rack-" + "b" * 60
    a, b = domain_name(job, long_a), domain_name(job, long_b)
    assert a == domain_name(job, long_a), "deterministic: a restarted operator finds its domains"
    assert a != b and len(a) <= NAME_MAX and len(template_name(a)) <= 63
    assert a.startswith("j") and not a.endswith("-")


@pytest.mark.parametrize(
    ("supernode_mode", "clique", "expected"),
    [
        ("Auto", True, True),
        ("Auto", False, False),
        (None, True, True),
        ("Enabled", False, True),
        ("Disabled", True, False),
    ],
)
def test_a_supernode_wants_domains_when_its_nodes_carry_a_clique_unless_told(supernode_mode, clique, expected):
    assert supernode_uses_domains(supernode_mode, clique) is expected


@pytest.mark.parametrize(
    ("job_mode", "supernode_on", "expected"),
    [("Auto", True, True), ("Auto", False, False), ("Enabled", False, True), ("Disabled", True, False)],
)
def test_the_jobs_own_choice_wins_over_the_supernodes(job_mode, supernode_on, expected):
    assert job_uses_domain(job_mode, supernode_on) is expected


PLACEMENT = [
    {"group": 0, "supernode": "nvl72-0001", "nodes": ["a0", "a1"]},
    {"group": 1, "supernode": "nvl72-0001", "nodes": ["a2", "a3"]},
    {"group": 2, "supernode": "nvl72-0003", "nodes": ["b0", "b1"]},
    {"group": 3, "supernode": "hgx8-0000", "nodes": ["h0", "h0"]},
]


def test_one_domain_per_supernode_the_job_uses_holding_the_groups_placed_there():
    domains = plan_domains("moe", "Auto", PLACEMENT, {"nvl72-0001", "nvl72-0003", "nvl72-0009"})
    assert set(domains) == {"nvl72-0001", "nvl72-0003"}, "none on a rack the job does not use, none on HGX"
    assert domains["nvl72-0001"].groups == (0, 1) and domains["nvl72-0003"].groups == (2,)
    assert claims_by_group(domains) == {
        0: "moe-nvl72-0001-channel",
        1: "moe-nvl72-0001-channel",
        2: "moe-nvl72-0003-channel",
    }
    assert exclusive_nodes(domains, PLACEMENT) == {"a0", "a1", "a2", "a3", "b0", "b1"}
    # Enabled asks everywhere, but hgx8-0000 holds two pods on h0: packed, so never a domain there
    # (each pod would claim the node's one IMEX channel; the second would never start).
    assert set(plan_domains("moe", "Enabled", PLACEMENT, set())) == {"nvl72-0001", "nvl72-0003"}
    spread = [*PLACEMENT[:3], {"group": 3, "supernode": "hgx8-0000", "nodes": ["h0", "h1"]}]
    assert set(plan_domains("moe", "Enabled", spread, set())) == {"nvl72-0001", "nvl72-0003", "hgx8-0000"}
    assert plan_domains("moe", "Disabled", PLACEMENT, {"nvl72-0001"}) == {}


def test_domains_no_group_needs_any_more_are_stale():
    wanted = plan_domains("moe", "Auto", PLACEMENT[:2], {"nvl72-0001", "nvl72-0003"})
    assert stale_domains(["moe-nvl72-0001", "moe-nvl72-0003"], wanted) == ["moe-nvl72-0003"]
    assert stale_domains([], wanted) == []


def test_the_claim_goes_on_the_pod_and_its_gpu_container_once_keeping_the_users_own_claims():
    spec = {
        "resourceClaims": [{"name": "scratch", "resourceClaimTemplateName": "nvme"}],
        "containers": [{"name": "trainer", "resources": {"claims": [{"name": "scratch"}]}}, {"name": "sidecar"}],
    }
    add_channel_claim(spec, "moe-nvl72-0001-channel")
    add_channel_claim(spec, "moe-nvl72-0001-channel")
    assert spec["resourceClaims"] == [
        {"name": "scratch", "resourceClaimTemplateName": "nvme"},
        {"name": CLAIM_NAME, "resourceClaimTemplateName": "moe-nvl72-0001-channel"},
    ]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "scratch"}, {"name": CLAIM_NAME}]
    assert "resources" not in spec["containers"][1]


def test_pods_of_each_group_claim_their_own_supernodes_template():
    shape = GangShape(tp=2, ep=1, pp=1, dp=2, gpus_per_pod=2)
    pods = training_pods("moe", "ml", "uid", {"gpusPerPod": 2}, shape, {0: ["a0"], 1: ["b0"]}, {0: "t-a"})
    assert pods["moe-0"]["spec"]["resourceClaims"] == [{"name": CLAIM_NAME, "resourceClaimTemplateName": "t-a"}]
    assert pods["moe-0"]["spec"]["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}]
    assert "resourceClaims" not in pods["moe-1"]["spec"], "group 1's supernode has no domain"


# -- the controller ----------------------------------------------------------------------------


def domains_of(cluster: FakeCluster, namespace: str = "ml") -> dict[str, dict]:
    return {name: body for (ns, name), body in cluster.compute_domains.items() if ns == namespace}


def claim_of(pod: dict) -> str | None:
    claims = pod["spec"].get("resourceClaims") or []
    return next((c["resourceClaimTemplateName"] for c in claims if c["name"] == CLAIM_NAME), None)


def assert_pods_claim_their_racks_domain(cluster: FakeCluster, job: str) -> None:
    status = cluster.status("TrainingJob", "ml", job)
    rack_of = {g["group"]: g["supernode"] for g in status["placement"]}
    pods = cluster.pods_of("tidal.dev/job", job)
    assert pods
    for pod in pods:
        rack = rack_of[int(pod["metadata"]["labels"]["tidal.dev/hbd-group"])]
        assert claim_of(pod) == f"{job}-{rack}-channel", pod["metadata"]["name"]
        assert {"name": CLAIM_NAME} in pod["spec"]["containers"][0]["resources"]["claims"]
    assert sorted(status["computeDomains"]) == sorted(f"{job}-{r}" for r in set(rack_of.values()))


def test_a_two_rack_job_gets_one_owned_domain_per_rack_before_its_pods_and_every_pod_claims_its_own():
    cluster = FakeCluster("nvl72", 3, clique=True)
    job = cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 2})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "moe")
    assert status["phase"] == "Running"
    racks = {g["supernode"] for g in status["placement"]}
    assert len(racks) == 2
    domains = domains_of(cluster)
    assert set(domains) == {f"moe-{r}" for r in racks}
    for name, body in domains.items():
        assert body["apiVersion"] == "resource.nvidia.com/v1beta1" and body["kind"] == "ComputeDomain"
        assert body["spec"]["channel"]["resourceClaimTemplate"]["name"] == f"{name}-channel"
        owner = body["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TrainingJob",
            "moe",
            job.uid,
            True,
        )
    assert_pods_claim_their_racks_domain(cluster, "moe")
    verbs = [verb for verb, _ in cluster.calls if verb in ("create_compute_domain", "create_pod")]
    assert verbs.index("create_pod") > verbs.index("create_compute_domain"), "domains before the pods claiming them"
    assert verbs.count("create_compute_domain") == 2, "made once each"
    cond = {c["type"]: c for c in status["conditions"]}["ComputeDomain"]
    assert cond["status"] == "True" and cond["reason"] == "Created"


def test_no_domain_without_a_clique_label_unless_the_job_or_supernode_asks_and_none_when_disabled():
    cluster = FakeCluster("nvl72", 4)
    cluster.add("TrainingJob", "ml", "plain", {**RACK, "dp": 1})
    cluster.add("TrainingJob", "ml", "asked", {**RACK, "dp": 1, "computeDomain": "Enabled"})
    sn = cluster.get("Supernode", None, "nvl72-0003")
    cluster.objects[("Supernode", None, "nvl72-0003")] = dataclasses.replace(
        sn, spec={**sn.spec, "computeDomain": "Enabled"}
    )
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    plain = cluster.status("TrainingJob", "ml", "plain")
    asked = cluster.status("TrainingJob", "ml", "asked")
    assert plain["phase"] == asked["phase"] == "Running"
    expected = {"asked-" + asked["placement"][0]["supernode"]}
    if plain["placement"][0]["supernode"] == "nvl72-0003":  # the Supernode's own Enabled
        expected.add("plain-nvl72-0003")
    assert set(domains_of(cluster)) == expected
    assert_pods_claim_their_racks_domain(cluster, "asked")

    clique = FakeCluster("nvl72", 2, clique=True)
    clique.add("TrainingJob", "ml", "off", {**RACK, "dp": 1, "computeDomain": "Disabled"})
    run(clique, Controller(clique, FixedClock(NOW)))
    assert clique.status("TrainingJob", "ml", "off")["phase"] == "Running"
    assert not clique.compute_domains and not any(claim_of(p) for p in clique.pods_of("tidal.dev/job", "off"))


def test_without_the_crd_pods_run_unclaimed_and_only_a_job_that_asked_gets_a_false_condition():
    cluster = FakeCluster("nvl72", 2, clique=True)
    cluster.compute_domain_crd = False
    cluster.add("TrainingJob", "ml", "auto", {**RACK, "dp": 1})
    cluster.add("TrainingJob", "ml", "asked", {**RACK, "dp": 1, "computeDomain": "Enabled"})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=4)
    for name in ("auto", "asked"):
        assert cluster.status("TrainingJob", "ml", name)["phase"] == "Running"
        assert not any(claim_of(p) for p in cluster.pods_of("tidal.dev/job", name))
    assert not cluster.compute_domains and ("create_compute_domain", "auto-nvl72-0000") not in cluster.calls
    conditions = {c["type"]: c for c in cluster.status("TrainingJob", "ml", "asked")["conditions"]}
    assert conditions["ComputeDomain"]["status"] == "False"
    assert conditions["ComputeDomain"]["reason"] == "CRDNotInstalled"
    assert "ComputeDomain" not in {c["type"] for c in cluster.status("TrainingJob", "ml", "auto")["conditions"]}
    warnings = [d for v, d in cluster.calls if v == "event" and d[1] == "ComputeDomainUnavailable"]
    assert len(warnings) == 1 and warnings[0][0] == "asked", "one warning, not one per cycle"
    assert cluster.requests["discover_compute_domains"] == 1, "the CRD's presence is cached, not asked per job"


def test_a_shrink_deletes_the_domain_of_the_rack_given_back_and_keeps_the_other():
    cluster = FakeCluster("nvl72", 2, clique=True)
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 2, "preemptible": True, "elastic": {"minDP": 1, "maxDP": 2}})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "moe")
    rack_of = {g["group"]: g["supernode"] for g in status["placement"]}
    eviction = rebalanced_past_grace([1])
    cluster.patch_status("TrainingJob", "ml", "moe", {"eviction": eviction})
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "moe")
    assert status["currentDP"] == 1 and [g["group"] for g in status["placement"]] == [0]
    assert set(domains_of(cluster)) == {f"moe-{rack_of[0]}"}
    assert ("delete_compute_domain", f"moe-{rack_of[1]}") in cluster.calls
    assert status["computeDomains"] == [f"moe-{rack_of[0]}"]


def test_a_group_re_placed_on_another_rack_gets_a_domain_there_and_its_old_racks_domain_goes():
    cluster = FakeCluster("nvl72", 3, clique=True)
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 2})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    before = {g["group"]: g for g in cluster.status("TrainingJob", "ml", "moe")["placement"]}
    lost = before[1]["nodes"][3]  # a full rack: group 1 cannot stay on its own rack
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "moe")
    after = {g["group"]: g["supernode"] for g in status["placement"]}
    assert status["phase"] == "Running" and status.get("restarts", 0) == 0  # a lost node: not charged
    assert after[0] == before[0]["supernode"] and after[1] not in (before[0]["supernode"], before[1]["supernode"])
    assert set(domains_of(cluster)) == {f"moe-{after[0]}", f"moe-{after[1]}"}
    assert ("delete_compute_domain", f"moe-{before[1]['supernode']}") in cluster.calls
    assert_pods_claim_their_racks_domain(cluster, "moe")


def test_a_suspended_job_gives_back_every_domain():
    cluster = FakeCluster("nvl72", 2, clique=True)
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 2, "checkpoint": {"gracePeriodSeconds": 0}})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert len(domains_of(cluster)) == 2
    view = cluster.get("TrainingJob", "ml", "moe")
    cluster.objects[("TrainingJob", "ml", "moe")] = dataclasses.replace(view, spec={**view.spec, "suspend": True})
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "moe")
    assert status["phase"] == "Suspended"
    assert not domains_of(cluster) and "computeDomains" not in status


@pytest.mark.parametrize("clique", [True, False])
def test_a_node_held_by_a_domain_is_not_shared_with_another_gang(clique):
    """2-GPU pods on 4-GPU trays: without domains tidal packs a second gang onto the half-used
    tray (fullest nodes first); with a domain there, the tray serves that domain alone."""
    cluster = FakeCluster("nvl72", 1, clique=clique)
    spec = {"tp": 2, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 2, "template": TEMPLATE}
    cluster.add_priority_class("first", 5)
    cluster.add("TrainingJob", "ml", "first", {**spec, "priorityClassName": "first"})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    cluster.add("TrainingJob", "ml", "second", spec)
    run(cluster, controller)
    first = cluster.status("TrainingJob", "ml", "first")["placement"][0]["nodes"]
    second = cluster.status("TrainingJob", "ml", "second")["placement"][0]["nodes"]
    assert cluster.status("TrainingJob", "ml", "second")["phase"] == "Running"
    if clique:
        assert not set(first) & set(second), "a domain's node served another gang"
        assert len(domains_of(cluster)) == 2
        assert controller.last_report.overbooked_gpus == 0
    else:
        assert set(first) == set(second), "tidal shares a node between gangs when no domain holds it"


def test_a_domain_held_node_is_not_taken_by_a_gang_admitted_in_the_same_cycle():
    cluster = FakeCluster("nvl72", 1, clique=True)
    spec = {"tp": 2, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 2, "template": TEMPLATE}
    cluster.add_priority_class("first", 5)
    cluster.add("TrainingJob", "ml", "first", {**spec, "priorityClassName": "first"})
    cluster.add("TrainingJob", "ml", "second", spec)
    controller = Controller(cluster, FixedClock(NOW))
    controller.cycle(cluster.state())  # both admitted in one cycle
    first = cluster.status("TrainingJob", "ml", "first")["placement"][0]["nodes"]
    second = cluster.status("TrainingJob", "ml", "second")["placement"][0]["nodes"]
    assert not set(first) & set(second)


def test_a_refused_domain_holds_back_its_jobs_pods_until_both_can_be_made():
    class RefusingDomains(FakeCluster):
        refuse = True

        def create_compute_domain(self, body):
            if self.refuse:
                raise RuntimeError("403 Forbidden: namespace is being terminated")
            return super().create_compute_domain(body)

    cluster = RefusingDomains("nvl72", 2, clique=True)
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 1})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert controller.failures == 0
    assert not cluster.pods_of("tidal.dev/job", "moe"), "pods would wait on a template nobody makes"
    cluster.refuse = False
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "moe")["phase"] == "Running"
    assert_pods_claim_their_racks_domain(cluster, "moe")


def test_when_the_crd_goes_away_a_job_that_had_domains_says_so_and_forgets_them():
    cluster = FakeCluster("nvl72", 2, clique=True)
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 1})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "moe")["computeDomains"]
    cluster.compute_domain_crd = False
    cluster.compute_domains.clear()  # the API server deletes the objects of a deleted CRD
    controller.domains.forget()
    view = cluster.get("TrainingJob", "ml", "moe")  # a new object: the job is reconciled again
    cluster.objects[("TrainingJob", "ml", "moe")] = dataclasses.replace(view, resource_version="2", generation=2)
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "moe")
    assert status["phase"] == "Running" and "computeDomains" not in status
    cond = {c["type"]: c for c in status["conditions"]}["ComputeDomain"]
    assert (cond["status"], cond["reason"]) == ("False", "CRDNotInstalled")


def test_the_crd_is_asked_again_after_the_recheck_interval_and_a_failed_read_keeps_the_last_answer():
    answers: list[object] = [False, True, RuntimeError("connection refused")]
    now = [0.0]

    def probe() -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    support = ComputeDomainSupport(probe, clock=lambda: now[0])
    assert support.installed() is False
    now[0] += RECHECK_SECONDS / 2
    assert support.installed() is False and len(answers) == 2, "cached"
    now[0] += RECHECK_SECONDS
    assert support.installed() is True
    now[0] += RECHECK_SECONDS
    assert support.installed() is True and not answers


def test_a_domain_of_the_same_name_still_being_deleted_holds_the_pods_back_until_it_is_gone():
    """Say the job was preempted and is re-admitted on the same rack while the driver's finalizer
    still holds its old domain: pods claiming that domain's template now would lose it."""
    cluster = FakeCluster("nvl72", 1, clique=True)
    old = {"metadata": {"name": "moe-nvl72-0000", "namespace": "ml", "deletionTimestamp": "2026-05-01T00:00:00Z"}}
    cluster.compute_domains[("ml", "moe-nvl72-0000")] = old
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 1})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert not cluster.pods_of("tidal.dev/job", "moe")
    del cluster.compute_domains[("ml", "moe-nvl72-0000")]  # the driver let it go
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "moe")["phase"] == "Running"
    assert "deletionTimestamp" not in cluster.compute_domains[("ml", "moe-nvl72-0000")]["metadata"]
    assert_pods_claim_their_racks_domain(cluster, "moe")


class _CustomObjects:
    """CustomObjectsApi as far as create_compute_domain uses it: the name is taken (409)."""

    def __init__(self, existing: dict):
        self.existing = existing

    def create_namespaced_custom_object(self, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=409, reason="AlreadyExists")

    def get_namespaced_custom_object(self, *args, **kwargs):
        return self.existing


def _owner(uid: str) -> dict:
    return {"apiVersion": "tidal.dev/v1alpha1", "kind": "TrainingJob", "name": "moe", "uid": uid, "controller": True}


@pytest.mark.parametrize("terminating", [False, True])
def test_the_api_tells_an_existing_domain_from_one_still_being_deleted(terminating):
    from kubernetes import client

    from tidal.k8s.api import Api, DomainTerminating

    api = Api(client.ApiClient(), workers=1)
    meta = {"name": "moe-nvl72-0000", "namespace": "ml", "ownerReferences": [_owner("uid-1")]}
    api.custom = _CustomObjects({"metadata": {**meta, **({"deletionTimestamp": "t"} if terminating else {})}})
    body = {"metadata": meta}
    if terminating:
        with pytest.raises(DomainTerminating):
            api.create_compute_domain(body)
    else:
        assert api.create_compute_domain(body) is False


@pytest.mark.parametrize("refs", [[_owner("uid-old")], [], [{**_owner("uid-new"), "controller": False}]])
def test_the_api_never_adopts_a_domain_of_the_same_name_another_owner_controls(refs):
    """A job deleted and made again under the same name before the garbage collector ran: the old
    job's domain (same name, other uid) must not be taken for the new job's, as the garbage
    collector deletes it under the running job."""
    from kubernetes import client

    from tidal.k8s.api import Api, DomainTerminating

    api = Api(client.ApiClient(), workers=1)
    meta = {"name": "moe-nvl72-0000", "namespace": "ml"}
    api.custom = _CustomObjects({"metadata": {**meta, "ownerReferences": refs}})
    with pytest.raises(DomainTerminating, match="another owner"):
        api.create_compute_domain({"metadata": {**meta, "ownerReferences": [_owner("uid-new")]}})


def test_a_job_made_again_under_the_same_name_waits_for_the_old_jobs_domain_to_be_collected():
    cluster = FakeCluster("nvl72", 1, clique=True)
    old = cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 1})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert set(domains_of(cluster)) == {"moe-nvl72-0000"}
    # Deleted and made again before the garbage collector ran: pods gone, the old domain left.
    del cluster.objects[("TrainingJob", "ml", "moe")]
    cluster.pods.clear()
    run(cluster, controller)
    new = cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 1})
    run(cluster, controller)
    assert not cluster.pods_of("tidal.dev/job", "moe"), "pods would claim a domain the garbage collector deletes"
    owner = cluster.compute_domains[("ml", "moe-nvl72-0000")]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == old.uid
    del cluster.compute_domains[("ml", "moe-nvl72-0000")]  # the garbage collector caught up
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "moe")["phase"] == "Running"
    owner = cluster.compute_domains[("ml", "moe-nvl72-0000")]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == new.uid
    assert_pods_claim_their_racks_domain(cluster, "moe")


def test_a_preempted_job_gives_its_rack_and_domain_to_the_preemptor_and_no_node_serves_both():
    cluster = FakeCluster("nvl72", 1, clique=True)
    low = {**RACK, "dp": 1, "preemptible": True, "checkpoint": {"gracePeriodSeconds": 0}}
    cluster.add("TrainingJob", "ml", "low", low)
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert set(domains_of(cluster)) == {"low-nvl72-0000"}
    cluster.add_priority_class("urgent", 100)
    cluster.add("TrainingJob", "ml", "high", {**RACK, "dp": 1, "priorityClassName": "urgent"})
    run(cluster, controller, cycles=6)
    assert cluster.status("TrainingJob", "ml", "low")["phase"] == "Pending"
    assert cluster.status("TrainingJob", "ml", "high")["phase"] == "Running"
    assert set(domains_of(cluster)) == {"high-nvl72-0000"}, "the victim's domain went with its pods"
    assert "computeDomains" not in cluster.status("TrainingJob", "ml", "low")
    assert_pods_claim_their_racks_domain(cluster, "high")
    assert not cluster.pods_of("tidal.dev/job", "low")


class FailingDeletes(FakeCluster):
    """Deletes of ComputeDomains fail (say, the API server times out) while `failing` > 0."""

    failing = 0

    def delete_compute_domain(self, namespace: str, name: str) -> None:
        if self.failing:
            self.failing -= 1
            self._log("delete_compute_domain_failed", name)
            raise RuntimeError("504 Gateway Timeout")
        super().delete_compute_domain(namespace, name)


def _shrunk_to_one_rack(cluster: FakeCluster, controller: Controller) -> tuple[str, str]:
    """Run a 2-rack elastic job, then give back DP replica 1: (kept rack, given-back rack)."""
    run(cluster, controller)
    rack_of = {g["group"]: g["supernode"] for g in cluster.status("TrainingJob", "ml", "moe")["placement"]}
    eviction = rebalanced_past_grace([1])
    cluster.patch_status("TrainingJob", "ml", "moe", {"eviction": eviction})
    return rack_of[0], rack_of[1]


def test_a_failed_domain_delete_is_retried_next_cycle_and_the_name_stays_recorded_until_it_succeeds():
    cluster = FailingDeletes("nvl72", 2, clique=True)
    cluster.add("TrainingJob", "ml", "moe", {**RACK, "dp": 2, "preemptible": True, "elastic": {"minDP": 1, "maxDP": 2}})
    controller = Controller(cluster, FixedClock(NOW))
    kept, gone = _shrunk_to_one_rack(cluster, controller)
    cluster.failing = 1
    run(cluster, controller, cycles=2)  # the eviction completes; the next reconcile prunes, and fails once
    assert ("delete_compute_domain_failed", f"moe-{gone}") in cluster.calls
    run(cluster, controller)
    assert set(domains_of(cluster)) == {f"moe-{kept}"}, "the failed delete was never retried: the domain leaked"
    status = cluster.status("TrainingJob", "ml", "moe")
    assert status["computeDomains"] == [f"moe-{kept}"] and not status.get("staleComputeDomains")


@pytest.mark.parametrize("how", ["shrink", "suspend"])
def test_a_restarted_operator_still_deletes_a_domain_whose_delete_failed_before_it_stopped(how):
    cluster = FailingDeletes("nvl72", 2, clique=True)
    spec = {**RACK, "dp": 2, "preemptible": True, "elastic": {"minDP": 1, "maxDP": 2}}
    cluster.add("TrainingJob", "ml", "moe", {**spec, "checkpoint": {"gracePeriodSeconds": 0}})
    controller = Controller(cluster, FixedClock(NOW))
    if how == "shrink":
        kept, _ = _shrunk_to_one_rack(cluster, controller)
        left = {f"moe-{kept}"}
    else:
        run(cluster, controller)
        view = cluster.get("TrainingJob", "ml", "moe")
        cluster.objects[("TrainingJob", "ml", "moe")] = dataclasses.replace(view, spec={**view.spec, "suspend": True})
        left = set()
    cluster.failing = 10**6  # every delete fails until the operator stops
    run(cluster, controller)
    assert len(domains_of(cluster)) == 2
    assert cluster.status("TrainingJob", "ml", "moe")["staleComputeDomains"], "recorded for whoever runs next"
    cluster.failing = 0
    restarted = Controller(cluster, FixedClock(NOW))  # nothing carried over but the cluster's state
    run(cluster, restarted)
    assert set(domains_of(cluster)) == left
    status = cluster.status("TrainingJob", "ml", "moe")
    assert not status.get("staleComputeDomains")
    assert status["phase"] == ("Running" if how == "shrink" else "Suspended")


def test_pods_made_before_a_domain_was_wanted_get_no_domain_claim_or_whole_node_booking_until_remade():
    """The clique label appears (or the operator is upgraded) under a running job: its pods have no
    claim and cannot get one (pod specs are immutable), so no domain is made, recorded or booked
    for them and the condition says why; a restart makes the pods again, with the claim."""
    cluster = FakeCluster("nvl72", 1)
    spec = {"tp": 2, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 2, "template": TEMPLATE}
    cluster.add("TrainingJob", "ml", "first", {**spec, "priority": 5})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "first")["phase"] == "Running"
    for name, node in list(cluster.nodes.items()):
        cluster.nodes[name] = dataclasses.replace(node, labels={**node.labels, "nvidia.com/gpu.clique": "c-0"})
    controller = Controller(cluster, FixedClock(NOW))  # an upgraded (restarted) operator sees the labels
    run(cluster, controller)
    status = cluster.status("TrainingJob", "ml", "first")
    assert not domains_of(cluster) and "computeDomains" not in status
    cond = {c["type"]: c for c in status["conditions"]}["ComputeDomain"]
    assert (cond["status"], cond["reason"]) == ("False", "PodsPredateDomain")
    cluster.add("TrainingJob", "ml", "second", spec)
    run(cluster, controller)
    first = status["placement"][0]["nodes"]
    second = cluster.status("TrainingJob", "ml", "second")["placement"][0]["nodes"]
    assert set(first) == set(second), "the unclaimed pods' node was booked whole for a domain that does not exist"
    assert set(domains_of(cluster)) == {"second-nvl72-0000"}, "the new job's pods are made with their claim"

    del cluster.pods[("ml", "first-0")]  # the pod goes: the group restarts with new pods
    run(cluster, controller, cycles=4)
    status = cluster.status("TrainingJob", "ml", "first")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert "first-nvl72-0000" in domains_of(cluster)
    assert_pods_claim_their_racks_domain(cluster, "first")
    cond = {c["type"]: c for c in status["conditions"]}["ComputeDomain"]
    assert (cond["status"], cond["reason"]) == ("True", "Created")


# -- InferencePool replicas ----------------------------------------------------------------------

SERVE = {"minReplicas": 0, "maxReplicas": 4, "gpusPerPod": 4, "template": TEMPLATE}


def _pool_pods(cluster: FakeCluster, pool: str, replica: int) -> list[dict]:
    return [
        p
        for p in cluster.pods_of("tidal.dev/pool", pool)
        if p["metadata"]["labels"]["tidal.dev/replica"] == str(replica)
    ]


def test_a_pool_replica_spanning_two_trays_gets_its_own_domain_owned_by_the_pool_and_one_on_a_tray_none():
    cluster = FakeCluster("nvl72", 1, clique=True)
    pool = cluster.add("InferencePool", "ml", "chat", {**SERVE, "tp": 8, "replicas": 2})
    cluster.add("InferencePool", "ml", "small", {**SERVE, "tp": 4, "replicas": 1})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert cluster.status("InferencePool", "ml", "chat")["readyReplicas"] == 2
    domains = domains_of(cluster)
    assert set(domains) == {"chat-replica-0", "chat-replica-1"}, "one per multi-tray replica, none for one tray"
    for r in (0, 1):
        body = domains[f"chat-replica-{r}"]
        owner = body["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "InferencePool",
            "chat",
            pool.uid,
            True,
        )
        assert body["metadata"]["labels"]["tidal.dev/pool"] == "chat"
        pods = _pool_pods(cluster, "chat", r)
        assert len(pods) == 2 and all(claim_of(p) == f"chat-replica-{r}-channel" for p in pods)
        assert all({"name": CLAIM_NAME} in p["spec"]["containers"][0]["resources"]["claims"] for p in pods)
    assert not any(claim_of(p) for p in cluster.pods_of("tidal.dev/pool", "small"))
    assert cluster.status("InferencePool", "ml", "chat")["computeDomains"] == ["chat-replica-0", "chat-replica-1"]
    verbs = [(v, d) for v, d in cluster.calls if v in ("create_compute_domain", "create_pod")]
    assert verbs.index(("create_compute_domain", "chat-replica-0")) < verbs.index(("create_pod", "chat-0-0"))


def test_a_removed_pool_replicas_domain_is_deleted_and_a_failed_delete_retried():
    cluster = FailingDeletes("nvl72", 1, clique=True)
    cluster.add("InferencePool", "ml", "chat", {**SERVE, "tp": 8, "replicas": 2})
    controller = Controller(cluster, FixedClock(NOW))
    controller.demand.window = dt.timedelta(0)  # scale down at once (no stabilization window)
    run(cluster, controller)
    assert len(domains_of(cluster)) == 2
    view = cluster.get("InferencePool", "ml", "chat")
    cluster.objects[("InferencePool", "ml", "chat")] = dataclasses.replace(view, spec={**view.spec, "replicas": 1})
    cluster.failing = 1
    run(cluster, controller, cycles=1)
    status = cluster.status("InferencePool", "ml", "chat")
    assert status["placedReplicas"] == 1 and len(domains_of(cluster)) == 2
    assert status["staleComputeDomains"], "kept until the delete succeeds"
    run(cluster, controller)
    (kept,) = [r["group"] for r in cluster.status("InferencePool", "ml", "chat")["placement"]]
    assert set(domains_of(cluster)) == {f"chat-replica-{kept}"}
    status = cluster.status("InferencePool", "ml", "chat")
    assert status["computeDomains"] == [f"chat-replica-{kept}"] and not status.get("staleComputeDomains")


def test_no_pool_domain_without_a_clique_label():
    cluster = FakeCluster("nvl72", 1)
    cluster.add("InferencePool", "ml", "chat", {**SERVE, "tp": 8, "replicas": 1})
    run(cluster, Controller(cluster, FixedClock(NOW)))
    assert cluster.status("InferencePool", "ml", "chat")["readyReplicas"] == 1
    assert not cluster.compute_domains and not any(claim_of(p) for p in cluster.pods_of("tidal.dev/pool", "chat"))


def _claimed_pods_per_node(cluster: FakeCluster) -> dict[str, int]:
    """Node -> pods on it carrying a ComputeDomain claim (each pod gets its own claim)."""
    out: dict[str, int] = {}
    for pod in cluster.pods.values():
        if claim_of(pod):
            node = pinned_node(pod)
            out[node] = out.get(node, 0) + 1
    return out


def test_a_job_whose_domain_pods_would_share_a_node_is_refused_naming_the_field():
    # Review finding: a node publishes one IMEX channel and each pod claims its own, so the second
    # pod of a domain on a node would wait for the channel forever while the job shows Admitted.
    cluster = FakeCluster("nvl72", 1, clique=True)
    spec = {"tp": 4, "ep": 1, "pp": 1, "dp": 1, "template": TEMPLATE}
    cluster.add("TrainingJob", "ml", "half", {**spec, "gpusPerPod": 2})
    cluster.add("TrainingJob", "ml", "whole", {**spec, "gpusPerPod": 4})
    cluster.add("TrainingJob", "ml", "off", {**spec, "gpusPerPod": 2, "computeDomain": "Disabled"})
    run(cluster, Controller(cluster, FixedClock(NOW)))
    half = cluster.status("TrainingJob", "ml", "half")
    assert half["phase"] == "Pending" and not cluster.pods_of("tidal.dev/job", "half")
    assert "spec.gpusPerPod: 2" in half["reason"] and "spec.computeDomain: Disabled" in half["reason"]
    assert any(c["reason"] == "ComputeDomainPodsShareNode" for c in half["conditions"])
    assert not any(name.startswith("half-") for name in domains_of(cluster))
    assert cluster.status("TrainingJob", "ml", "whole")["phase"] == "Running"
    assert cluster.status("TrainingJob", "ml", "off")["phase"] == "Running"
    assert max(_claimed_pods_per_node(cluster).values()) == 1


def test_pool_replicas_never_put_two_claimed_pods_on_one_node_and_the_pool_says_why():
    # Review finding: two replicas placed in one plan shared a node, each with its own domain.
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.add("InferencePool", "ml", "chat", {**SERVE, "tp": 6, "gpusPerPod": 2, "replicas": 2})
    cluster.add("InferencePool", "ml", "big", {**SERVE, "tp": 8, "replicas": 2})
    run(cluster, Controller(cluster, FixedClock(NOW)))
    assert max(_claimed_pods_per_node(cluster).values()) == 1
    chat = cluster.status("InferencePool", "ml", "chat")
    assert chat.get("placedReplicas", 0) == 0 and not cluster.pods_of("tidal.dev/pool", "chat")
    reason = next(c for c in chat["conditions"] if c["type"] == "Schedulable")
    assert reason["reason"] == "ComputeDomainPodsShareNode" and "spec.gpusPerPod: 2" in reason["message"]
    assert cluster.status("InferencePool", "ml", "big")["placedReplicas"] == 2


def test_a_half_tray_workload_is_refused_before_any_eviction_even_where_holes_would_fit_it():
    # Re-review findings: a check on the plan only let such a job in whenever its first plan
    # happened to land one pod per tray (re-placement and growth could then pack it), and
    # preemption and the rebalancer evicted training for jobs and replicas refused afterwards.
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.add("TrainingJob", "ml", "victim", {**RACK, "preemptible": True, "checkpoint": {"gracePeriodSeconds": 0}})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller)
    assert cluster.status("TrainingJob", "ml", "victim")["phase"] == "Running"
    cluster.add_priority_class("urgent", 100)
    spec = {"tp": 4, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 2, "template": TEMPLATE, "priorityClassName": "urgent"}
    cluster.add("TrainingJob", "ml", "half", spec)
    cluster.add("TrainingJob", "ml", "whole", {**spec, "gpusPerPod": 4})  # the same, on whole trays
    cluster.add("InferencePool", "ml", "chat", {**SERVE, "tp": 6, "gpusPerPod": 2, "replicas": 1})
    run(cluster, controller, cycles=4)
    half = cluster.status("TrainingJob", "ml", "half")
    assert half["phase"] == "Pending" and "placement" not in half
    assert any(c.get("reason") == "ComputeDomainPodsShareNode" for c in half["conditions"])
    assert not cluster.pods_of("tidal.dev/pool", "chat")
    history = cluster.status("TrainingJob", "ml", "victim").get("evictionHistory") or []
    assert [r["reason"] for r in history] == ["Preempted"], "evicted once, for the whole-tray job only"
    assert cluster.status("TrainingJob", "ml", "whole")["phase"] == "Running"


def test_pods_of_more_than_half_a_tray_may_use_domains_and_never_share_one():
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.add(
        "TrainingJob", "ml", "three", {"tp": 3, "ep": 2, "pp": 1, "dp": 1, "gpusPerPod": 3, "template": TEMPLATE}
    )
    run(cluster, Controller(cluster, FixedClock(NOW)))
    assert cluster.status("TrainingJob", "ml", "three")["phase"] == "Running"
    assert max(_claimed_pods_per_node(cluster).values()) == 1


def _domains_per_node(cluster: FakeCluster) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pod in cluster.pods.values():
        if claim_of(pod):
            out.setdefault(pinned_node(pod), set()).add(claim_of(pod))
    return out


def test_a_half_tray_job_admitted_before_domains_is_never_repacked_under_one():
    # Third review: a job admitted while no domain could be made (the CRD came later) was re-placed
    # after a failure by a path the admission rule never saw, packing two claimed pods on a tray.
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.compute_domain_crd = False
    cluster.add(
        "TrainingJob", "ml", "half", {"tp": 4, "ep": 1, "pp": 1, "dp": 2, "gpusPerPod": 2, "template": TEMPLATE}
    )
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=3)
    assert cluster.status("TrainingJob", "ml", "half")["phase"] == "Running"
    cluster.compute_domain_crd = True
    controller.domains.forget()
    run(cluster, controller, cycles=2)
    gone = cluster.pods_of("tidal.dev/job", "half")[0]["metadata"]["name"]
    cluster.delete_pod("ml", gone)  # a pod vanishes: its group must be placed again
    run(cluster, controller, cycles=4)
    assert max(_claimed_pods_per_node(cluster).values(), default=0) <= 1
    half = cluster.status("TrainingJob", "ml", "half")
    assert half["phase"] == "Restarting" and "placement" not in half, "queued as a recovery, placed nowhere"
    assert any(c.get("reason") == "ComputeDomainPodsShareNode" for c in half["conditions"])


def test_a_group_placed_again_holds_its_domain_nodes_whole_in_the_same_cycle():
    # Third review: a re-placed group's trays were booked whole only from the next cycle, so a gang
    # admitted later in the same cycle took their rest under a second domain.
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.add("TrainingJob", "ml", "b", {"tp": 3, "ep": 2, "pp": 1, "dp": 1, "gpusPerPod": 3, "template": TEMPLATE})
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=2)
    lost = cluster.status("TrainingJob", "ml", "b")["placement"][0]["nodes"][0]
    cluster.nodes[lost] = dataclasses.replace(cluster.nodes[lost], ready=False)
    for i in range(40):
        cluster.add(
            "TrainingJob", "ml", f"c{i}", {"tp": 1, "ep": 1, "pp": 1, "dp": 1, "gpusPerPod": 1, "template": TEMPLATE}
        )
    run(cluster, controller, cycles=4)
    assert all(len(claims) == 1 for claims in _domains_per_node(cluster).values()), _domains_per_node(cluster)


def test_a_pool_held_by_the_rule_still_scales_down_and_keeps_its_replicas_reconciled():
    # Third review: the refusal skipped the pool's whole reconcile, freezing replicas placed before.
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.compute_domain_crd = False
    cluster.add("InferencePool", "ml", "chat", {**SERVE, "tp": 6, "gpusPerPod": 2, "replicas": 2})
    clock = FixedClock(NOW)
    controller = Controller(cluster, clock)
    run(cluster, controller, cycles=3)
    assert cluster.status("InferencePool", "ml", "chat")["placedReplicas"] == 2
    cluster.compute_domain_crd = True
    controller.domains.forget()
    view = cluster.get("InferencePool", "ml", "chat")
    cluster.objects[("InferencePool", "ml", "chat")] = dataclasses.replace(view, spec={**view.spec, "replicas": 1})
    run(cluster, controller, cycles=2)
    clock.advance(minutes=6)  # past the scale-down stabilization window
    run(cluster, controller, cycles=3)
    chat = cluster.status("InferencePool", "ml", "chat")
    assert chat["placedReplicas"] == 1, "scaled down although no replica may be added"
    assert max(_claimed_pods_per_node(cluster).values(), default=0) <= 1


def test_pods_placed_packed_before_domains_are_remade_in_place_without_claims():
    # Fourth review: a packed pool placed while no domain could be made; the CRD appears and a tray
    # is drained: its pods were remade in place, each with a claim, four on one tray.
    cluster = FakeCluster("nvl72", 1, clique=True)
    cluster.compute_domain_crd = False
    cluster.add("InferencePool", "ml", "serve", {**SERVE, "tp": 8, "gpusPerPod": 1, "replicas": 1})
    cluster.add(
        "TrainingJob", "ml", "half", {"tp": 4, "ep": 1, "pp": 1, "dp": 2, "gpusPerPod": 1, "template": TEMPLATE}
    )
    controller = Controller(cluster, FixedClock(NOW))
    run(cluster, controller, cycles=3)
    cluster.compute_domain_crd = True
    controller.domains.forget()
    run(cluster, controller, cycles=2)
    for key in [k for k, p in cluster.pods.items() if pinned_node(p) == "nvl72-0000-n00"]:
        del cluster.pods[key]  # a drained tray: its pods are made again where they were
    run(cluster, controller, cycles=3)
    assert cluster.pods_of("tidal.dev/pool", "serve"), "remade"
    assert max(_claimed_pods_per_node(cluster).values(), default=0) <= 1, _claimed_pods_per_node(cluster)
