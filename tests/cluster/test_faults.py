"""bench.faults --quick on the session cluster: API faults through the proxy, a foreign-pod storm,
operator SIGKILLs, 10% of nodes deleted; then the independent checks must all come out zero.

The harness must also prove it injected something: a run where the proxy passed everything through,
nobody was killed or no node failed would pass the checks without testing anything."""

from __future__ import annotations

import json

from bench.faults import FaultConfig, run_faults

from .kube import Kube
from .operator_process import OperatorProcess


def test_quick_fault_run_keeps_every_invariant(kube: Kube, operator: OperatorProcess, tmp_path):
    # The harness runs its own operator behind the proxy; two operators sharing one peering identity
    # would both act. The session one is restarted by `running_operator` for the tests after this one.
    operator.stop()
    result = run_faults(kube, FaultConfig.quick_config(seed=7), workdir=tmp_path, namespace="t-faults")
    print(json.dumps(result, indent=1))
    assert result["faults_injected"] > 0, "the proxy injected nothing"
    assert result["operator_kills"] > 0 and result["nodes_failed"] > 0 and result["foreign_pods"] > 0
    assert len(result["faults_by_kind"]) >= 2, f"one kind of fault only: {result['faults_by_kind']}"
    evidence = result["evidence"]
    assert result["split_groups"] == 0, evidence["split_groups"]
    assert result["overbooked_gpus"] == 0, evidence["overbooked"]
    assert result["duplicate_ranks"] == 0, evidence["duplicate_ranks"]
    assert result["orphans"] == 0, evidence["orphans"]
    assert result["stuck_jobs"] == 0, evidence["stuck_jobs"]
    # The cluster is handed back whole to the tests that follow.
    assert len(kube.get("nodes")["items"]) == 144
