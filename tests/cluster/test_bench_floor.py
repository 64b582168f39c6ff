"""CI smoke of `bench.floor` (issue 36): the floor a gang's start is measured against, on the
shared KWOK cluster. No timing is asserted: that the pods run, and that the floor's path costs
the API server one pod write per pod (the create), which is what makes it a floor."""

from __future__ import annotations

from bench.floor import NAMESPACE, floor_running

from .kube import Kube


def test_the_floor_creates_pods_on_their_nodes_with_one_write_each(kube: Kube):
    nodes = sorted(n["metadata"]["name"] for n in kube.get("nodes")["items"])[:8]
    try:
        result = floor_running(kube, nodes * 3, timeout=180, keep=True)
        assert result["floor_pods"] == 24
        assert 0 < result["floor_created_s"] <= result["floor_running_s"]
        pods = kube.get("pods", "-n", NAMESPACE)["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(nodes * 3)
        assert all(p["status"].get("phase") == "Running" for p in pods)
        # Creates only: no binding (nodeName is set), no gate patch. The count is the API server's
        # and cluster-wide, so another writer could add to it, never take from it.
        assert result["floor_api_writes"].get("POST", 0) >= 24
    finally:
        kube.delete("namespace", NAMESPACE)
        kube.run("wait", "--for=delete", f"namespace/{NAMESPACE}", "--timeout=90s", check=False)
