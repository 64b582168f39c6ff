"""Helpers for tests on the local KWOK cluster: the cluster's binaries and a kubectl wrapper."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "e2e"


def bin_dir() -> Path:
    out = subprocess.run([str(E2E / "build-binaries.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class Kube:
    kubeconfig: Path
    bin: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def run(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin / "kubectl"), *args], input=input, capture_output=True, text=True, env=self.env()
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def apply(self, *objects: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", input=yaml.safe_dump_all(objects), check=check)

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run("get", *args, "-o", "json").stdout)

    def delete(self, *args: str) -> None:
        self.run("delete", "--ignore-not-found", "--wait=false", *args)


def eventually(check: Callable[[], Any], timeout: float = 60, interval: float = 0.5, what: str = "") -> Any:
    """Poll until `check` returns a truthy value; fail with the last value or error after timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except AssertionError as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")
        time.sleep(interval)


def token_kubeconfig(kube: Kube, service_account: str, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount with a real token, for RBAC checks."""
    token = kube.run("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [{"name": "kwok", "cluster": cluster}],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "kwok", "user": "sa"}}],
            }
        )
    )
    return path
