"""One call that never answers must not stop scheduling: on the real cluster, through the fault
proxy, a TrainingJob whose status writes hang forever, pod creations throttled with 429, and a
pool whose Prometheus load source accepts connections and never answers. Everyone else is still
placed and Running; the job whose placement never got written has no pod at all."""

from __future__ import annotations

import socket
import time

from bench.fault_proxy import PathRule

from .kube import Kube, eventually
from .operator_process import OperatorProcess
from .proxied import operator_behind_proxy
from .test_operator import assert_gangs_sound, job, pods_of, status, submit, wait_phase
from .test_tide import pool

API_TIMEOUT_SECONDS = 3


def test_a_hung_call_and_a_silent_prometheus_stop_nobody_else(
    kube: Kube, operator: OperatorProcess, namespace: str, tmp_path
):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections complete in the backlog; nothing ever reads or answers them
    rules = (
        PathRule("PATCH", f"/namespaces/{namespace}/trainingjobs/wedged", "hang"),
        PathRule("POST", f"/namespaces/{namespace}/pods", "throttle_429", rate=0.5),
    )
    extra = (
        "--api-timeout",
        str(API_TIMEOUT_SECONDS),
        "--load-source",
        f"silent=http://127.0.0.1:{silent.getsockname()[1]}",
    )
    try:
        with operator_behind_proxy(kube, operator, namespace, tmp_path, rules, *extra) as (proxy, own):
            # The wedged job is queued first, so its hung write comes before anyone else's.
            submit(kube, namespace, job("wedged", tp=4, ep=1, pp=1, dp=1))
            eventually(lambda: proxy.injected["hang"] >= 1, timeout=60, what="the wedged job's status write hung")
            prometheus = {"server": "silent", "query": "sum(rate(requests_total[1m]))"}
            submit(
                kube,
                namespace,
                job("fine", tp=4, ep=4, pp=2, dp=1),
                pool(
                    "served",
                    minReplicas=1,
                    maxReplicas=2,
                    load={"source": "Prometheus", "prometheus": prometheus, "targetPerReplica": 5},
                ),
            )
            wait_phase(kube, namespace, "fine", "Running", timeout=150)
            served = eventually(
                lambda: (
                    (s := kube.get("inferencepool", "served", "-n", namespace).get("status", {})).get("readyReplicas")
                    and s
                ),
                timeout=120,
                what="the pool's replica Ready while its load source never answers",
            )
            assert "silent" in served.get("load", {}).get("error", ""), served.get("load")
            assert proxy.injected["throttle_429"] >= 1, proxy.injected
            # Its placement was never recorded, so none of its pods was made (no GPUs booked twice).
            time.sleep(2 * API_TIMEOUT_SECONDS)
            assert not pods_of(kube, namespace, "wedged")
            assert not status(kube, namespace, "wedged").get("placement")
            assert own.proc is not None and own.proc.poll() is None, "the operator died"
            assert_gangs_sound(kube)
    finally:
        silent.close()
