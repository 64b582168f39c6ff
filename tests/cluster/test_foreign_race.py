"""A foreign pod races into a node tidal planned, between the plan and the gates' removal: the
window is held open by the fault proxy, so the race happens every run, not now and then."""

from __future__ import annotations

from bench.fault_proxy import PathRule

from tidal.k8s.compact import from_wire

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .proxied import assert_no_gpu_overbooked, operator_behind_proxy
from .test_operator import assert_gangs_sound, job, node_supernodes, pods_of, status, submit
from .test_tenancy import foreign_pod

HOLD_SECONDS = 10
"""How long the first gate removal of each pod is held: the foreign pod lands well inside it."""


def planned_index(planned: dict[int, dict], node: str) -> int:
    """The rank index (pod name suffix) of the pod planned on `node`: pods are numbered group by group."""
    per_group = len(planned[0]["nodes"])
    return next(g * per_group + i for g, e in planned.items() for i, n in enumerate(e["nodes"]) if n == node)


def test_a_foreign_pod_on_a_planned_node_has_the_group_placed_again(
    kube: Kube, operator: OperatorProcess, namespace: str, tmp_path
):
    """Issue 13, 'Coexistence and faults': a foreign pod racing into a planned node is detected and
    its group re-planned. The job's pods exist, pinned and gated; a tenant pod given nodeName takes
    all the GPUs of one planned node before the gates lift. Fails when the displacement is not
    detected (`_displaced_groups` finding nothing): the pinned pod stays Pending behind the foreign
    one and the job never runs (the admission timeout, which would also move it, is off)."""
    rules = (PathRule("PATCH", f"/namespaces/{namespace}/pods/", "delay", first=1, hang_seconds=HOLD_SECONDS),)
    with operator_behind_proxy(kube, operator, namespace, tmp_path, rules, "--admission-timeout", "0") as (proxy, _):
        submit(kube, namespace, job("raced", tp=4, ep=4, pp=1, dp=2))  # 2 groups of 4 pods of 4 GPUs
        # Gates are lifted only once every pod exists on its planned node: a held PATCH means the
        # plan is recorded and the pods are made.
        eventually(lambda: proxy.injected["delay"] >= 1, timeout=90, interval=0.1, what="a gate removal held")
        planned = {g["group"]: g for g in from_wire(status(kube, namespace, "raced"))["placement"]}
        target = planned[1]["nodes"][0]
        pods = pods_of(kube, namespace, "raced")
        assert len(pods) == 8 and all(p["spec"].get("schedulingGates") for p in pods), "the window is not open"
        assert not [p for p in pods if p["spec"].get("nodeName")], "a pod was bound before its gate was lifted"
        # Nothing is bound on the target yet, so a real kubelet admits the foreign pod (bench.faults
        # deletes, as a kubelet would refuse, only those sent to nodes whose bound pods fill them).
        squatter = foreign_pod("squatter", target, {"app": "tenant"})
        squatter["metadata"]["namespace"] = namespace
        kube.apply(squatter)
        ours = kube.get("pod", f"raced-{planned_index(planned, target)}", "-n", namespace)
        assert ours["spec"].get("schedulingGates"), "the foreign pod came after the gates lifted: no race"

        def running() -> dict:
            st = status(kube, namespace, "raced")
            assert st.get("phase") == "Running", f"{st.get('phase')}: {st.get('reason')}"
            return st

        st = eventually(running, timeout=150, what="raced Running")
        placed = {g["group"]: g for g in from_wire(st)["placement"]}
        assert placed[0]["nodes"] == planned[0]["nodes"], "the group nobody displaced was moved"
        assert target not in placed[1]["nodes"], f"group 1 still planned on {target}: {placed[1]}"
        where = node_supernodes(kube)
        pods = pods_of(kube, namespace, "raced")
        assert len(pods) == 8
        by_group: dict[int, set[str]] = {}
        for p in pods:
            assert p["status"]["phase"] == "Running" and p["spec"]["nodeName"] != target, p["metadata"]["name"]
            by_group.setdefault(int(p["metadata"]["labels"]["tidal.dev/hbd-group"]), set()).add(
                where[p["spec"]["nodeName"]]
            )
        assert all(len(s) == 1 for s in by_group.values()), f"a group spans supernodes: {by_group}"
        assert int(st.get("restarts") or 0) == 0, "a displacement is not a failure restart"
        events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=raced")["items"]
        replaced = [e for e in events if e["reason"] == "Replaced"]
        assert replaced and target in replaced[0]["message"] and replaced[0]["type"] == "Warning", [
            (e["reason"], e["message"]) for e in events
        ]
        assert kube.get("pod", "squatter", "-n", namespace)["status"]["phase"] == "Running", "the tenant's pod"
        assert_no_gpu_overbooked(kube)
        assert_gangs_sound(kube)
