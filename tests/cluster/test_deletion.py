"""A deleted TrainingJob or InferencePool goes even when the call that would let it go fails once.

kopf keeps its finalizer on every object with a timer (tidal's cycle ticks from them) and takes it
off when the object is deleted, in one JSON patch. If that patch fails with an error kopf does not
retry (a 409, say), kopf retries only on the object's next watch event, and a deleted job gets none:
no status is written to it and its timer has stopped. Found by the fault run
(tests/cluster/test_faults.py): a job deleted mid-run was still there, finalizer and all, three
minutes later. Here the proxy refuses exactly that patch, once."""

from __future__ import annotations

from bench.fault_proxy import PathRule

from tidal.k8s.deletions import FINALIZER, NUDGE_ANNOTATION

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .proxied import operator_behind_proxy
from .test_operator import job, submit, wait_phase
from .test_tide import pool, pool_status


def gone(kube: Kube, namespace: str, kind: str, name: str) -> bool:
    found = kube.run("get", kind, name, "-n", namespace, "--ignore-not-found", "-o", "name")
    return not found.stdout.strip()


def test_deleted_objects_go_although_their_finalizer_removal_was_refused(
    kube: Kube, operator: OperatorProcess, namespace: str, tmp_path
):
    with operator_behind_proxy(kube, operator, namespace, tmp_path, ()) as (proxy, own):
        submit(kube, namespace, job("doomed", tp=4, ep=1, pp=1, dp=1), pool("doomed-pool", minReplicas=1))
        wait_phase(kube, namespace, "doomed", "Running")
        eventually(
            lambda: pool_status(kube, namespace, "doomed-pool").get("readyReplicas") == 1,
            timeout=90,
            what="the pool's replica Ready",
        )
        for kind, name in (("trainingjob", "doomed"), ("inferencepool", "doomed-pool")):
            meta = kube.get(kind, name, "-n", namespace)["metadata"]
            assert FINALIZER in meta.get("finalizers", []), meta
        # From now on, the first JSON patch that removes something from each (kopf's release of its
        # finalizer: tidal itself never removes anything from them) is refused with a 409, which kopf
        # does not retry; the nudges tidal writes are recorded.
        removal, nudge = b'"remove"', NUDGE_ANNOTATION.encode()
        paths = [f"/namespaces/{namespace}/trainingjobs/doomed", f"/namespaces/{namespace}/inferencepools/doomed-pool"]
        proxy.rates.rules = tuple(
            rule
            for path in paths
            for rule in (
                PathRule("PATCH", path, "conflict_409", body_part=removal, times=1),
                PathRule("PATCH", path, "record", body_part=nudge),
            )
        )
        kube.delete("trainingjob", "doomed", "-n", namespace)
        kube.delete("inferencepool", "doomed-pool", "-n", namespace)
        eventually(lambda: proxy.injected["conflict_409"] >= 2, timeout=30, what="both finalizer removals refused")
        eventually(lambda: gone(kube, namespace, "trainingjob", "doomed"), timeout=60, what="the deleted job gone")
        eventually(lambda: gone(kube, namespace, "inferencepool", "doomed-pool"), timeout=60, what="the pool gone")
        # Freed by the nudges, not by something else: each was nudged before it went.
        nudged = {path for (method, path, _), times in proxy.arrivals.items() if method == "PATCH" and times}
        assert all(any(p.endswith(path) for p in nudged) for path in paths), nudged
        assert own.proc is not None and own.proc.poll() is None, "the operator died"
