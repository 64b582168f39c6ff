"""An operator of the test's own behind the fault proxy, and a GPU audit that counts every pod."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bench.fault_proxy import FaultProxy, FaultRates, PathRule

from .kube import Kube
from .operator_process import OperatorProcess
from .test_operator import GPU


@contextlib.contextmanager
def operator_behind_proxy(
    kube: Kube, session: OperatorProcess, namespace: str, workdir: Path, rules: tuple[PathRule, ...], *extra: str
) -> Iterator[tuple[FaultProxy, OperatorProcess]]:
    """No random faults: only `rules`. The session operator is stopped first (two operators sharing
    one peering identity would both act); `running_operator` restarts it for the tests after."""
    session.stop()
    proxy = FaultProxy(kube.kubeconfig, FaultRates(rate=0.0, watch_cut_rate=0.0, rules=rules)).start()
    own = OperatorProcess(
        proxy.operator_kubeconfig(workdir / "proxy.kubeconfig"),
        workdir,
        "--discover-supernodes",
        "tidal.dev/supernode",
        *extra,
    )
    try:
        own.start()
        yield proxy, own
    finally:
        # Faults off, so the operator can take its finalizers off the test's objects before it stops.
        proxy.enabled = False
        kube.run("delete", "trainingjobs,inferencepools", "--all", "-n", namespace, "--timeout=60s", check=False)
        own.stop()
        proxy.stop()


def pod_gpus(pod: dict) -> int:
    total = 0
    for c in pod["spec"]["containers"]:
        resources = c.get("resources") or {}
        total += int({**(resources.get("limits") or {}), **(resources.get("requests") or {})}.get(GPU, 0))
    return total


def bound_gpus(kube: Kube) -> Counter[str]:
    """GPUs held on each node by every bound pod that has not finished, tidal's or not, terminating
    or not: what kube-scheduler and a kubelet count."""
    held: Counter[str] = Counter()
    for p in kube.get("pods", "-A")["items"]:
        node = p["spec"].get("nodeName")
        if node and p["status"].get("phase") not in ("Succeeded", "Failed"):
            held[node] += pod_gpus(p)
    return held


def assert_no_gpu_overbooked(kube: Kube, extra: Counter[str] | None = None) -> None:
    """No node holds more GPUs than it has, counting `extra` (GPUs a placement books before its
    pods are bound) on top of every bound pod."""
    held = bound_gpus(kube) + (extra or Counter())
    capacity = {n["metadata"]["name"]: int(n["status"]["allocatable"].get(GPU, 0)) for n in kube.get("nodes")["items"]}
    over = {n: f"{g} of {capacity.get(n, 0)}" for n, g in held.items() if g > capacity.get(n, 0)}
    assert not over, f"GPUs over-booked: {over}"
