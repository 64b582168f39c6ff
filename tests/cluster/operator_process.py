"""The tidal operator as a real process (`python -m tidal run`) against the local cluster."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    def __init__(self, kubeconfig: Path, workdir: Path, *extra: str, env: dict[str, str] | None = None):
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.extra = list(extra)
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.health_port = free_port()
        self.clock_file = workdir / "clock"
        self.metrics_port: int | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        self.health_port = free_port()
        extra = list(self.extra)
        if "--metrics-port" not in extra:  # never collide with another operator on this machine
            self.metrics_port = free_port()
            extra += ["--metrics-port", str(self.metrics_port)]
        cmd = [
            sys.executable,
            "-m",
            "tidal",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--health-port",
            str(self.health_port),
            "--clock-file",
            str(self.clock_file),
            *extra,
        ]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited: {self.log_path.read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.health_port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("operator did not open its health port")

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies under the operator."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        return "\n".join(
            (self.workdir / f"operator-{i}.log").read_text(errors="replace") for i in range(1, self.starts + 1)
        )
