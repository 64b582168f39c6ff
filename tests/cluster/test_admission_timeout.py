"""Admission checks on the real cluster: a gang kube-scheduler cannot bind is re-planned after the
admission timeout with the scheduler's own reason in condition PodsReady; after an elastic shrink
the surviving pods carry the new world size (the annotations their downward API files read)."""

from __future__ import annotations

import datetime as dt

import yaml

from ..evictions import rebalanced_past_grace
from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import TEMPLATE, job, pods_of, status, submit, wait_phase

MISSING = "example.com/missing-device"


def _set_clock(op: OperatorProcess, at: dt.datetime) -> None:
    tmp = op.clock_file.with_suffix(".tmp")
    tmp.write_text(at.isoformat())
    tmp.replace(op.clock_file)  # atomically: a half-written file would read as wall time


def _pods_ready(s: dict) -> dict | None:
    return next((c for c in s.get("conditions", []) if c["type"] == "PodsReady"), None)


def test_a_gang_the_scheduler_cannot_bind_is_re_planned_after_the_timeout_with_the_schedulers_reason(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    # A resource no node has: tidal cannot see it, kube-scheduler refuses every pod of the gang.
    container = {
        **TEMPLATE["spec"]["containers"][0],
        "resources": {"requests": {MISSING: "1"}, "limits": {MISSING: "1"}},
    }
    template = {"spec": {"containers": [container]}}
    submit(kube, namespace, job("stuck", tp=4, ep=1, pp=1, dp=1, template=template))
    first = wait_phase(kube, namespace, "stuck", "Admitted", timeout=90)
    eventually(
        lambda: all(not p["spec"].get("schedulingGates") for p in pods_of(kube, namespace, "stuck")),
        timeout=60,
        what="gates lifted",
    )
    assert _pods_ready(first) is None
    try:
        # Eleven minutes later on the operator's clock: past the default 600 s admission timeout.
        _set_clock(running_operator, dt.datetime.now(dt.UTC) + dt.timedelta(minutes=11))
        cond = eventually(
            lambda: (c := _pods_ready(status(kube, namespace, "stuck"))) and c["status"] == "False" and c,
            timeout=90,
            what="PodsReady False after the admission timeout",
        )
        assert cond["reason"] == "AdmissionTimeout"
        assert "stuck-0" in cond["message"] and MISSING in cond["message"], cond["message"]
        events = kube.get("events", "-n", namespace, "--field-selector", "reason=AdmissionTimeout")["items"]
        assert events, "an AdmissionTimeout event on the job"
        assert status(kube, namespace, "stuck").get("restarts", 0) == 0, "a timeout is not a failure restart"
    finally:
        running_operator.clock_file.unlink(missing_ok=True)


def test_surviving_pods_of_a_shrink_carry_the_new_world_size(
    kube: Kube, running_operator: OperatorProcess, namespace: str
):
    submit(kube, namespace, job("elastic", tp=4, ep=1, pp=1, dp=2, preemptible=True, elastic={"minDP": 1, "maxDP": 2}))
    wait_phase(kube, namespace, "elastic", "Running", timeout=120)
    for pod in pods_of(kube, namespace, "elastic"):  # the API server took the downward API volume
        assert pod["metadata"]["annotations"]["tidal.dev/world-size"] == "8"
        assert any(v["name"] == "tidal-world" for v in pod["spec"]["volumes"])
    eviction = rebalanced_past_grace([1])
    kube.run(
        "patch", "trainingjob", "elastic", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", yaml.safe_dump({"status": {"eviction": eviction}}),
    )  # fmt: skip

    def survivors_updated() -> bool:
        live = [p for p in pods_of(kube, namespace, "elastic") if not p["metadata"].get("deletionTimestamp")]
        notes = [p["metadata"].get("annotations") or {} for p in live]
        return [p["metadata"]["name"] for p in live] == ["elastic-0"] and all(
            n.get("tidal.dev/world-size") == "4" and n.get("tidal.dev/dp") == "1" for n in notes
        )

    eventually(survivors_updated, timeout=90, what="elastic-0 announcing world size 4 after the shrink")
    assert status(kube, namespace, "elastic")["worldSize"] == 4
