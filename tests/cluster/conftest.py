"""The local KWOK cluster, brought up once per test session (or reused when already up)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .kube import E2E, REPO, Kube, bin_dir

CLUSTER_NAME = os.environ.get("TIDAL_CLUSTER_NAME", "tidal-test")


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
    k.run("apply", "--server-side", "-f", str(REPO / "crds"))
    k.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    yield k
    if not was_up and not os.environ.get("TIDAL_KEEP_CLUSTER"):
        subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, check=False)


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> str:
    name = "t-" + request.node.name.lower().replace("_", "-")[:50].strip("-")
    kube.delete("namespace", name)
    kube.run("wait", "--for=delete", f"namespace/{name}", "--timeout=60s", check=False)
    kube.run("create", "namespace", name)
    yield name
    kube.delete("namespace", name)
