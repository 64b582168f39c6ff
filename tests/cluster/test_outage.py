"""A control-plane outage on the real cluster: most nodes NotReady at once restart no gang group.

Every node the test cuts off is partitioned as in test_fencing.py (KWOK's opt-out, the Lease taken,
Ready=False), but 60% of the cluster's nodes at once, the job's own among them: what an API server
or etcd brownout that lets the kubelets' leases lapse looks like to the API server. The operator
must read it as kube-controller-manager does (partial disruption: more than 2 and at least 55% of
the nodes NotReady) and keep the gang where it is, past the grace; given the nodes back, nothing
has moved and nothing is charged. A single NotReady node still restarts its group
(test_fencing.py). The operator's clock is held (--clock-file) while KWOK cuts and heals, which
takes it up to minutes for 90 nodes."""

from __future__ import annotations

import datetime as dt
import math
import time

from kubernetes import client

from tidal.k8s.api import load_client

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .test_fencing import KWOK_IGNORE, PARTITIONED_AT, _kwok_honours_the_opt_out, _ready
from .test_operator import assert_gangs_sound, job, pods_of, status, submit, wait_phase

SHARE = 0.6


def _partition_many(kube: Kube, nodes: list[str], namespace: str) -> None:
    api = load_client(str(kube.kubeconfig))
    core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
    now = dt.datetime.now(dt.UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    kube.run("annotate", "node", *nodes, f"{PARTITIONED_AT}={stamp}", "--overwrite")
    kube.run("annotate", "pods", "--all", "-n", namespace, f"{KWOK_IGNORE}=true", "--overwrite")
    kube.run("annotate", "node", *nodes, f"{KWOK_IGNORE}=true", "--overwrite")
    lease = {"spec": {"holderIdentity": "tidal-test-outage", "leaseDurationSeconds": 3600, "renewTime": stamp}}
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}
    for node in nodes:
        leases.patch_namespaced_lease(node, "kube-node-lease", lease)
        core.patch_node_status(node, not_ready)
    time.sleep(3)  # had KWOK still acted for a node, it would have made it Ready again by now
    still = [n for n in nodes if _ready(kube, n)]
    assert not still, f"KWOK still acts for {still[:5]} after the opt-out"


def _heal_many(kube: Kube, nodes: list[str], namespace: str) -> None:
    leases = client.CoordinationV1Api(load_client(str(kube.kubeconfig)))
    kube.run("annotate", "pods", "--all", "-n", namespace, f"{KWOK_IGNORE}-", check=False)
    kube.run("annotate", "node", *nodes, f"{KWOK_IGNORE}-", f"{PARTITIONED_AT}-", check=False)
    for node in nodes:
        try:
            leases.delete_namespaced_lease(node, "kube-node-lease")
        except client.ApiException as e:
            if e.status != 404:
                raise
    eventually(
        lambda: all(_ready(kube, n) for n in nodes), timeout=300, interval=2, what="the cut-off nodes Ready again"
    )


def _where(kube: Kube, namespace: str) -> dict[str, tuple[str, str]]:
    """Each pod of the job: its uid (made again: a new one) and node."""
    return {
        p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"])
        for p in pods_of(kube, namespace, "brownout")
    }


def _logged(operator: OperatorProcess, since: int, text: str) -> None:
    eventually(lambda: text in operator.logs()[since:], timeout=60, what=f"the operator logging {text!r}")


def _set_clock(operator: OperatorProcess, at: dt.datetime) -> None:
    """The operator's clock (--clock-file), written atomically."""
    tmp = operator.clock_file.with_suffix(".tmp")
    tmp.write_text(at.isoformat())
    tmp.replace(operator.clock_file)


def test_most_nodes_not_ready_at_once_restart_no_group(kube: Kube, running_operator: OperatorProcess, namespace: str):
    assert _kwok_honours_the_opt_out(kube), f"this cluster's KWOK was started without the {KWOK_IGNORE} opt-out"
    submit(kube, namespace, job("brownout", tp=4, ep=4, pp=2, dp=1, restartPolicy={"scope": "Group"}))
    wait_phase(kube, namespace, "brownout", "Running")
    before = _where(kube, namespace)
    own = sorted({node for _, node in before.values()})
    everyone = sorted(n["metadata"]["name"] for n in kube.get("nodes")["items"])
    others = [n for n in everyone if n not in own and _ready(kube, n)]
    # The job's nodes lapse after more than 2 others (with 2 or fewer NotReady a node is a failed
    # machine, replaced at once).
    cut = others[: max(math.ceil(SHARE * len(everyone)) - len(own), 0)] + own
    logs_before = len(running_operator.logs())
    # The grace runs on the operator's clock, held still while the test cuts and heals (KWOK takes
    # from seconds to minutes to do either to 90 nodes; kubelets lapse and come back within seconds)
    # and moved on only where the test says.
    t0 = dt.datetime.now(dt.UTC)
    _set_clock(running_operator, t0)
    try:
        _partition_many(kube, cut, namespace)
        _logged(running_operator, logs_before, "most nodes are NotReady at once")
        _set_clock(running_operator, t0 + dt.timedelta(seconds=45))  # past --not-ready-grace (30 s)
        time.sleep(10)  # cycles at that time: the grace alone would let the pods go now
        assert _where(kube, namespace) == before, "a pod was deleted or moved during the outage"
        assert not any(p["metadata"].get("deletionTimestamp") for p in pods_of(kube, namespace, "brownout"))
        assert status(kube, namespace, "brownout")["phase"] == "Running"
    finally:
        _heal_many(kube, own + [n for n in cut if n not in own], namespace)
        _logged(running_operator, logs_before, "the mass NotReady is over")
        _set_clock(running_operator, t0 + dt.timedelta(seconds=90))  # the nodes are back: past any grace
        time.sleep(10)
        running_operator.clock_file.unlink(missing_ok=True)
    assert _where(kube, namespace) == before, "nothing moved once the nodes came back"
    final = status(kube, namespace, "brownout")
    assert final["phase"] == "Running" and final.get("restarts", 0) == 0
    events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=brownout")["items"]
    assert not any(e["reason"] == "Restarting" for e in events), "no group was restarted"
    assert_gangs_sound(kube)
