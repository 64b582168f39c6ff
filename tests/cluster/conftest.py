"""The local KWOK cluster, brought up once per test session (or reused when already up)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .kube import E2E, REPO, Kube, bin_dir, eventually
from .operator_process import OperatorProcess, free_port

# One cluster per checkout: two clones testing on one machine must not share (or fight over) one.
CLUSTER_NAME = os.environ.get("TIDAL_CLUSTER_NAME", f"tidal-test-{hashlib.sha256(str(REPO).encode()).hexdigest()[:6]}")


@pytest.fixture(scope="session")
def kube() -> Kube:
    env = {**os.environ, "TIDAL_CLUSTER_NAME": CLUSTER_NAME}
    was_up = subprocess.run([str(E2E / "cluster.sh"), "status"], env=env, capture_output=True).returncode == 0
    out = subprocess.run(
        [str(E2E / "cluster.sh"), "up", "--shape", "nvl72", "--supernodes", "8"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    kubeconfig = Path(out.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG="))
    k = Kube(kubeconfig, bin_dir())
    # --force-conflicts: a kept cluster may hold the same CRDs installed by the chart test (helm).
    k.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    k.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    k.run("apply", "-f", str(REPO / "examples" / "peering.yaml"))
    # Workload priorities are PriorityClass values: tidal-batch 1, tidal-training 100, tidal-serving 1000.
    k.run("apply", "-f", str(REPO / "examples" / "priorityclasses.yaml"))
    yield k
    if not was_up and not os.environ.get("TIDAL_KEEP_CLUSTER"):
        subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, check=False)


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> str:
    name = "t-" + request.node.name.lower().replace("_", "-")[:50].strip("-")
    kube.delete("namespace", name)
    kube.run("wait", "--for=delete", f"namespace/{name}", "--timeout=90s", check=False)
    kube.run("create", "namespace", name)
    yield name
    # Wait for the namespace to go, so the next test starts with every GPU free.
    kube.delete("namespace", name)
    kube.run("wait", "--for=delete", f"namespace/{name}", "--timeout=90s", check=False)


@pytest.fixture(scope="session")
def operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> OperatorProcess:
    """tidal run, discovering Supernodes from the tidal.dev/supernode node label."""
    metrics_port = free_port()
    op = OperatorProcess(
        kube.kubeconfig,
        tmp_path_factory.mktemp("operator"),
        "--discover-supernodes",
        "tidal.dev/supernode",
        "--metrics-port",
        str(metrics_port),
    )
    op.metrics_port = metrics_port
    op.start()
    eventually(lambda: len(kube.get("supernodes")["items"]) >= 8, timeout=60, what="8 discovered Supernodes")
    yield op
    op.stop()


@pytest.fixture
def running_operator(operator: OperatorProcess) -> OperatorProcess:
    """The session operator, restarted first if a previous test killed it."""
    if operator.proc is None or operator.proc.poll() is not None:
        operator.start()
    return operator


@pytest.fixture
def restore_nodes(kube: Kube):
    yield
    manifests = subprocess.run(
        [sys.executable, "-m", "tidal", "fleet", "--shape", "nvl72", "--supernodes", "8"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kube.run("apply", "--server-side", "--force-conflicts", "-f", "-", input=manifests)
    eventually(
        lambda: (
            all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                for n in kube.get("nodes")["items"]
            )
            and len(kube.get("nodes")["items"]) == 144
        ),
        timeout=90,
        what="all 144 nodes back and Ready",
    )
