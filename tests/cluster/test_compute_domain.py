"""ComputeDomains on the real API server with the NVIDIA DRA driver's real CRDs, kube-scheduler
allocating every pod's channel claim (DRA, resource.k8s.io/v1) on KWOK GB200-like nodes.

The test plays the NVIDIA DRA driver's part, which needs real GPUs: its kubelet plugin would
publish one IMEX channel per node in a ResourceSlice, and its controller would turn each
ComputeDomain into the ResourceClaimTemplate it names. KWOK fakes the kubelet, so a claim is
never "prepared" on a node and no IMEX daemon runs: the domains' status stays as created.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tidal.k8s.compact import from_wire
from tidal.k8s.compute_domains import RECHECK_SECONDS

from ..evictions import rebalanced_past_grace
from .kube import REPO, Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import TEMPLATE, assert_gangs_sound, node_supernodes, pods_of, status, submit

FIXTURES = REPO / "tests" / "fixtures" / "third_party" / "nvidia-dra-driver-gpu"
CRDS = [
    FIXTURES / "resource.nvidia.com_computedomains.yaml",
    FIXTURES / "resource.nvidia.com_computedomaincliques.yaml",
]
DRIVER = "compute-domain.nvidia.com"
DEVICE_CLASS = "compute-domain-default-channel.nvidia.com"
CLAIM = "compute-domain"
RACK_JOB = {"tp": 4, "ep": 18, "pp": 1, "gpusPerPod": 4, "template": TEMPLATE}
"""One HBD group of 72 GPUs: one whole NVL72 rack (18 trays x 4 GPUs), 18 pods."""


def device_class() -> dict:
    """The driver's DeviceClass from its Helm template: the lines holding Go templates dropped and
    the API version the chart would fill in (resource.k8s.io/v1 in Kubernetes 1.36) set."""
    text = Path(FIXTURES / "deviceclass-compute-domain-default-channel.helm-template.yaml").read_text()
    body = yaml.safe_load("\n".join(line for line in text.splitlines() if "{{" not in line))
    body["apiVersion"] = "resource.k8s.io/v1"
    assert body["metadata"]["name"] == DEVICE_CLASS
    return body


def channel_slice(node: str) -> dict:
    """What the driver's kubelet plugin publishes for a node: its IMEX channel 0."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}", "labels": {"tidal.dev/test": "compute-domain"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}}],
        },
    }


def claim_template(namespace: str, name: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": {"tidal.dev/test": "compute-domain"}},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}
        },
    }


class DriverController(threading.Thread):
    """The driver's controller, as far as scheduling needs it: each ComputeDomain's template."""

    def __init__(self, kube: Kube):
        super().__init__(daemon=True)
        self.kube = kube
        self.stopped = threading.Event()
        self.made: set[tuple[str, str]] = set()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                domains = self.kube.get("computedomains", "-A")["items"]
            except AssertionError:
                continue
            for cd in domains:
                key = (cd["metadata"]["namespace"], cd["spec"]["channel"]["resourceClaimTemplate"]["name"])
                if key not in self.made and self.kube.apply(claim_template(*key), check=False).returncode == 0:
                    self.made.add(key)


@pytest.fixture(scope="module")
def dra_driver(kube: Kube, operator: OperatorProcess) -> Iterator[DriverController]:
    for crd in CRDS:
        kube.run("apply", "--server-side", "-f", str(crd))
        kube.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crd))
    nodes = [n["metadata"]["name"] for n in kube.get("nodes")["items"]]
    kube.apply(device_class(), *(channel_slice(n) for n in nodes))
    driver = DriverController(kube)
    driver.start()
    time.sleep(RECHECK_SECONDS + 1)  # the operator notices the CRD (it asks again at most this often)
    yield driver
    driver.stopped.set()
    driver.join(10)
    for crd in CRDS:
        kube.run("delete", "--ignore-not-found", "-f", str(crd))
    kube.run("delete", "resourceslices", "-l", "tidal.dev/test=compute-domain", "--ignore-not-found")
    kube.delete("deviceclass", DEVICE_CLASS)
    time.sleep(RECHECK_SECONDS + 1)  # later tests' jobs must not get claims nobody can allocate


def rack_job(name: str, **spec) -> dict:
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {**RACK_JOB, **spec},
    }


def domains(kube: Kube, namespace: str) -> dict[str, dict]:
    return {cd["metadata"]["name"]: cd for cd in kube.get("computedomains", "-n", namespace)["items"]}


def assert_domains_and_claims_consistent(kube: Kube, namespace: str, job: str) -> dict[int, str]:
    """One domain per rack the job uses, owned by the job; every pod claims its rack's domain and
    its claim is allocated (by kube-scheduler) on the pod's own node and reserved for the pod; no
    node's channel serves two domains. Returns group -> rack."""
    st = from_wire(status(kube, namespace, job))
    rack_of = {g["group"]: g["supernode"] for g in st["placement"]}
    where = node_supernodes(kube)
    cds = domains(kube, namespace)
    assert set(cds) == {f"{job}-{r}" for r in rack_of.values()}, (sorted(cds), rack_of)
    assert sorted(st["computeDomains"]) == sorted(cds)
    uid = kube.get("trainingjob", job, "-n", namespace)["metadata"]["uid"]
    for cd in cds.values():
        owner = cd["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainingJob", uid, True)
    claims = {c["metadata"]["name"]: c for c in kube.get("resourceclaims", "-n", namespace)["items"]}
    channel_users: dict[str, set[str]] = {}
    pods = [p for p in pods_of(kube, namespace, job) if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 18 * len(rack_of)
    for pod in pods:
        group = int(pod["metadata"]["labels"]["tidal.dev/hbd-group"])
        rack, node = rack_of[group], pod["spec"]["nodeName"]
        # A pod on a deleted node outlives it until the operator (or pod GC) removes it.
        assert where.get(node) == rack, (pod["metadata"]["name"], node, rack)
        template = f"{job}-{rack}-channel"
        assert pod["spec"]["resourceClaims"] == [{"name": CLAIM, "resourceClaimTemplateName": template}]
        assert {"name": CLAIM} in pod["spec"]["containers"][0]["resources"]["claims"]
        made = {s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])}
        claim = claims[made[CLAIM]]
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [(DRIVER, node, "channel-0")]
        assert {r["uid"] for r in claim["status"]["reservedFor"]} == {pod["metadata"]["uid"]}
        channel_users.setdefault(node, set()).add(template)
    assert all(len(t) == 1 for t in channel_users.values()), "a node's channel serves one domain"
    return rack_of


def running_with_claims(
    kube: Kube, namespace: str, job: str, restarts: int = 0, other_than: dict[int, str] | None = None
) -> dict[int, str]:
    """group -> rack once the job runs with every claim allocated (and, given `other_than`, with
    its groups' racks no longer those)."""

    def settled():
        st = status(kube, namespace, job)
        if st.get("phase") != "Running" or st.get("restarts", 0) != restarts:
            return None
        # A lost node charges no restart, so only the placement tells the re-placed job from the
        # one still recorded on the lost node: check it before its pods.
        placed = from_wire(st)["placement"]
        if other_than is not None and {g["group"]: g["supernode"] for g in placed} == other_than:
            return None
        return assert_domains_and_claims_consistent(kube, namespace, job)

    return eventually(settled, timeout=180, interval=2, what=f"{job} Running with its domains' claims allocated")


def test_two_rack_moe_job_runs_with_one_domain_per_rack_and_every_claim_allocated_on_its_node(
    kube: Kube, running_operator: OperatorProcess, namespace: str, dra_driver: DriverController
):
    submit(kube, namespace, rack_job("moe", dp=2))
    rack_of = running_with_claims(kube, namespace, "moe")
    assert len(set(rack_of.values())) == 2
    cd = domains(kube, namespace)[f"moe-{rack_of[0]}"]
    assert cd["spec"] == {
        "numNodes": 0,
        "channel": {"allocationMode": "Single", "resourceClaimTemplate": {"name": f"moe-{rack_of[0]}-channel"}},
    }, "accepted by the real schema (allocationMode filled from its default)"
    # No IMEX daemon on KWOK, so no driver ever reports the domain Ready (its status is not even
    # written): the job is Running all the same, as tidal does not hold the gates for Ready.
    assert cd.get("status", {}).get("status", "NotReady") == "NotReady"
    assert {(namespace, f"moe-{r}-channel") for r in rack_of.values()} <= dra_driver.made
    conditions = {c["type"]: c for c in status(kube, namespace, "moe")["conditions"]}
    assert conditions["ComputeDomain"]["status"] == "True"
    assert_gangs_sound(kube)

    kube.run("delete", "trainingjob", "moe", "-n", namespace)
    eventually(lambda: not domains(kube, namespace), timeout=60, what="domains deleted with their job")


def test_shrink_off_a_rack_deletes_its_domain_and_keeps_the_other(
    kube: Kube, running_operator: OperatorProcess, namespace: str, dra_driver: DriverController
):
    submit(kube, namespace, rack_job("elastic", dp=2, preemptible=True, elastic={"minDP": 1, "maxDP": 2}))
    rack_of = running_with_claims(kube, namespace, "elastic")
    # What preemption or the rebalancer writes to give back DP replica 1, its grace period long
    # over: the operator does the rest.
    eviction = rebalanced_past_grace([1])
    kube.run(
        "patch", "trainingjob", "elastic", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", yaml.safe_dump({"status": {"eviction": eviction}}),
    )  # fmt: skip
    eventually(
        lambda: (
            status(kube, namespace, "elastic").get("currentDP") == 1
            and set(domains(kube, namespace)) == {f"elastic-{rack_of[0]}"}
        ),
        timeout=90,
        what="shrunk to dp 1 with only its remaining rack's domain",
    )
    eventually(lambda: len(pods_of(kube, namespace, "elastic")) == 18, timeout=90, what="replica 1's pods gone")
    assert running_with_claims(kube, namespace, "elastic") == {0: rack_of[0]}


def test_group_re_placed_after_node_loss_gets_a_domain_on_its_new_rack(
    kube: Kube, running_operator: OperatorProcess, namespace: str, dra_driver: DriverController, restore_nodes
):
    submit(kube, namespace, rack_job("moe", dp=2))
    before = running_with_claims(kube, namespace, "moe")
    victim = next(p for p in pods_of(kube, namespace, "moe") if p["metadata"]["labels"]["tidal.dev/hbd-group"] == "1")
    kube.run("delete", "node", victim["spec"]["nodeName"])  # the rack is full: group 1 must move
    after = running_with_claims(kube, namespace, "moe", other_than=before)  # a lost node: no restart charged
    assert after[0] == before[0] and after[1] not in before.values()
    assert f"moe-{before[1]}" not in domains(kube, namespace), "the rack it left keeps no domain"
    assert_gangs_sound(kube)


def test_pool_replica_spanning_two_trays_gets_its_own_domain_with_its_pods_claims_allocated(
    kube: Kube, running_operator: OperatorProcess, namespace: str, dra_driver: DriverController
):
    """tp=8 on 4-GPU trays: each replica is 2 pods on 2 trays of a rack, which need an IMEX channel."""
    pool = {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "InferencePool",
        "metadata": {"name": "chat"},
        "spec": {"minReplicas": 0, "maxReplicas": 2, "replicas": 2, "tp": 8, "gpusPerPod": 4, "template": TEMPLATE},
    }
    submit(kube, namespace, pool)
    wanted = {"chat-replica-0", "chat-replica-1"}

    def settled():
        st = kube.get("inferencepools.tidal.dev", "chat", "-n", namespace).get("status", {})
        return st if st.get("readyReplicas") == 2 and set(domains(kube, namespace)) == wanted else None

    st = eventually(settled, timeout=180, interval=2, what="2 ready replicas, each with its domain")
    assert sorted(st["computeDomains"]) == sorted(wanted)
    uid = kube.get("inferencepools.tidal.dev", "chat", "-n", namespace)["metadata"]["uid"]
    for cd in domains(kube, namespace).values():
        owner = cd["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("InferencePool", uid, True)
    claims = {c["metadata"]["name"]: c for c in kube.get("resourceclaims", "-n", namespace)["items"]}
    pods = kube.get("pods", "-n", namespace, "-l", "tidal.dev/pool=chat")["items"]
    assert len(pods) == 4
    for pod in pods:
        template = f"chat-replica-{pod['metadata']['labels']['tidal.dev/replica']}-channel"
        assert pod["spec"]["resourceClaims"] == [{"name": CLAIM, "resourceClaimTemplateName": template}]
        made = {s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses", [])}
        results = claims[made[CLAIM]]["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, pod["spec"]["nodeName"])]
    kube.run("delete", "inferencepool.tidal.dev", "chat", "-n", namespace)
    eventually(lambda: not domains(kube, namespace), timeout=60, what="domains deleted with their pool")
