"""Ownership by controller uid, never by label, on the real cluster (issue 13, 'Tenancy and
security'): a tenant's pods that wear a real job's labels are foreign; a job deleted and made
again under the same name neither adopts nor deletes the old job's pods, which keep their GPUs
booked until they are gone."""

from __future__ import annotations

import json
import time
from collections import Counter

from bench.fault_proxy import PathRule

from tidal.k8s.compact import from_wire

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .proxied import assert_no_gpu_overbooked, operator_behind_proxy
from .test_operator import assert_gangs_sound, job, node_supernodes, pods_of, status, submit, wait_phase
from .test_tenancy import foreign_pod

HOLD = "tidal.dev/test-hold"
"""A finalizer of the test's: KWOK deletes a pod at once, so this keeps one terminating, as a long
grace period on a real kubelet would."""
GC_HOLD = "tidal-test/gc-hold"
"""Pods with this label cannot be deleted (a ValidatingAdmissionPolicy of the test's): the garbage
collector has not got to them yet, deterministically, rather than for the second it usually takes."""


def owned_by(pod: dict, uid: str) -> bool:
    return any(r.get("controller") and r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or [])


def test_tenant_pods_wearing_a_real_jobs_labels_are_foreign(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    """Issue 13, 'Tenancy and security': ownership is read from the controller ownerReference,
    never the tidal.dev/job label. A tenant's own GPU pods, bound by nodeName and labelled as pods
    of a real, running job, hold 12 GPUs of a rack: tidal must count them as used (a gang needing
    64 GPUs on every rack waits) and must not treat them as the job's (never delete or touch them).
    Fails when ownership falls back to the label: the job deletes them as pods it did not place,
    and the gang is placed on the rack they held."""
    submit(kube, namespace, job("real", tp=4, ep=1, pp=1, dp=1))
    st = wait_phase(kube, namespace, "real", "Running")
    real_rack = from_wire(st)["placement"][0]["supernode"]
    rack = next(r for r in sorted(set(node_supernodes(kube).values())) if r != real_rack)
    disguise = {"tidal.dev/job": "real", "tidal.dev/hbd-group": "0", "tidal.dev/rank": "0"}
    tenant = [foreign_pod(f"tenant-{i}", f"{rack}-n{i:02d}", disguise) for i in range(3)]
    for pod in tenant:
        pod["metadata"]["namespace"] = namespace
    kube.apply(*tenant)
    names = [p["metadata"]["name"] for p in tenant]
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.get("pods", "-n", namespace)["items"]}

    def intact() -> bool:
        """The tenant's pods as the tenant made them: tidal never deleted, annotated or relabelled one."""
        current = {p["metadata"]["name"]: p["metadata"] for p in kube.get("pods", "-n", namespace)["items"]}
        for name in names:
            meta = current.get(name)
            assert meta and meta["uid"] == uids[name] and not meta.get("deletionTimestamp"), (
                f"tidal deleted the tenant's pod {name}"
            )
            assert meta["labels"] == disguise, f"tidal relabelled the tenant's pod {name}: {meta['labels']}"
            assert not [a for a in meta.get("annotations") or {} if "tidal.dev" in a], f"tidal annotated {name}"
        return True

    eventually(
        lambda: intact() and kube.get("supernode", rack).get("status", {}).get("gpus", {}).get("free") == 72 - 12,
        timeout=60,
        what=f"{rack} showing the tenant's 12 GPUs as used",
    )
    submit(kube, namespace, job("all-racks", tp=4, ep=16, pp=1, dp=8))
    eventually(lambda: status(kube, namespace, "all-racks").get("conditions"), timeout=30, what="all-racks status")
    time.sleep(3)  # cycles run every second: a wrong admission or deletion would have been made by now
    st = from_wire(status(kube, namespace, "all-racks"))
    assert st["phase"] == "Pending" and not st.get("placement"), st
    assert pods_of(kube, namespace, "all-racks") == []
    assert intact()
    real = kube.get("trainingjob", "real", "-n", namespace)
    ours = [p for p in pods_of(kube, namespace, "real") if owned_by(p, real["metadata"]["uid"])]
    assert [p["metadata"]["name"] for p in ours] == ["real-0"] and real["status"]["phase"] == "Running"
    assert_no_gpu_overbooked(kube)
    assert_gangs_sound(kube)


def gc_hold(namespace: str) -> list[dict]:
    """A policy and binding refusing every DELETE of a pod labelled GC_HOLD in `namespace`."""
    name = f"gc-hold-{namespace}"[:63]
    group = "admissionregistration.k8s.io/v1"
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["pods"]}
    return [
        {
            "apiVersion": group,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [rule]},
                "matchConditions": [
                    {
                        "name": "held",
                        "expression": f"has(oldObject.metadata.labels) && '{GC_HOLD}' in oldObject.metadata.labels",
                    }
                ],
                "validations": [{"expression": "false", "message": "held by the test (the GC is late)"}],
            },
        },
        {
            "apiVersion": group,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
        },
    ]


def release_gc_hold(kube: Kube, namespace: str) -> None:
    name = f"gc-hold-{namespace}"[:63]
    kube.delete("validatingadmissionpolicybinding", name)
    kube.delete("validatingadmissionpolicy", name)


def test_a_job_made_again_at_once_neither_adopts_nor_books_over_the_old_pods(
    kube: Kube, operator: OperatorProcess, namespace: str, tmp_path
):
    """Issue 13, 'Tenancy and security': ownership by controller uid. A job is deleted and made
    again at once under the same name while the old job's pods are still there: first before the
    garbage collector has deleted them (held by an admission policy), then terminating (held by a
    finalizer). While only the old pods' rack is open the new job must not be placed (their GPUs
    stay booked); once other racks open it is placed there, but sends no delete or patch to the old
    pods (not its own) and makes its pods only once their names are free, then runs. Fails when a
    gone job's pods are not booked (placed onto their GPUs) and when pods are matched to the job by
    name rather than owner uid (the new job deletes the old job's pods as its own misplaced ones)."""
    pod_path = f"/namespaces/{namespace}/pods/again-"
    rules = (PathRule("DELETE", pod_path, "record"), PathRule("PATCH", pod_path, "record"))
    old_rack = sorted(set(node_supernodes(kube).values()))[0]
    spec = {"tp": 4, "ep": 16, "pp": 1, "dp": 1}  # one group of 64 GPUs: 16 pods on one 72-GPU rack
    try:
        kube.run("cordon", "-l", f"tidal.dev/supernode!={old_rack}")
        with operator_behind_proxy(kube, operator, namespace, tmp_path, rules) as (proxy, _):
            submit(kube, namespace, job("again", **spec))
            wait_phase(kube, namespace, "again", "Running", timeout=120)
            old = {p["metadata"]["name"]: p for p in pods_of(kube, namespace, "again")}
            old_uid = kube.get("trainingjob", "again", "-n", namespace)["metadata"]["uid"]
            assert len(old) == 16 and all(owned_by(p, old_uid) for p in old.values())
            hold = json.dumps({"metadata": {"finalizers": [HOLD], "labels": {GC_HOLD: "true"}}})
            for name in old:
                kube.run("patch", "pod", name, "-n", namespace, "--type=merge", "-p", hold)
            kube.apply(*gc_hold(namespace))
            dry_run = ("delete", "pod", "again-0", "-n", namespace, "--dry-run=server")
            eventually(
                lambda: "held by the test" in kube.run(*dry_run, check=False).stderr,
                timeout=30,
                what="the admission policy refusing deletes of the old pods",
            )

            def old_pods_there(terminating: bool) -> bool:
                pods = {p["metadata"]["name"]: p for p in pods_of(kube, namespace, "again")}
                assert {n: p["metadata"]["uid"] for n, p in pods.items()} == {
                    n: p["metadata"]["uid"] for n, p in old.items()
                }, "a pod of the new job exists while the old job's pods hold the names"
                return all(bool(p["metadata"].get("deletionTimestamp")) == terminating for p in pods.values())

            def untouched() -> None:
                touched = sorted(
                    {f"{m} {path}" for (m, path, _), times in proxy.arrivals.items() if max(times) >= deleted_at}
                )
                assert not touched, f"the new job wrote to the old job's pods: {touched}"

            deleted_at = time.monotonic()
            kube.run("delete", "trainingjob", "again", "-n", namespace, "--wait=true", "--timeout=60s")
            submit(kube, namespace, job("again", **spec))
            new_uid = kube.get("trainingjob", "again", "-n", namespace)["metadata"]["uid"]
            assert new_uid != old_uid

            # Only the old rack is open, and the old pods still hold 64 of its 72 GPUs.
            eventually(lambda: status(kube, namespace, "again").get("conditions"), timeout=30, what="new job status")
            time.sleep(3)  # a wrong placement would have been made by now
            st = from_wire(status(kube, namespace, "again"))
            assert not st.get("placement"), f"placed onto the GPUs the old pods still hold: {st}"
            assert old_pods_there(terminating=False), "the garbage collector got there: the test's hold failed"
            assert_no_gpu_overbooked(kube)

            # Room elsewhere: placed there, while the old pods are not yet deleted, then terminating.
            kube.run("uncordon", "-l", "tidal.dev/supernode")
            st = eventually(
                lambda: (s := from_wire(status(kube, namespace, "again"))).get("placement") and s,
                timeout=60,
                what="the new job placed on another rack",
            )
            assert old_rack not in {g["supernode"] for g in st["placement"]}
            booked = Counter({n: 4 for g in st["placement"] for n in g["nodes"]})
            for terminating in (False, True):
                if terminating:  # the garbage collector's turn: the finalizer keeps them terminating
                    release_gc_hold(kube, namespace)
                    eventually(  # refused until the API server has dropped the policy
                        lambda: (
                            kube.run(
                                "delete", "pods", "-n", namespace, "-l", GC_HOLD, "--wait=false", check=False
                            ).returncode
                            == 0
                        ),
                        timeout=30,
                        what="the old pods deleted",
                    )
                    eventually(lambda: old_pods_there(terminating=True), timeout=30, what="old pods terminating")
                time.sleep(3)  # a reconcile adopting or deleting the old pods would have run by now
                assert old_pods_there(terminating)
                untouched()
                assert status(kube, namespace, "again")["phase"] != "Running", "Running on the old job's pods"
                assert_no_gpu_overbooked(kube, booked)

            release = json.dumps({"metadata": {"finalizers": None}})
            for name in old:
                kube.run("patch", "pod", name, "-n", namespace, "--type=merge", "-p", release)
            st = wait_phase(kube, namespace, "again", "Running", timeout=120)
            pods = pods_of(kube, namespace, "again")
            assert len(pods) == 16 and all(owned_by(p, new_uid) for p in pods)
            nodes = {n for g in from_wire(st)["placement"] for n in g["nodes"]}
            assert {p["spec"]["nodeName"] for p in pods} == nodes
            assert_no_gpu_overbooked(kube)
            assert_gangs_sound(kube)
    finally:
        release_gc_hold(kube, namespace)
        kube.run("uncordon", "-l", "tidal.dev/supernode", check=False)
        for p in kube.get("pods", "-n", namespace)["items"]:
            if HOLD in (p["metadata"].get("finalizers") or []):
                kube.run(
                    "patch",
                    "pod",
                    p["metadata"]["name"],
                    "-n",
                    namespace,
                    "--type=merge",
                    "-p",
                    json.dumps({"metadata": {"finalizers": None}}),
                    check=False,
                )
