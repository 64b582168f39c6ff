"""Node loss on the real cluster: the pods of a node that is gone (its Node object deleted) or
fenced (NotReady with the out-of-service taint) go with grace 0 in the cycle that sees it, so the
group is placed again at once, never after the pod GC's 40 s quarantine for orphaned pods.

A pod watch records every change of the group's pods in order; the assertions are on that
order (the lost pod's deletion is never given a grace period, its rank's new pod exists before
the pod GC could have removed the old one), and the time to Running is printed, not asserted."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.recovery import NAMESPACE, run_on, table

from tidal.k8s.api import USER_AGENT

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_fencing import OUT_OF_SERVICE, _kwok_honours_the_opt_out, heal, partition
from .test_operator import (
    assert_gangs_sound,
    job,
    node_supernodes,
    pods_of,
    status,
    submit,
    wait_phase,
)

POD_GC_QUARANTINE_S = 40.0
"""kube-controller-manager's pod GC removes a pod bound to a deleted node only after it has been
orphaned this long (podgc's quarantineTime): a replacement made later waited for it."""


@dataclass
class PodWatch:
    """`kubectl get pods -w` of one namespace in a thread: every change, stamped on arrival."""

    kube: Kube
    namespace: str
    events: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proc = subprocess.Popen(
            [
                str(self.kube.bin / "kubectl"),
                "get",
                "pods",
                "-n",
                self.namespace,
                "-w",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.kube.env(),
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue  # an object spans lines: read on
            buffer = buffer.lstrip()[end:]
            self.events.append((time.time(), event["type"], event["object"]))

    def of(self, name: str) -> list[tuple[float, str, dict[str, Any]]]:
        return [e for e in list(self.events) if e[2]["metadata"]["name"] == name]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _audit_log(kube: Kube) -> Path:
    """The API server's audit log of pod deletes (e2e/cluster.sh's audit policy)."""
    return kube.kubeconfig.parent / "logs" / "audit.log"


def _deletes_of(kube: Kube, namespace: str, name: str, uid: str, since: float, until: float) -> list[dict[str, Any]]:
    """Every delete of that pod the API server was asked for between the two times (epoch seconds),
    in order, from its audit log. Deletes without a uid precondition name the pod only: the
    window keeps out those of earlier runs and of the rank's new pod."""
    found = []
    for line in _audit_log(kube).read_text().splitlines():
        entry = json.loads(line)
        ref = entry.get("objectRef") or {}
        if (ref.get("namespace"), ref.get("name")) != (namespace, name) or entry.get("verb") != "delete":
            continue
        if not since <= dt.datetime.fromisoformat(entry["stageTimestamp"]).timestamp() <= until:
            continue
        body = entry.get("requestObject") or {}
        if (body.get("preconditions") or {}).get("uid", uid) != uid:
            continue  # a delete meant for another pod of that name
        code = (entry.get("responseStatus") or {}).get("code", 200)
        found.append({"agent": entry.get("userAgent", ""), "grace": body.get("gracePeriodSeconds"), "code": code})
    return found


def _lost_and_replaced(watch: PodWatch, victim: str, old_uid: str, lost_at: float) -> tuple[float, list[int | None]]:
    """When the victim's rank had its new pod, and every grace period its old pod was deleted with."""
    history = watch.of(victim)
    graces = [
        o["metadata"].get("deletionGracePeriodSeconds")
        for _, _, o in history
        if o["metadata"]["uid"] == old_uid and o["metadata"].get("deletionTimestamp")
    ]
    new = [t for t, kind, o in history if o["metadata"]["uid"] != old_uid and kind == "ADDED" and t >= lost_at]
    assert new, f"{victim} was never made again"
    return new[0] - lost_at, graces


def _check_recovery(
    kube: Kube,
    namespace: str,
    name: str,
    victim: str,
    node: str,
    watch: PodWatch,
    old_uid: str,
    started: float,
    lost_at: float,
    what: str,
    graced_before_loss: bool = False,
) -> None:
    def replaced_and_running():
        nodes = {p["spec"].get("nodeName") for p in pods_of(kube, namespace, name)}
        st = status(kube, namespace, name)
        return st.get("phase") == "Running" and node not in nodes and len(nodes - {None}) == 8 and st

    st = eventually(replaced_and_running, timeout=120, what=f"{name} placed again and Running")
    running_s = time.time() - lost_at
    replaced_s, graces = _lost_and_replaced(watch, victim, old_uid, lost_at)
    print(f"\n{what}: new pod for {victim} after {replaced_s:.1f} s, group Running after <= {running_s:.1f} s")
    # Order, not speed: the old pod's delete that removed it was the operator's forced one (not
    # the pod GC's or the taint manager's), and after the loss no delete gave it a grace period to wait for a kubelet.
    deletes = _deletes_of(kube, namespace, victim, old_uid, started, lost_at + replaced_s)
    # tidal's forced delete, whatever its answer: the pod GC (which forces terminating pods on a
    # fenced node every 20 s, with no quarantine) may have removed the pod a moment before.
    forced = [d for d in deletes if d["grace"] == 0 and d["agent"].startswith(USER_AGENT)]
    assert forced, f"{victim} was never deleted by force by tidal: {deletes}"
    if not graced_before_loss:
        assert all(g == 0 for g in graces), f"{victim} was deleted with grace {graces}: it waited for a kubelet"
    assert replaced_s < POD_GC_QUARANTINE_S, f"{victim} made again after {replaced_s:.0f} s: it waited for the pod GC"
    assert st.get("restarts", 0) == 0, "a lost node is not charged to maxRestarts"
    after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods_of(kube, namespace, name)}
    where = node_supernodes(kube)
    assert len(after) == 8 and node not in after.values()
    assert len({where[after[f"{name}-{i}"]] for i in range(4, 8)}) == 1, "group 1 split across racks"
    assert_gangs_sound(kube)


def _start(kube: Kube, namespace: str, name: str) -> tuple[str, str, str, float]:
    assert _audit_log(kube).exists(), "this cluster has no audit log (an older e2e/cluster.sh): `e2e/cluster.sh down`"
    started = time.time()
    submit(kube, namespace, job(name, tp=4, ep=4, pp=2, dp=1, restartPolicy={"scope": "Group"}))
    wait_phase(kube, namespace, name, "Running")
    victim = f"{name}-5"  # a pod of group 1
    pod = next(p for p in pods_of(kube, namespace, name) if p["metadata"]["name"] == victim)
    return victim, pod["spec"]["nodeName"], pod["metadata"]["uid"], started


def test_a_deleted_node_s_pods_go_at_once(kube: Kube, running_operator: OperatorProcess, namespace: str, restore_nodes):
    victim, node, uid, started = _start(kube, namespace, "lost")
    watch = PodWatch(kube, namespace)
    try:
        eventually(lambda: watch.of(victim), timeout=30, what="the pod watch started")
        lost_at = time.time()
        kube.run("delete", "node", node)
        _check_recovery(kube, namespace, "lost", victim, node, watch, uid, started, lost_at, "node deleted")
    finally:
        watch.stop()


def test_a_fenced_node_s_pods_go_at_once(kube: Kube, running_operator: OperatorProcess, namespace: str):
    assert _kwok_honours_the_opt_out(kube), "this cluster's KWOK lacks the opt-out: `e2e/cluster.sh down` and run again"
    victim, node, uid, started = _start(kube, namespace, "fenced")
    watch = PodWatch(kube, namespace)
    try:
        eventually(lambda: watch.of(victim), timeout=30, what="the pod watch started")
        # Fenced as an admin would after a machine is found dead: NotReady, then the taint. The pod
        # is in place (nothing deleted it), held against KWOK's heartbeat by the opt-out.
        partition(kube, node)
        lost_at = time.time()
        kube.run("taint", "node", node, f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute")
        # The NotReady node's pod was deleted with a grace period before the fence (it might have
        # been running still); the fence is what lets it go by force.
        _check_recovery(kube, namespace, "fenced", victim, node, watch, uid, started, lost_at, "node fenced", True)
    finally:
        watch.stop()
        heal(kube, node)


def test_bench_recovery_smoke(kube: Kube, running_operator: OperatorProcess):
    """`python -m bench.recovery`'s scenarios on the session cluster, its gang 256 GPUs: every
    figure is printed and each job came back Running off the lost node (run_on waits for that)."""
    result = run_on(kube, 8, 64)
    print("\n" + table({"scenarios": result}))
    assert set(result) == {"group_deleted", "gang_deleted", "group_fenced", "gang_fenced"}
    for figures in result.values():
        assert figures["fresh_start_s"] > 0 and figures["lost_to_running_s"] >= figures["lost_to_replaced_s"] > 0
    assert result["gang_deleted"]["gpus"] == 256 and result["group_deleted"]["gpus"] == 128
    kube.delete("namespace", NAMESPACE)
