"""CI smoke of `bench.floor` (issue 36): the floor a gang's start is measured against, on the
shared KWOK cluster. No timing is asserted: that the pods run where they were put, and that the
floor's path costs the API server one pod write per pod (the create), which makes it a floor."""

from __future__ import annotations

from bench.floor import bare_pods, copies_of, floor_running

from .kube import Kube


def ready_untainted_nodes(kube: Kube, count: int) -> list[str]:
    nodes = [
        n
        for n in kube.get("nodes")["items"]
        if not n["spec"].get("taints")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
    ]
    return sorted(n["metadata"]["name"] for n in nodes)[:count]


def test_the_floor_creates_pods_on_their_nodes_with_one_write_each(kube: Kube):
    nodes = ready_untainted_nodes(kube, 8)
    assert len(nodes) == 8
    result = floor_running(kube, bare_pods(nodes * 3), timeout=180, keep=True)
    namespace = result["floor_namespace"]
    try:
        pods = kube.get("pods", "-n", namespace)["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(nodes * 3)
        assert all(p["status"].get("phase") == "Running" for p in pods)
        assert result["floor_created_s"] > 0
        # Creates only: no binding (nodeName is set), no gate patch. The count is the API
        # server's and cluster-wide (another writer could add to it): three writes a pod would
        # be 72, one 24.
        assert result["floor_api_writes"].get("POST", 0) >= 24
        assert result["floor_api_writes_per_pod"] < 1.5
    finally:
        kube.delete("namespace", namespace)
        kube.run("wait", "--for=delete", f"namespace/{namespace}", "--timeout=90s", check=False)


def test_the_floor_copies_a_gang_pod_without_its_gates_owner_or_tidal_labels():
    pod = {
        "metadata": {
            "name": "job-1",
            "namespace": "ml",
            "uid": "u",
            "resourceVersion": "9",
            "labels": {"tidal.dev/job": "job", "app": "trainer"},
            "annotations": {"tidal.dev/world-size": "16"},
            "ownerReferences": [{"kind": "TrainingJob", "name": "job", "uid": "o"}],
        },
        "spec": {"nodeName": "n-7", "schedulingGates": [], "containers": [{"name": "c", "env": [{"name": "RANK"}]}]},
        "status": {"phase": "Running"},
    }
    (copy,) = copies_of([pod])
    assert copy["metadata"] == {
        "name": "floor-0",
        "namespace": "ml",
        "labels": {"app": "trainer", "bench": "floor"},
        "annotations": {"tidal.dev/world-size": "16"},
    }
    assert copy["spec"] == {"nodeName": "n-7", "containers": [{"name": "c", "env": [{"name": "RANK"}]}]}
    assert "status" not in copy and pod["spec"]["schedulingGates"] == []  # the original is untouched
