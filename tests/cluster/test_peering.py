"""Two operator replicas with kopf peering: only the higher-priority one acts; when it dies the
other takes over."""

from __future__ import annotations

from pathlib import Path

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import assert_gangs_sound, job, pods_of, submit, wait_phase


def test_standby_replica_waits_then_takes_over(
    kube: Kube, running_operator: OperatorProcess, namespace: str, tmp_path: Path
):
    standby = running_operator  # priority 0
    leader = OperatorProcess(kube.kubeconfig, tmp_path, "--priority", "100")
    leader.start()
    try:
        eventually(
            lambda: "Pausing operations in favour of" in standby.logs(),
            timeout=60,
            what="the priority-0 replica to pause",
        )
        submit(kube, namespace, job("led", tp=4, ep=1, pp=1, dp=2))
        wait_phase(kube, namespace, "led", "Running")
        assert len(pods_of(kube, namespace, "led")) == 2
        assert "led" in leader.logs() and '"name": "led"' not in standby.logs().split("Pausing operations")[-1]
    finally:
        leader.kill()  # no goodbye: the standby must notice the silence
    eventually(
        lambda: "Resuming operations after the pause" in standby.logs().split("Pausing operations")[-1],
        timeout=90,
        what="the standby to resume",
    )
    submit(kube, namespace, job("after", tp=4, ep=1, pp=1, dp=2))
    wait_phase(kube, namespace, "after", "Running")
    assert len(pods_of(kube, namespace, "led")) == 2 and len(pods_of(kube, namespace, "after")) == 2
    assert_gangs_sound(kube)
